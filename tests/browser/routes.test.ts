import { existsSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { serve, type ServerType } from '@hono/node-server';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DASHBOARD_DIST } from '../../apps/api/src/http/dashboard.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { exec, sessionIn } from '../support/sandbox.ts';
import { CHROMIUM } from '../support/browser.ts';

/**
 * Every route of the dashboard's router (apps/dashboard/src/main.ts, viewFor), opened by its URL as
 * a person pasting a link would: no page error, no console error but the API's own error answers
 * (which the page shows), and at 1400 px nothing wider than the window, every button on screen.
 * A new route in viewFor belongs in `routes` below.
 */
describe('every dashboard route, opened by its URL', () => {
  const ctx = useAgentApp('routes', { env: { KILN_OUTBOUND_ALLOW: '127.0.0.1' } });
  let server: ServerType;
  let url: string;
  let browser: Browser;
  let routes: string[];

  beforeAll(async () => {
    if (!existsSync(join(DASHBOARD_DIST, 'index.html')))
      throw new Error('the dashboard is not built: run `npm run dashboard:build` (npm test does)');
    server = await new Promise<ServerType>((resolve) => {
      const s = serve({ fetch: ctx.t.app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s));
    });
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    browser = await chromium.launch(CHROMIUM);
    // Real ids for every kind of page: a workspace with a commit, a session with a sandbox, a run, a webhook.
    const key = ctx.team.key;
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    await exec(ctx.t, key, session, 'print(1)');
    const put = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/notes.md`, {
      key,
      raw: '# Notes\n\nA [link](../MEMORY.md).\n',
    });
    ctx.fake.script({ content: '<finish>done</finish>' });
    const { run } = await converse(ctx.t, key, session, 'hello');
    const hook = await ctx.t.call('POST', '/v1/webhooks', {
      key,
      body: { url: 'http://127.0.0.1:9/hook', events: ['run.completed'] },
    });
    routes = [
      '#/',
      '#/runs',
      '#/runs?status=completed',
      `#/runs/${run.id}`,
      '#/runs/run_missing',
      '#/chat',
      `#/chat/${ws}`,
      `#/chat/${ws}/${session}`,
      `#/ws/${ws}`,
      '#/ws/ws_missing',
      `#/ws/${ws}/files`,
      `#/ws/${ws}/files/knowledge`,
      `#/ws/${ws}/files/knowledge/notes.md`,
      `#/ws/${ws}/files/MEMORY.md?line=2`,
      `#/ws/${ws}/files/nope.md`,
      `#/ws/${ws}/commits/${put.body.commit.sha}`,
      `#/ws/${ws}/evolutions/evo_missing`,
      `#/webhooks/${hook.body.id}`,
      '#/audit',
      '#/admin',
      '#/no/such/route',
    ];
  });
  afterAll(async () => {
    await browser?.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  });

  /** Opens `hash` signed in with `key` at `width` px; what went wrong on the page, if anything. */
  async function visit(hash: string, key: string, width: number): Promise<string[]> {
    const context = await browser.newContext({ viewport: { width, height: 900 } });
    const page = await context.newPage();
    const problems: string[] = [];
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (m) => {
      // The API's own 4xx answers (a missing id) are logged by the browser as failed loads: the page shows them.
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource'))
        problems.push(`console: ${m.text()}`);
    });
    try {
      // Signed in as the sign-in form leaves the tab (its key in sessionStorage; the form itself is
      // dashboard.test.ts's), so the route is the page's first load, as a pasted link is.
      await context.addInitScript((k) => sessionStorage.setItem('kiln.key', k), key);
      await page.goto(`${url}/${hash}`);
      await page.waitForSelector('nav');
      await page.waitForLoadState('networkidle');
      // Every panel has answered (loaded or said why not).
      await page.waitForFunction(() => !document.querySelector('.loading'), undefined, { timeout: 15_000 });
      // A view that caught its own exception shows it as a message: that is a bug too (a missing
      // id's "not found" is the API's answer, not a script's).
      const shown = await page.evaluate(() =>
        [...document.querySelectorAll('.error, [role=alert]')].map((e) => e.textContent ?? ''),
      );
      for (const text of shown)
        if (/Cannot read propert|TypeError|ReferenceError|is not a function|is not iterable|undefined/.test(text))
          problems.push(`shows a script error: ${text.slice(0, 200)}`);
      if (width >= 1400) {
        const wide = await page.evaluate(() => {
          const out: string[] = [];
          if (document.documentElement.scrollWidth > window.innerWidth + 1)
            out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
          for (const b of document.querySelectorAll('main button, .view button')) {
            const r = b.getBoundingClientRect();
            if (r.width > 0 && r.right > window.innerWidth + 1)
              out.push(`button "${b.textContent}" ends at ${r.right} px`);
          }
          return out;
        });
        problems.push(...wide);
      }
    } finally {
      await context.close();
    }
    return problems;
  }

  /**
   * Visits every (route, width) pair, a few at a time (each in a browser context of its own, so
   * they share nothing but the server): most of a visit is waiting for the network to go quiet.
   */
  async function visitAll(key: string, widths: number[]): Promise<string[]> {
    const todo = widths.flatMap((width) => routes.map((hash) => ({ hash, width })));
    const found: string[] = [];
    const worker = async () => {
      for (let v = todo.shift(); v; v = todo.shift())
        for (const p of await visit(v.hash, key, v.width)) found.push(`${v.hash} @${v.width}: ${p}`);
    };
    await Promise.all(Array.from({ length: 3 }, worker));
    return found.sort();
  }

  it('a team key: every route at 1400 px and at 390 px', async () => {
    expect(await visitAll(ctx.team.key, [1400, 390])).toEqual([]);
  }, 300_000);

  it('the chat says how to get a session before Send can be used', async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    try {
      await page.goto(`${url}/#/chat`);
      await page.fill('#key', ctx.team.key);
      await page.click('form.signin button[type=submit]');
      await page.waitForSelector('#chat-hint');
      expect(await page.textContent('#chat-hint')).toContain('then a session (or New session)');
      expect(await page.isDisabled('#chat-send')).toBe(true);
    } finally {
      await context.close();
    }
  });

  it('an org-admin key: every route at 1400 px', async () => {
    expect(await visitAll(ctx.t.adminKey, [1400])).toEqual([]);
  }, 300_000);
});
