import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { DASHBOARD_DIST } from '../../apps/api/src/http/dashboard.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil, TERMINAL } from '../support/agent.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/** Debian's chromium, as infra/test.sh installs it. */
const CHROMIUM = {
  executablePath: '/usr/bin/chromium',
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
};

/**
 * The ops dashboard in a real browser, against the real app served over HTTP (real Postgres,
 * Docker and git; the scripted model is the only fake). Every outcome is checked through the API.
 */
describe('ops dashboard in chromium', () => {
  const ctx = useAgentApp('dash');
  let server: ServerType;
  let url: string;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    if (!existsSync(join(DASHBOARD_DIST, 'index.html')))
      throw new Error('the dashboard is not built: run `npm run dashboard:build` (npm test does)');
    server = await new Promise<ServerType>((resolve) => {
      const s = serve({ fetch: ctx.t.app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s));
    });
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    browser = await chromium.launch(CHROMIUM);
  });
  afterEach(async () => {
    await page?.context().close();
  });
  afterAll(async () => {
    await browser?.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  });

  async function open(hash = '#/', key = ctx.team.key): Promise<Page> {
    page = await (await browser.newContext()).newPage();
    await page.goto(`${url}/${hash}`);
    await page.fill('#key', key);
    await page.click('form.signin button[type=submit]');
    await page.waitForSelector('nav');
    return page;
  }

  /**
   * A run in a session of an `ask` workspace that proposes `code`, paused for approval; with
   * `resumes` (default), the model's answer after the code is scripted too.
   */
  async function pausedRun(code: string, resumes = true) {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'ask' } });
    expect(ctx.fake.pending()).toBe(0);
    ctx.fake.script(
      { content: `<python>${code}</python>` },
      ...(resumes ? [{ content: '<finish>done</finish>' }] : []),
    );
    const posted = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'go' },
    });
    expect(posted.status).toBe(202);
    const run = posted.body.run.id as string;
    await eventsUntil(ctx.t, run, ['run.requires_action', ...TERMINAL]);
    const pending = await ctx.t.call('GET', `/v1/approvals?status=pending&workspace=${ws}`, { key: ctx.team.key });
    expect(pending.body.data).toHaveLength(1);
    return { ws, session, run, approval: pending.body.data[0].id as string };
  }

  it('a wrong key shows the API\u2019s error message and keeps nothing', async () => {
    const expected = (await ctx.t.call('GET', '/v1/teams', { key: 'kiln_not_a_real_key' })).body.error
      .message as string;
    expect(expected.length).toBeGreaterThan(0);
    page = await (await browser.newContext()).newPage();
    await page.goto(`${url}/`);
    await page.fill('#key', 'kiln_not_a_real_key');
    await page.click('form.signin button[type=submit]');
    const alert = page.locator('form.signin [role=alert]');
    await alert.filter({ hasText: expected }).waitFor();
    expect(await alert.textContent()).toBe(expected);
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
    expect(await page.locator('nav').count()).toBe(0);
  });

  it('signs in with a team key, lists its workspaces, opens one, and signs out', async () => {
    const ws = await ctx.t.call('POST', '/v1/workspaces', { key: ctx.team.key, body: { name: 'dash-research' } });
    const other = await ctx.t.team('dash-other');
    const hidden = await ctx.t.call('POST', '/v1/workspaces', { key: other.key, body: { name: 'someone-elses' } });
    expect(hidden.status).toBe(201);
    await open();
    const link = page.locator('#workspaces a', { hasText: 'dash-research' });
    await link.waitFor();
    expect(await page.locator('#workspaces').textContent()).not.toContain('someone-elses');
    await link.click();
    await page.waitForURL(`**/#/ws/${ws.body.id}`);
    await page.locator('.ws-name', { hasText: 'dash-research' }).waitFor();
    await page.click('#signout');
    await page.waitForSelector('form.signin');
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  });

  it('shows a run paused for approval; Approve resumes it and it completes', async () => {
    const { run, approval } = await pausedRun('print("approved-" + str(6 * 7))');
    await open();
    await page.locator(`#runs a[href="#/runs/${run}"]`).waitFor();
    expect(await page.locator('#runs').textContent()).toContain('requires_action');
    const item = page.locator(`#approvals li[data-approval="${approval}"]`);
    expect(await item.locator('pre').textContent()).toBe('print("approved-" + str(6 * 7))');
    const done = eventsUntil(ctx.t, run, TERMINAL);
    await item.getByRole('button', { name: 'Approve', exact: true }).click();
    const events = await done;
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(events.some((e) => e.event === 'exec.output' && JSON.stringify(e.data).includes('approved-42'))).toBe(true);
    expect((await ctx.t.call('GET', `/v1/runs/${run}`, { key: ctx.team.key })).body.status).toBe('completed');
    const decided = await ctx.t.call('GET', '/v1/approvals?status=approved', { key: ctx.team.key });
    expect(decided.body.data.find((a: { id: string }) => a.id === approval)).toMatchObject({
      status: 'approved',
      decision: 'approve',
    });
    // The overview notices on its next refresh.
    await page.locator('#runs', { hasText: 'no run in flight' }).waitFor();
  });

  it('the run page streams events live, in order, none twice', async () => {
    const { run, approval } = await pausedRun('print("live-" + str(7 * 6))');
    await open(`#/runs/${run}`);
    await page.locator('.events li.run-requires_action').waitFor();
    await page.locator('.stream-state[data-state=live]').waitFor();
    expect(await page.locator('.events').textContent()).not.toContain('live-42');
    // Decided elsewhere (the API): the page, already open, must show what follows.
    expect(
      (await ctx.t.call('POST', `/v1/approvals/${approval}`, { key: ctx.team.key, body: { decision: 'approve' } }))
        .status,
    ).toBe(200);
    await page.locator('.events li.exec-output', { hasText: 'live-42' }).waitFor();
    await page.locator('#run-status', { hasText: 'completed' }).waitFor();
    await page.locator('.stream-state[data-state=ended]').waitFor();
    const shown = (await page
      .locator('.events li')
      .evaluateAll((lis) => lis.map((li) => Number(li.getAttribute('data-seq'))))) as number[];
    const stored = await ctx.t.app.request(`/v1/runs/${run}/events`, {
      headers: { authorization: `Bearer ${ctx.team.key}`, accept: 'application/json' },
    });
    expect(shown).toEqual(((await stored.json()) as { data: { id: number }[] }).data.map((e) => e.id));
  });

  it('Cancel on the run page cancels a paused run', async () => {
    const { run } = await pausedRun('print("never")', false);
    await open(`#/runs/${run}`);
    page.once('dialog', (d) => void d.accept());
    await page.getByRole('button', { name: 'Cancel' }).click();
    await page.locator('.events li.run-cancelled').waitFor();
    expect((await ctx.t.call('GET', `/v1/runs/${run}`, { key: ctx.team.key })).body.status).toBe('cancelled');
  });

  it('Revert on the workspace page creates a revert commit', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const put = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/dash-note.md`, {
      key: ctx.team.key,
      raw: '# Note\n\nreverted from the dashboard\n',
    });
    expect(put.status).toBe(200);
    const sha = put.body.commit.sha as string;
    await open(`#/ws/${ws}`);
    const row = page.locator('#commits tr', { hasText: sha.slice(0, 10) });
    await row.waitFor();
    page.once('dialog', (d) => void d.accept());
    await row.getByRole('button', { name: 'Revert' }).click();
    await page.locator('#flash.ok', { hasText: 'reverted as' }).waitFor();
    const commits = await ctx.t.call('GET', `/v1/workspaces/${ws}/commits`, { key: ctx.team.key });
    const newest = commits.body.data[0];
    expect(newest.sha).not.toBe(sha);
    expect(newest.paths).toEqual(['knowledge/dash-note.md']);
    expect(newest.summary).toContain('Revert');
    expect(await page.locator('#flash').textContent()).toContain(newest.sha.slice(0, 10));
    expect(
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/files?path=knowledge/dash-note.md`, { key: ctx.team.key })).status,
    ).toBe(404);
  });

  it('Deny tells the model a person refused; Approve for session stops asking in that session', async () => {
    const denied = await pausedRun('print("refused")');
    await open();
    const done = eventsUntil(ctx.t, denied.run, TERMINAL);
    await page
      .locator(`#approvals li[data-approval="${denied.approval}"]`)
      .getByRole('button', { name: 'Deny' })
      .click();
    expect((await done).at(-1)!.event).toBe('run.completed');
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain('[User Denied]');
    expect(
      (await ctx.t.call('GET', '/v1/approvals?status=denied', { key: ctx.team.key })).body.data.map(
        (a: { id: string }) => a.id,
      ),
    ).toContain(denied.approval);

    const trusted = await pausedRun('print("first")');
    await page
      .locator(`#approvals li[data-approval="${trusted.approval}"]`)
      .getByRole('button', { name: 'Approve for session' })
      .click();
    expect((await eventsUntil(ctx.t, trusted.run, TERMINAL)).at(-1)!.event).toBe('run.completed');
    // The next run in that session runs its code without asking.
    ctx.fake.script({ content: '<python>print("second")</python>' }, { content: '<finish>done</finish>' });
    const next = await converse(ctx.t, ctx.team.key, trusted.session, 'again');
    expect(next.run.status).toBe('completed');
    expect(next.names).not.toContain('run.requires_action');
    expect(next.names).toContain('exec.completed');
  });

  it('Kill on the overview removes a live sandbox; its session gets a fresh one on the next exec', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    expect((await exec(ctx.t, ctx.team.key, session, 'x = 1\nprint(x)')).stdout).toBe('1\n');
    const live = (await ctx.t.call('GET', '/v1/sandboxes', { key: ctx.team.key })).body.data.find(
      (s: { session_id: string }) => s.session_id === session,
    );
    expect(live).toBeTruthy();
    await open();
    const row = page.locator('#sandboxes tr', { hasText: live.id });
    await row.waitFor();
    // Its runtime is a cell of its own (the test apps' workspaces run in runc).
    expect(live.runtime).toBe('runc');
    expect(await row.locator('td').allTextContents()).toContain('runc');
    page.once('dialog', (d) => void d.accept());
    await row.getByRole('button', { name: 'Kill' }).click();
    // The panel reloads after the action: the row goes, and the API agrees.
    await row.waitFor({ state: 'detached' });
    expect(
      (await ctx.t.call('GET', '/v1/sandboxes', { key: ctx.team.key })).body.data.some(
        (s: { id: string }) => s.id === live.id,
      ),
    ).toBe(false);
    // The variables went with it; the session itself still works.
    expect((await exec(ctx.t, ctx.team.key, session, 'print("x" in globals())')).stdout).toBe('False\n');
  });

  it('the run page says when its session\u2019s sandbox will be reclaimed; Keep alive pushes that back', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ content: '<python>print(1)</python>' }, { content: '<finish>done</finish>' });
    const { run } = await converse(ctx.t, ctx.team.key, session, 'go');
    expect(run.status).toBe('completed');
    const live = (await ctx.t.call('GET', '/v1/sandboxes', { key: ctx.team.key })).body.data.find(
      (s: { session_id: string }) => s.session_id === session,
    );
    await open(`#/runs/${run.id}`);
    const box = page.locator('#run-sandbox');
    await box.getByText(live.id).waitFor();
    expect(await box.locator('.reclaim-at').textContent()).not.toBe('\u2014');
    await box.getByRole('button', { name: 'Keep alive' }).click();
    await page.getByText('Keep alive: done').waitFor();
    const audit = await ctx.t.call('GET', '/v1/audit?action=session.keepalive&limit=100', { key: ctx.team.key });
    expect(audit.body.data.find((e: { resource_id: string }) => e.resource_id === session)).toMatchObject({
      after: { sandbox_id: live.id },
    });
  });

  it('Request a review from the workspace page queues one; Undo reverts what it committed', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ content: '<python>print(sum([1, 2, 3]))</python>' }, { content: '<finish>6</finish>' });
    expect((await converse(ctx.t, ctx.team.key, session, 'add 1, 2, 3')).run.status).toBe('completed');
    await open(`#/ws/${ws}`);
    await page.getByRole('button', { name: 'Request a review' }).click();
    await page.locator('#flash.ok', { hasText: 'queued' }).waitFor();
    const queued = (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions`, { key: ctx.team.key })).body.data;
    expect(queued).toHaveLength(1);
    expect(queued[0]).toMatchObject({ kind: 'review', status: 'queued', session_id: session });
    expect(await page.locator('#flash').textContent()).toContain(queued[0].id);

    const skill = '---\nname: add-numbers\ndescription: Add a list of numbers with sum()\n---\n\n1. `sum(xs)`\n';
    ctx.fake.script({
      content: `<write_file path="skills/add-numbers/SKILL.md">\n${skill}</write_file>\n<finish>Saved how to add numbers</finish>`,
    });
    expect(await ctx.t.evolution.jobs.drain()).toBe(1);
    const committed = (
      await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions/${queued[0].id}`, { key: ctx.team.key })
    ).body;
    expect(committed.status).toBe('committed');

    const row = page.locator('#evolutions tr', { hasText: queued[0].id });
    const undo = row.getByRole('button', { name: 'Undo' });
    await undo.waitFor();
    page.once('dialog', (d) => void d.accept());
    await undo.click();
    await page.locator('#flash.ok', { hasText: 'undone as' }).waitFor();
    expect(
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions/${queued[0].id}`, { key: ctx.team.key })).body.status,
    ).toBe('reverted');
    expect(
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/files?path=skills/add-numbers/SKILL.md`, { key: ctx.team.key }))
        .status,
    ).toBe(404);
  });

  it('the audit page lists what the team did; an org-admin key sees teams and the version, and is told team views need a team key', async () => {
    const ws = await ctx.t.call('POST', '/v1/workspaces', { key: ctx.team.key, body: { name: 'dash-audited' } });
    await open('#/audit');
    await page.locator('#audit tr', { hasText: ws.body.id }).first().waitFor();
    expect(await page.locator('#audit').textContent()).toContain('workspace.create');
    await page.context().close();

    await open('#/', ctx.t.adminKey);
    await page.locator('#runs', { hasText: 'team key' }).waitFor();
    await page.getByRole('link', { name: 'Teams & updates' }).click();
    await page.locator('#teams tr', { hasText: ctx.team.id }).waitFor();
    expect(await page.locator('#teams').textContent()).toContain('dash');
  });
  it('the dashboard and the API reference work under their Content-Security-Policy (no violation reported)', async () => {
    const violations: string[] = [];
    const watch = (p: Page) =>
      p.on('console', (m) => /Content Security Policy|Refused to/.test(m.text()) && violations.push(m.text()));
    page = await (await browser.newContext()).newPage();
    watch(page);
    await page.goto(`${url}/#/`);
    await page.fill('#key', ctx.team.key);
    await page.click('form.signin button[type=submit]');
    await page.waitForSelector('nav');
    await page.locator('#runs').waitFor();
    await page.context().close();

    page = await (await browser.newContext()).newPage();
    watch(page);
    await page.goto(`${url}/docs`);
    await page.locator('.swagger-ui .info .title', { hasText: 'Kiln API' }).waitFor();
    await page.locator('.opblock-tag', { hasText: /./ }).first().waitFor();
    expect(violations).toEqual([]);
  });
});
