import { execFileSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { McpServer } from '@modelcontextprotocol/server';
import { sql } from 'drizzle-orm';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { DASHBOARD_DIST } from '../../apps/api/src/http/dashboard.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil, TERMINAL } from '../support/agent.ts';
import { serveMcp } from '../support/mcp.ts';
import { exec, sessionIn } from '../support/sandbox.ts';
import { z } from 'zod';
import { CHROMIUM } from '../support/browser.ts';

/** A webhook receiver on 127.0.0.1: answers each request with the next queued status (200 when none is). */
async function startReceiver() {
  const answers: number[] = [];
  const got: { headers: IncomingHttpHeaders; body: string }[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      got.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      res.writeHead(answers.shift() ?? 200, { 'content-type': 'text/plain' }).end('receiver says hi');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
    answers,
    got,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** Does `secret` sign this request as Standard Webhooks says (v1, HMAC-SHA256 over id.timestamp.body)? */
function signedWith(secret: string, req: { headers: IncomingHttpHeaders; body: string }): boolean {
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const mac = createHmac('sha256', key)
    .update(`${req.headers['webhook-id']}.${req.headers['webhook-timestamp']}.${req.body}`)
    .digest('base64');
  return String(req.headers['webhook-signature'] ?? '')
    .split(' ')
    .includes(`v1,${mac}`);
}

/** An MCP server made with the SDK (Streamable HTTP on 127.0.0.1) whose tools answer hostile text, a long text, or fail. */
async function startMcpServer(hostile: string) {
  return serveMcp(() => {
    const s = new McpServer({ name: 'dash-tracker', version: '1.0.0' });
    s.registerTool(
      'lookup',
      { description: 'Looks a ticket up', inputSchema: z.object({ ticket: z.string() }) },
      async ({ ticket }) => ({ content: [{ type: 'text', text: `ticket ${ticket}: ${hostile}` }] }),
    );
    s.registerTool('history', { description: 'A long answer' }, async () => ({
      content: [{ type: 'text', text: `${'line of history\n'.repeat(400)}the end` }],
    }));
    s.registerTool('broken', { description: 'Always fails' }, async () => ({
      content: [{ type: 'text', text: 'the tracker is on fire' }],
      isError: true,
    }));
    return s;
  });
}

/**
 * The ops dashboard in a real browser, against the real app served over HTTP (real Postgres,
 * Docker and git; the scripted model is the only fake). Every outcome is checked through the API.
 */
describe('ops dashboard in chromium', () => {
  // With the platform's self-update routes, on this checkout as the source (nothing here applies a
  // patch); the webhook receiver and the MCP server of the tests are on 127.0.0.1, which only
  // webhooks and MCP calls (the outbound policy) look at.
  const ctx = useAgentApp('dash', { selfUpdate: true, env: { KILN_OUTBOUND_ALLOW: '127.0.0.1' } });
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

  it('a commit\u2019s page shows its change file by file (coloured, long files folded, contents as text) and its trailers; a refused Revert is explained there', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const putFile = async (path: string, raw: string) => {
      const r = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=${path}`, { key: ctx.team.key, raw });
      expect(r.status).toBe(200);
      return r.body.commit.sha as string;
    };
    const hostile = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
    const long = Array.from({ length: 300 }, (_, i) => `line ${i}`).join('\n');
    const first = await putFile('knowledge/long.md', `${long}\n`);
    const second = await putFile('knowledge/note.md', `# Note\n\nsecond version ${hostile}\n`);
    // The same line again: reverting `second` alone can no longer apply.
    await putFile('knowledge/note.md', '# Note\n\nthird version\n');

    await open(`#/ws/${ws}`);
    await page
      .locator('#commits tr', { hasText: second.slice(0, 10) })
      .getByRole('link')
      .click();
    await page.locator('#commit details.file').first().waitFor();
    expect(page.url()).toContain(`#/ws/${ws}/commits/${second}`);
    expect(await page.locator('#commit details.file summary .path').allTextContents()).toEqual(['knowledge/note.md']);
    expect(await page.locator('#commit .dl.add').allTextContents()).toEqual(
      expect.arrayContaining([`+second version ${hostile}\n`]),
    );
    expect(await page.locator('#commit .stat').textContent()).toBe('+3 \u22120');
    const facts = await page.locator('#commit dl.facts').textContent();
    expect(facts).toContain('author');
    expect(facts).toContain('user');
    expect(facts).toContain(second);
    // The hostile markup stayed text: no element was made from it and nothing ran.
    expect(await page.locator('#commit .diffs img, #commit .diffs script').count()).toBe(0);
    expect(await page.evaluate(() => (window as { __xss?: number }).__xss)).toBeUndefined();

    const before = (await ctx.t.call('GET', `/v1/workspaces/${ws}/commits`, { key: ctx.team.key })).body.data.length;
    page.once('dialog', (d) => void d.accept());
    await page.locator('#commit').getByRole('button', { name: 'Revert' }).click();
    await page.locator('#commit .conflict:not([hidden])').waitFor();
    expect(await page.locator('#commit .conflict').textContent()).toContain('nothing was changed');
    expect((await ctx.t.call('GET', `/v1/workspaces/${ws}/commits`, { key: ctx.team.key })).body.data.length).toBe(
      before,
    );

    // A long file is folded after 200 lines; the button unfolds the rest.
    await page.goto(`${url}/#/ws/${ws}/commits/${first}`);
    await page.locator('#commit details.file').waitFor();
    const lines = page.locator('#commit .dl.add');
    expect(await lines.count()).toBeLessThan(300);
    await page.getByRole('button', { name: /^Show \d+ more lines$/ }).click();
    expect(await lines.count()).toBe(300);
    expect(await lines.last().textContent()).toBe('+line 299\n');
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
    const cells = await row.locator('td').allTextContents();
    expect(cells).toContain('runc');
    // Its image, and its memory and CPU from its first moment (Docker's readings since its start).
    expect(cells).toContain(live.image);
    expect(await row.locator('td').nth(5).textContent()).toMatch(/^\d+\.\d MiB \/ \d+ MiB$/);
    expect(await row.locator('td').nth(6).textContent()).toMatch(/^\d+\.\d %$/);
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

  it('Pause on the overview puts a gVisor sandbox to disk (shown paused, its checkpoint\u2019s size); Resume brings it back with its variables', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { sandbox: { runtime: 'gvisor' } });
    const first = await exec(ctx.t, ctx.team.key, session, 'kept = 41');
    await open();
    const row = page.locator('#sandboxes tr', { hasText: first.sandbox_id });
    await row.getByRole('button', { name: 'Pause' }).click();
    // The panel reloads after the action: the row says paused, and how much it holds on disk.
    await row.locator('td', { hasText: /^paused$/ }).waitFor();
    // The state is one word however narrow its cell gets (it once read "pau sed").
    const state = row.locator('td:nth-child(3) > span');
    expect(await state.evaluate((e) => getComputedStyle(e).whiteSpace)).toBe('nowrap');
    expect(await row.locator('td').nth(5).textContent()).toMatch(/^\d+\.\d MiB on disk$/);
    const sbx = await ctx.t.call('GET', `/v1/sessions/${session}`, { key: ctx.team.key });
    expect(sbx.body.sandbox).toMatchObject({ id: first.sandbox_id, state: 'paused' });
    await row.getByRole('button', { name: 'Resume' }).click();
    await row.locator('td', { hasText: /^idle$/ }).waitFor();
    const again = await exec(ctx.t, ctx.team.key, session, 'print(kept + 1)');
    expect(again).toMatchObject({ stdout: '42\n', sandbox_id: first.sandbox_id, restarted: false });
    await ctx.t.call('DELETE', `/v1/sessions/${session}`, { key: ctx.team.key });
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

    // The evolution's page shows what it decided and the change it committed; Undo is there.
    const row = page.locator('#evolutions tr', { hasText: queued[0].id });
    await row.getByRole('button', { name: 'Undo' }).waitFor();
    await row.getByRole('link', { name: queued[0].id }).click();
    await page.locator('#evolution details.file').waitFor();
    expect(await page.locator('#evolution details.file summary .path').allTextContents()).toEqual([
      'skills/add-numbers/SKILL.md',
    ]);
    expect(await page.locator('#evolution .dl.add').allTextContents()).toContain('+name: add-numbers\n');
    expect(await page.locator('#evolution h3').textContent()).toBe('Saved how to add numbers');
    page.once('dialog', (d) => void d.accept());
    await page.locator('#evolution').getByRole('button', { name: 'Undo' }).click();
    await page.locator('#flash.ok', { hasText: 'undone as' }).waitFor();
    await page.locator('#evolution dd', { hasText: 'reverted' }).waitFor();
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
    await page.getByRole('link', { name: 'Teams, nodes & updates' }).click();
    await page.locator('#teams tr', { hasText: ctx.team.id }).waitFor();
    expect(await page.locator('#teams').textContent()).toContain('dash');
    // Webhooks are a team's: the org-admin key is told so and gets no webhook panel.
    expect(await page.locator('#webhooks-hint').textContent()).toContain('team key');
    expect(await page.locator('#webhooks, #webhook-create').count()).toBe(0);

    // Sandbox nodes: a registered node nobody can reach shows as silent; it is drained, then removed.
    const added = await ctx.t.call('POST', '/v1/system/nodes', {
      key: ctx.t.adminKey,
      body: { name: 'node-dash', url: 'https://127.0.0.1:9' },
    });
    expect(added.status).toBe(201);
    await page.reload();
    const row = page.locator('#nodes tr', { hasText: 'node-dash' });
    await row.waitFor();
    expect(await row.textContent()).toContain('silent');
    page.once('dialog', (d) => void d.accept());
    await row.getByRole('button', { name: 'Drain' }).click();
    await row.getByRole('button', { name: 'Remove' }).waitFor();
    expect(await row.textContent()).toContain('draining');
    page.once('dialog', (d) => void d.accept());
    await row.getByRole('button', { name: 'Remove' }).click();
    await page.locator('#nodes .empty').waitFor();
    expect((await ctx.t.call('GET', '/v1/system/nodes', { key: ctx.t.adminKey })).body.data).toEqual([]);
  });
  it('platform updates (org-admin key): each check with its log, Apply refused as the API says, a patch that does not apply refused at submit', async () => {
    const head = execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    const db = ctx.t.database.db;
    const checks = [
      { name: 'install', ok: true, duration_ms: 1200, log: 'added 0 packages' },
      { name: 'typecheck', ok: false, duration_ms: 3400, log: 'error TS2322: <img src=x onerror="window.__xss=1">' },
    ];
    await db.execute(sql`insert into platform_updates (id, status, commit_sha, changed_paths, reason, checks, error)
      values ('evo_dashfailed', 'failed', null, '["apps/api/src/x.ts"]', 'a failing change', ${JSON.stringify(checks)}::jsonb, 'typecheck failed'),
             ('evo_dashready', 'ready', ${head}, '["README.md"]', 'a ready change', '[]'::jsonb, null)`);
    try {
      await open('#/admin', ctx.t.adminKey);
      const failed = page.locator('#updates li[data-update=evo_dashfailed]');
      await failed.waitFor();
      expect(await failed.locator('ol.checks summary').allTextContents()).toEqual([
        'install: passed in 1.2 s',
        'typecheck: failed in 3.4 s',
      ]);
      // A failed step's log is open; its text stays text.
      expect(await failed.locator('li.failed pre.log').textContent()).toBe(checks[1]!.log);
      expect(await failed.locator('img').count()).toBe(0);
      expect(await failed.getByRole('button').count()).toBe(0);

      // Its commit is HEAD, whose parent is not HEAD: the API refuses, and the page says why.
      page.once('dialog', (d) => void d.accept());
      await page.locator('#updates li[data-update=evo_dashready]').getByRole('button', { name: 'Apply' }).click();
      await page.locator('#flash.error').waitFor();
      // The same refusal the API gives (the branch moved, or the checkout is on no branch), word for word.
      const refusal = await ctx.t.call('POST', '/v1/system/updates/evo_dashready/apply', { key: ctx.t.adminKey });
      expect(refusal.status).toBe(409);
      expect(await page.locator('#flash').textContent()).toBe(`Apply: ${refusal.body.error.message}`);
      expect((await ctx.t.call('GET', '/v1/system/updates/evo_dashready', { key: ctx.t.adminKey })).body.status).toBe(
        'ready',
      );

      await page.fill(
        '#update-patch',
        'diff --git a/nope.txt b/nope.txt\n--- a/nope.txt\n+++ b/nope.txt\n@@ -1 +1 @@\n-a\n+b\n',
      );
      await page.fill('#update-reason', 'does not apply');
      await page.click('#update-form button[type=submit]');
      await page.locator('#update-form .save-note .error').waitFor();
      const list = (await ctx.t.call('GET', '/v1/system/updates', { key: ctx.t.adminKey })).body.data;
      expect(list.map((u: { id: string }) => u.id).sort()).toEqual(['evo_dashfailed', 'evo_dashready']);
    } finally {
      await db.execute(sql`delete from platform_updates where id in ('evo_dashfailed', 'evo_dashready')`);
    }
  });

  it('the audit page filters by actor, action, resource and time, and pages with the API\u2019s cursor', async () => {
    const made: string[] = [];
    for (let i = 0; i < 12; i++) {
      made.push(
        (await ctx.t.call('POST', '/v1/workspaces', { key: ctx.team.key, body: { name: `dash-paged-${i}` } })).body.id,
      );
    }
    const events = (await ctx.t.call('GET', `/v1/audit?resource=${made[0]}`, { key: ctx.team.key })).body.data;
    const actor = events[0].actor as string;
    await open('#/audit');
    await page.fill('#audit-resource', made[1]!);
    await page.click('#audit-filters button[type=submit]');
    await page.locator('#audit .empty, #audit tbody tr').first().waitFor();
    await page.waitForFunction(
      (id) =>
        document.querySelectorAll('#audit tbody tr').length === 1 &&
        document.querySelector('#audit tbody')!.textContent!.includes(id),
      made[1]!,
    );
    expect(await page.locator('#audit tbody').textContent()).toContain('workspace.create');

    // Everything this key created since the first of the twelve, ten to a page.
    await page.fill('#audit-resource', '');
    await page.fill('#audit-actor', actor);
    await page.fill('#audit-action', 'workspace.create');
    // The form takes local time, to the millisecond.
    const since = new Date(events[0].created_at);
    const local = new Date(since.getTime() - since.getTimezoneOffset() * 60_000).toISOString().slice(0, 23);
    await page.fill('#audit-since', local);
    await page.selectOption('#audit-limit', '10');
    await page.click('#audit-filters button[type=submit]');
    const rows = page.locator('#audit tbody tr');
    const order = async () => (await rows.allTextContents()).map((r) => made.findIndex((id) => r.includes(id)));
    await page.waitForFunction(() => document.querySelectorAll('#audit tbody tr').length === 10);
    expect(await order()).toEqual([11, 10, 9, 8, 7, 6, 5, 4, 3, 2]);
    const older = page.getByRole('button', { name: 'Older \u2192' });
    const newer = page.getByRole('button', { name: '\u2190 Newer' });
    expect(await newer.isDisabled()).toBe(true);
    await older.click();
    await page.locator('#audit .page', { hasText: 'page 2' }).waitFor();
    expect(await order()).toEqual([1, 0]);
    expect(await older.isDisabled()).toBe(true);
    await newer.click();
    await page.locator('#audit .page', { hasText: 'page 1' }).waitFor();
    expect(await order()).toEqual([11, 10, 9, 8, 7, 6, 5, 4, 3, 2]);
  });

  it('the Runs page filters the team\u2019s runs by status, workspace and session', async () => {
    const a = await sessionIn(ctx.t, ctx.team);
    const b = await sessionIn(ctx.t, ctx.team);
    const runs: string[] = [];
    for (const s of [a, a, b]) {
      ctx.fake.script({ content: '<finish>ok</finish>' });
      const r = await converse(ctx.t, ctx.team.key, s.session, 'hello');
      expect(r.run.status).toBe('completed');
      runs.push(r.run.id);
    }
    const failed = await pausedRun('print(1)', false);
    expect((await ctx.t.call('POST', `/v1/runs/${failed.run}/cancel`, { key: ctx.team.key })).status).toBe(200);

    await open('#/');
    await page.getByRole('link', { name: 'Runs', exact: true }).click();
    await page.fill('#runs-workspace', a.ws);
    await page.click('#runs-filters button[type=submit]');
    const ids = async () =>
      (await page.locator('#all-runs tbody tr td:first-child').allTextContents()).filter((t) => t.startsWith('run_'));
    await page.waitForFunction(() => document.querySelectorAll('#all-runs tbody tr').length === 2);
    expect(await ids()).toEqual([runs[1], runs[0]]);

    await page.fill('#runs-workspace', '');
    await page.fill('#runs-session', b.session);
    await page.click('#runs-filters button[type=submit]');
    await page.waitForFunction(() => document.querySelectorAll('#all-runs tbody tr').length === 1);
    expect(await ids()).toEqual([runs[2]]);

    await page.fill('#runs-session', '');
    await page.check('#runs-status-cancelled');
    await page.click('#runs-filters button[type=submit]');
    await page.locator('#all-runs tbody tr', { hasText: failed.run }).waitFor();
    expect(await page.locator('#all-runs .status').allTextContents()).toEqual(expect.arrayContaining(['cancelled']));
    expect(new Set(await page.locator('#all-runs .status').allTextContents())).toEqual(new Set(['cancelled']));

    // The workspace page's runs link opens the same page, filtered to it.
    await page.goto(`${url}/#/ws/${b.ws}`);
    await page.locator('#ws-runs').getByRole('link', { name: 'filter…' }).click();
    await page.waitForFunction(() => document.querySelectorAll('#all-runs tbody tr').length === 1);
    expect(await ids()).toEqual([runs[2]]);
  });

  it('the overview charts each workspace\u2019s tokens and runs per day', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team);
    for (let i = 0; i < 2; i++) {
      ctx.fake.script({ content: '<finish>ok</finish>', usage: { prompt_tokens: 100, completion_tokens: 5 } });
      expect((await converse(ctx.t, ctx.team.key, session, 'hi')).run.status).toBe('completed');
    }
    await open('#/');
    // Named as the workspace is, linked to its page.
    const row = page.locator('#usage tr', { has: page.locator(`a[href="#/ws/${ws}"]`) });
    await row.waitFor();
    expect(await row.locator('a').textContent()).toMatch(/^ws-/);
    const today = new Date().toISOString().slice(0, 10);
    expect(await row.locator('svg.daychart g.day').count()).toBe(14);
    expect(await row.locator(`svg.daychart g.day[data-day="${today}"] title`).textContent()).toBe(
      `${today}: 210 tokens, 2 runs`,
    );
    // The busiest day's bar is the full height; a day without calls has none.
    const heights = await row
      .locator('svg.daychart rect.tokens')
      .evaluateAll((els) => els.map((e) => Number(e.getAttribute('height'))));
    expect(heights.at(-1)).toBe(28);
    expect(heights.slice(0, -1).every((x) => x === 0)).toBe(true);
    expect((await row.locator('td').allTextContents()).slice(1, 5)).toEqual(['2', '200', '10', '2']);
  });

  it('a workspace file opens rendered and sanitised: no script, handler or frame survives, workspace links stay in the console', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const md = [
      '# Field notes',
      '<script>window.__xss = 1</script>',
      '<img src=x onerror="window.__xss = 2">',
      '<iframe src="https://example.com/"></iframe>',
      '<div onclick="window.__xss = 3" id="clicky">click me</div>',
      '<a href="javascript:window.__xss = 4" id="jslink">js link</a>',
      '',
      '[sibling](other.md) [memory](../MEMORY.md) [site](https://example.com/docs) [js](javascript:window.__xss=5)',
      '',
    ].join('\n');
    const put = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/notes.md`, {
      key: ctx.team.key,
      raw: md,
    });
    expect(put.status).toBe(200);
    await open(`#/ws/${ws}`);
    await page.getByRole('link', { name: 'Files, memory and skills' }).click();
    await page.locator('#tree summary', { hasText: 'knowledge/' }).click();
    await page.locator('#tree a', { hasText: 'notes.md' }).click();
    const doc = page.locator('#file .markdown');
    await doc.locator('h1').waitFor();
    expect(await doc.locator('h1').textContent()).toBe('Field notes');
    expect(await doc.locator('script, iframe, img, [onclick], [onerror]').count()).toBe(0);
    await doc.getByText('click me').click();
    await doc.getByText('js link').click();
    await doc.getByText('js', { exact: true }).click();
    expect(await page.evaluate(() => (window as { __xss?: number }).__xss)).toBeUndefined();
    const href = (name: string) => doc.getByRole('link', { name, exact: true }).getAttribute('href');
    expect(await href('sibling')).toBe(`#/ws/${ws}/files/knowledge/other.md`);
    expect(await href('memory')).toBe(`#/ws/${ws}/files/MEMORY.md`);
    expect(await href('site')).toBe('https://example.com/docs');
    expect(await doc.getByRole('link', { name: 'site' }).getAttribute('rel')).toBe('noopener noreferrer nofollow');
    // As text, the same file is its lines, numbered, markup and all.
    await page.getByRole('button', { name: 'Show text' }).click();
    expect(await page.locator('#file pre.lines .ln').nth(1).textContent()).toBe('2<script>window.__xss = 1</script>\n');

    // A workspace link opens the file in the console, with MEMORY.md's budget.
    await page.getByRole('button', { name: 'Show rendered' }).click();
    await doc.getByRole('link', { name: 'memory', exact: true }).click();
    await page.locator('#file .budget').waitFor();
    expect(page.url()).toContain(`#/ws/${ws}/files/MEMORY.md`);
    const usage = (await ctx.t.call('GET', `/v1/workspaces/${ws}/memory`, { key: ctx.team.key })).body;
    expect(await page.locator('#file .budget').textContent()).toBe(
      ` · budget: ${usage.entries} of ${usage.max_entries} entries, ${usage.bytes} of ${usage.max_bytes} bytes`,
    );
  });

  it('editing a file commits it as the user; a refusal (budget, built-in skill) and a redacted secret are shown as the API says', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team, { evolution: { memory_max_entries: 3 } });
    await open(`#/ws/${ws}/files/MEMORY.md`);
    const edit = async (text: string) => {
      await page.getByRole('button', { name: 'Edit' }).click();
      await page.locator('textarea.editor').fill(text);
      await page.getByRole('button', { name: 'Save' }).click();
    };
    await edit('# Core memory\n\n- a\n- b\n- c\n- d\n');
    await page.locator('#file .save-note .error').waitFor();
    expect(await page.locator('#file .save-note').textContent()).toContain('4 entries (limit 3)');
    expect(
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/files?path=MEMORY.md`, { key: ctx.team.key })).body.content,
    ).not.toContain('- d');

    await page.getByRole('button', { name: 'Cancel' }).click();
    await edit('# Core memory\n\n- deploys happen on Fridays\n');
    await page.locator('#file .save-note .ok', { hasText: 'saved as commit' }).waitFor();
    const [newest] = (await ctx.t.call('GET', `/v1/workspaces/${ws}/commits?limit=1`, { key: ctx.team.key })).body.data;
    expect(newest).toMatchObject({ author: 'user', paths: ['MEMORY.md'] });
    expect(await page.locator('#file .save-note').textContent()).toContain(newest.sha.slice(0, 10));
    await page.locator('#file .budget', { hasText: '1 of 3 entries' }).waitFor();

    const fakeAws = ['AKIA', 'ABCDEFGHIJKLMNOP'].join('');
    await page.goto(`${url}/#/ws/${ws}/files/USER.md`);
    await page.locator('#file .file-body').waitFor();
    await edit(`# User\n\naws: ${fakeAws}\n`);
    await page.locator('#file .save-note .warn').waitFor();
    expect(await page.locator('#file .save-note .warn').textContent()).toContain('aws_access_key');
    expect(await page.locator('#file').textContent()).not.toContain(fakeAws);

    await page.goto(`${url}/#/ws/${ws}/files/skills/builtin/memory-keeping/SKILL.md`);
    await page.locator('#file .file-body').waitFor();
    await edit('hijacked');
    await page.locator('#file .save-note .error').waitFor();
    expect(await page.locator('#file .save-note').textContent()).toContain('read-only');
  });

  it('the files page lists the skills and searches memory; a hit opens its file at its line', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const skill = '---\nname: plot-sales\ndescription: Plot monthly sales with matplotlib\n---\n\n1. load\n';
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=skills/plot-sales/SKILL.md`, {
      key: ctx.team.key,
      raw: skill,
    });
    const log = '# Daily log\n\nline two\nline three\nthe quarterly zebra report moved to Thursdays\n';
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/zebra.md`, { key: ctx.team.key, raw: log });
    await open(`#/ws/${ws}/files`);
    const skills = page.locator('#skills li');
    await page.locator('#skills li', { hasText: 'plot-sales' }).waitFor();
    expect(await page.locator('#skills li', { hasText: 'plot-sales' }).textContent()).toBe(
      'plot-sales — Plot monthly sales with matplotlib',
    );
    expect(await skills.filter({ hasText: 'built-in' }).count()).toBeGreaterThan(0);

    await page.fill('#memory-q', 'zebra');
    await page.click('#memory-search button[type=submit]');
    const hit = page.locator('#search .hits li').first();
    await hit.waitFor();
    const label = await hit.getByRole('link').textContent();
    expect(label).toMatch(/^knowledge\/zebra\.md:\d+$/);
    expect(await hit.locator('pre.snippet').textContent()).toContain('zebra report');
    await hit.getByRole('link').click();
    await page.locator('#file pre.lines .ln.hl').waitFor();
    expect(page.url()).toContain(`#/ws/${ws}/files/knowledge/zebra.md?line=`);
    expect(await page.locator('#file .ln.hl').getAttribute('data-line')).toBe(label!.split(':')[1]);
  });

  describe('chat', () => {
    /** Opens the chat, picks the workspace and starts a session from the page. */
    async function startChat(ws: string): Promise<string> {
      await open('#/');
      await page.getByRole('link', { name: 'Chat', exact: true }).click();
      await page.locator(`#chat-ws option[value="${ws}"]`).waitFor({ state: 'attached' });
      await page.selectOption('#chat-ws', ws);
      await page.locator('#chat-new:not([disabled])').click();
      await page.waitForFunction(() => /^#\/chat\/[^/]+\/ses_/.test(location.hash));
      await page.locator('#chat-send:not([disabled])').waitFor();
      return decodeURIComponent(page.url().split('/').at(-1)!);
    }
    async function say(text: string) {
      await page.fill('#chat-input', text);
      await page.click('#chat-send');
    }

    it('sends a message and shows the run live: thinking, code, output, a PNG, the commit and the answer', async () => {
      const { ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
      const session = await startChat(ws);
      const code = [
        'import matplotlib.pyplot as plt',
        'plt.plot([1, 2, 3], [1, 4, 9])',
        'open("knowledge/chat-note.md", "w").write("# From the chat\\n")',
        'print("squares <b>plotted</b>")',
      ].join('\n');
      ctx.fake.script(
        { content: `<thinking>plot the squares</thinking><python>${code}</python>` },
        { content: '<finish>Plotted the squares & saved a note.</finish>' },
      );
      await say('plot some squares');
      const turn = page.locator('#chat-log .turn');
      await turn.locator('.end.completed').waitFor();
      expect(await page.locator('#chat-log .msg.user').last().textContent()).toContain('plot some squares');
      expect(await turn.locator('details.thinking pre').textContent()).toBe('plot the squares');
      expect(await turn.locator('pre.code').textContent()).toBe(code);
      expect(await turn.locator('pre.output').textContent()).toBe('squares <b>plotted</b>\n');
      expect(await turn.locator('pre.output b').count()).toBe(0);
      const img = turn.locator('img.artifact');
      await img.waitFor();
      expect(await img.evaluate((el: HTMLImageElement) => el.complete && el.naturalWidth > 0)).toBe(true);
      const [commit] = (
        await ctx.t.call('GET', `/v1/workspaces/${ws}/commits?session=${session}`, { key: ctx.team.key })
      ).body.data;
      expect(commit.paths).toEqual(['knowledge/chat-note.md']);
      expect(await turn.locator('.commit a').getAttribute('href')).toBe(`#/ws/${ws}/commits/${commit.sha}`);
      expect(await turn.locator('.msg.assistant').textContent()).toContain('Plotted the squares & saved a note.');
      await page.locator('#chat-send:not([disabled])').waitFor();
      // Opened again, the session shows its transcript: the question and the answer, not the steps between.
      await page.reload();
      await page.locator('#chat-log .msg.assistant').waitFor();
      expect(await page.locator('#chat-log .msg').allTextContents()).toEqual([
        'youplot some squares',
        'agentPlotted the squares & saved a note.',
      ]);
    });

    it('a run that pauses is approved inline (for the session), and the next code in that session runs without asking', async () => {
      const { ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'ask' } });
      const session = await startChat(ws);
      ctx.fake.script(
        { content: '<python>print("first " + str(6 * 7))</python>' },
        { content: '<finish>one</finish>' },
      );
      await say('go');
      const box = page.locator('#chat-log .approval');
      await box.locator('pre.code', { hasText: 'first' }).waitFor();
      await box.getByRole('button', { name: 'Approve for session' }).click();
      await page.locator('#chat-log .turn pre.output', { hasText: 'first 42' }).waitFor();
      await page.locator('#chat-log .end.completed').waitFor();
      expect(await box.locator('.resolved').textContent()).toContain('approved');

      ctx.fake.script({ content: '<python>print("second")</python>' }, { content: '<finish>two</finish>' });
      await say('again');
      await page.locator('#chat-log .turn pre.output', { hasText: 'second' }).waitFor();
      await page.locator('#chat-log .end.completed').nth(1).waitFor();
      expect(await page.locator('#chat-log .approval').count()).toBe(1);
      const runs = (await ctx.t.call('GET', `/v1/runs?session=${session}`, { key: ctx.team.key })).body.data;
      expect(runs.map((r: { status: string }) => r.status)).toEqual(['completed', 'completed']);
    });

    it('Deny and Cancel act on the run from the chat', async () => {
      const { ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'ask' } });
      const session = await startChat(ws);
      ctx.fake.script({ content: '<python>print("no")</python>' }, { content: '<finish>understood</finish>' });
      await say('try');
      await page.locator('#chat-log .approval').getByRole('button', { name: 'Deny' }).click();
      await page.locator('#chat-log .end.completed').waitFor();
      expect(await page.locator('#chat-log .approval .resolved').textContent()).toContain('denied');
      expect(await page.locator('#chat-log .turn pre.output').count()).toBe(0);

      ctx.fake.script({ content: '<python>print("never")</python>' });
      await say('try again');
      await page.locator('#chat-log .approval').nth(1).waitFor();
      await page.locator('#chat-log .turn-head').nth(1).getByRole('button', { name: 'Cancel' }).click();
      await page.locator('#chat-log .end.cancelled').waitFor();
      const runs = (await ctx.t.call('GET', `/v1/runs?session=${session}`, { key: ctx.team.key })).body.data;
      expect(runs[0].status).toBe('cancelled');
      await page.locator('#chat-send:not([disabled])').waitFor();
    });

    it('a dropped stream resumes where it stopped: nothing is lost or shown twice; reopening the session shows its transcript and follows its live run', async () => {
      const { ws, session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'ask' } });
      ctx.fake.script(
        { content: '<thinking>once</thinking><python>print("resumed")</python>' },
        { content: '<finish>fine</finish>' },
      );
      const posted = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
        key: ctx.team.key,
        body: { content: 'hi' },
      });
      const run = posted.body.run.id as string;
      await eventsUntil(ctx.t, run, ['run.requires_action']);
      const stored = (await (
        await ctx.t.app.request(`/v1/runs/${run}/events`, {
          headers: { authorization: `Bearer ${ctx.team.key}`, accept: 'application/json' },
        })
      ).json()) as { data: { id: number; event: string; data: unknown }[] };
      // The first connection carries the first three events, then drops.
      const partial = stored.data
        .slice(0, 3)
        .map((e) => `id: ${e.id}\nevent: ${e.event}\ndata: ${JSON.stringify(e.data)}\n\n`)
        .join('');
      page = await (await browser.newContext()).newPage();
      const asked: (string | null)[] = [];
      let first = true;
      await page.route('**/v1/runs/*/events', async (route) => {
        asked.push(route.request().headers()['last-event-id'] ?? null);
        if (first) {
          first = false;
          await route.fulfill({ status: 200, contentType: 'text/event-stream', body: partial });
        } else await route.continue();
      });
      await page.goto(`${url}/#/chat/${ws}/${session}`);
      await page.fill('#key', ctx.team.key);
      await page.click('form.signin button[type=submit]');
      await page.locator('#chat-log .approval').waitFor();
      expect(await page.locator('#chat-log .msg.user').allTextContents()).toEqual(['youhi']);
      expect(asked).toEqual([null, String(stored.data[2]!.id)]);
      await page.locator('#chat-log .approval').getByRole('button', { name: 'Approve', exact: true }).click();
      await page.locator('#chat-log .end.completed').waitFor();
      expect(await page.locator('#chat-log details.thinking').count()).toBe(1);
      expect(await page.locator('#chat-log pre.code').count()).toBe(2); // the proposal and the approval box
      expect(await page.locator('#chat-log pre.output').allTextContents()).toEqual(['resumed\n']);
      expect(await page.locator('#chat-log .msg.assistant').allTextContents()).toEqual(['agentfine']);
    });
  });

  it('a hostile workspace name and hostile run output stay text on every page that shows them', async () => {
    const name = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
    const ws = (
      await ctx.t.call('POST', '/v1/workspaces', {
        key: ctx.team.key,
        body: { name, settings: { approval: { mode: 'auto' } } },
      })
    ).body.id as string;
    const session = (await ctx.t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: ctx.team.key, body: {} })).body
      .id;
    const out = '<img src=y onerror="window.__xss=3"><svg onload="window.__xss=4"></svg>';
    ctx.fake.script(
      { content: `<python>print(${JSON.stringify(out)})</python>` },
      { content: `<finish>${out}</finish>` },
    );
    const r = await converse(ctx.t, ctx.team.key, session, out);
    expect(r.run.status).toBe('completed');
    const noMarkup = async () => {
      expect(await page.locator('main img, main script, main svg:not(.daychart)').count()).toBe(0);
      expect(await page.evaluate(() => (window as { __xss?: number }).__xss)).toBeUndefined();
    };
    await open('#/');
    await page.locator('#workspaces td a', { hasText: name }).waitFor();
    await page.locator('#usage a', { hasText: name }).waitFor();
    await noMarkup();
    await page.goto(`${url}/#/ws/${ws}`);
    await page.locator('#workspace .ws-name', { hasText: name }).waitFor();
    await noMarkup();
    await page.goto(`${url}/#/runs/${r.run.id}`);
    await page.locator('.events li.exec-output', { hasText: out }).waitFor();
    await noMarkup();
    await page.goto(`${url}/#/chat/${ws}/${session}`);
    await page.locator('#chat-log .msg.assistant', { hasText: out }).waitFor();
    expect(await page.locator('#chat-ws option:checked').textContent()).toBe(name);
    expect(await page.locator('#chat-log .msg.user').textContent()).toContain(out);
    await noMarkup();
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
  /** A webhook of the team, made through the API, to `url` for `sandbox.oom` (no test here makes one). */
  async function webhookTo(url: string) {
    const made = await ctx.t.call('POST', '/v1/webhooks', {
      key: ctx.team.key,
      body: { url, events: ['sandbox.oom'] },
    });
    expect(made.status).toBe(201);
    return made.body as { id: string; secret: string };
  }
  /** Clicks a button that queues a delivery and waits for the API's 202 to it. */
  async function sent(button: ReturnType<Page['locator']>) {
    const accepted = page.waitForResponse((r) => r.request().method() === 'POST' && r.status() === 202);
    await button.click();
    await accepted;
  }
  const deliveriesOf = async (hook: string) =>
    (await ctx.t.call('GET', `/v1/webhooks/${hook}/deliveries`, { key: ctx.team.key })).body.data as {
      id: string;
      status: string;
      last_status_code: number | null;
      replay_of: string | null;
    }[];

  it('a webhook made on the Team page shows its signing secret once (the one that signs its deliveries), not after a reload', async () => {
    const receiver = await startReceiver();
    try {
      await open('#/admin');
      await page.locator('#webhooks .empty, #webhooks table').first().waitFor();
      // A team key's Team page does not ask for the org-admin panels (version, platform updates).
      expect(await page.locator('#version, #updates, #update-submit, #nodes').count()).toBe(0);
      await page.fill('#webhook-url', receiver.url);
      await page.check('#webhook-form input[value="sandbox.oom"]');
      await page.check('#webhook-form input[value="update.applied"]');
      await page.fill('#webhook-description', 'dash pager');
      await page.click('#webhook-form button[type=submit]');
      const shown = page.locator('#webhook-secret code.secret');
      await shown.waitFor();
      const secret = (await shown.textContent()) ?? '';
      expect(secret).toMatch(/^whsec_[A-Za-z0-9+/=]{20,}$/);
      expect(await page.locator('#webhook-secret').textContent()).toContain('it is not shown again');
      const listed = (await ctx.t.call('GET', '/v1/webhooks', { key: ctx.team.key })).body.data as {
        id: string;
        url: string;
      }[];
      const hook = listed.find((w) => w.url === receiver.url)!;
      expect(hook).toMatchObject({
        events: ['sandbox.oom', 'update.applied'],
        description: 'dash pager',
        enabled: true,
      });
      expect(hook).not.toHaveProperty('secret');
      await page.locator(`#webhooks [data-webhook="${hook.id}"]`, { hasText: receiver.url }).waitFor();
      expect(await page.locator(`#webhooks tr:has([data-webhook="${hook.id}"])`).textContent()).toContain('none yet');

      // The secret shown is the one its deliveries are signed with.
      expect((await ctx.t.call('POST', `/v1/webhooks/${hook.id}/test`, { key: ctx.team.key })).status).toBe(202);
      await ctx.t.evolution.jobs.drain();
      expect(receiver.got).toHaveLength(1);
      expect(signedWith(secret, receiver.got[0]!)).toBe(true);

      await page.reload();
      await page.locator(`#webhooks [data-webhook="${hook.id}"]`).waitFor();
      expect(await page.locator('#webhook-secret').isHidden()).toBe(true);
      expect(await page.content()).not.toContain(secret);
      await page.goto(`${url}/#/webhooks/${hook.id}`);
      await page.locator('#webhook .webhook-url', { hasText: receiver.url }).waitFor();
      expect(await page.content()).not.toContain(secret);
      expect((await ctx.t.call('DELETE', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).status).toBe(200);
    } finally {
      await receiver.close();
    }
  });

  it('a webhook\u2019s delivery log shows each delivery with its attempts\u2019 status codes; Replay adds a delivery', async () => {
    const receiver = await startReceiver();
    try {
      const hook = await webhookTo(receiver.url);
      await open(`#/webhooks/${hook.id}`);
      await page.locator('#deliveries', { hasText: 'no delivery yet' }).waitFor();
      await sent(page.getByRole('button', { name: 'Send test' }));
      await ctx.t.evolution.jobs.drain();
      const [ok] = await deliveriesOf(hook.id);
      expect(ok).toMatchObject({ status: 'succeeded', last_status_code: 200 });
      const okRow = page.locator(`#deliveries tr:has([data-delivery="${ok!.id}"])`);
      await okRow.locator('.status.succeeded').waitFor();
      expect(await okRow.locator('.codes').textContent()).toBe('200');
      expect(await okRow.textContent()).toContain('webhook.test');
      expect(await okRow.textContent()).toContain('1/');

      // The receiver refuses the next one (410 is not retried): failed at once, with its code and answer.
      receiver.answers.push(410);
      await sent(page.getByRole('button', { name: 'Send test' }));
      await ctx.t.evolution.jobs.drain();
      const failed = (await deliveriesOf(hook.id)).find((d) => d.id !== ok!.id)!;
      expect(failed).toMatchObject({ status: 'failed', last_status_code: 410 });
      const failedRow = page.locator(`#deliveries tr:has([data-delivery="${failed.id}"])`);
      await failedRow.locator('.status.failed').waitFor();
      expect(await failedRow.locator('.codes').textContent()).toBe('410');
      expect(await failedRow.locator('td[data-label="last error"] .last-error').textContent()).toContain(
        'receiver says hi',
      );
      // Each attempt opens onto its time, code and duration.
      await failedRow.locator('details.attempts summary').click();
      expect(await failedRow.locator('details.attempts li').allTextContents()).toEqual([
        expect.stringMatching(/ · HTTP 410 · \d+ ms · HTTP 410: receiver says hi$/),
      ]);

      await sent(failedRow.getByRole('button', { name: 'Replay' }));
      await page.locator('#flash.ok', { hasText: 'sent again as' }).waitFor();
      await ctx.t.evolution.jobs.drain();
      const all = await deliveriesOf(hook.id);
      expect(all).toHaveLength(3);
      const replayed = all.find((d) => d.replay_of === failed.id)!;
      expect(replayed).toMatchObject({ status: 'succeeded', last_status_code: 200 });
      expect(receiver.got.map((g) => JSON.parse(g.body).id)).toEqual([
        expect.any(String),
        JSON.parse(receiver.got[1]!.body).id,
        JSON.parse(receiver.got[1]!.body).id,
      ]);
      const replayRow = page.locator(`#deliveries tr:has([data-delivery="${replayed.id}"])`);
      await replayRow.locator('.status.succeeded').waitFor();
      expect(await replayRow.textContent()).toContain(`replay of ${failed.id}`);

      // The team page shows each webhook's last delivery.
      await page.goto(`${url}/#/admin`);
      const listed = page.locator(`#webhooks tr:has([data-webhook="${hook.id}"])`);
      await listed.locator('.status.succeeded').waitFor();
      expect(await listed.textContent()).toContain('HTTP 200');
      expect((await ctx.t.call('DELETE', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).status).toBe(200);
    } finally {
      await receiver.close();
    }
  });

  it('Rotate secret shows the new secret once and only it signs; Disable and Delete act as the API says', async () => {
    const receiver = await startReceiver();
    try {
      const hook = await webhookTo(receiver.url);
      await open(`#/webhooks/${hook.id}`);
      await page.locator('#webhook-enabled', { hasText: 'yes' }).waitFor();
      page.once('dialog', (d) => void d.accept());
      await page.getByRole('button', { name: 'Rotate secret' }).click();
      const shown = page.locator('#webhook-secret code.secret');
      await shown.waitFor();
      const secret = (await shown.textContent()) ?? '';
      expect(secret).toMatch(/^whsec_/);
      expect(secret).not.toBe(hook.secret);
      expect(await page.locator('#webhook-secret').textContent()).toContain('it is not shown again');
      expect((await ctx.t.call('POST', `/v1/webhooks/${hook.id}/test`, { key: ctx.team.key })).status).toBe(202);
      await ctx.t.evolution.jobs.drain();
      expect(receiver.got).toHaveLength(1);
      expect(signedWith(secret, receiver.got[0]!)).toBe(true);
      expect(signedWith(hook.secret, receiver.got[0]!)).toBe(false);

      await page.getByRole('button', { name: 'Disable' }).click();
      await page.locator('#webhook-enabled', { hasText: 'no' }).waitFor();
      expect((await ctx.t.call('GET', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).body.enabled).toBe(false);
      // The secret stays until it is put away (or the page goes), and is not shown again.
      await page.getByRole('button', { name: 'I have copied it' }).click();
      expect(await page.locator('#webhook-secret').isHidden()).toBe(true);
      expect(await page.content()).not.toContain(secret);

      page.once('dialog', (d) => void d.accept());
      await page.getByRole('button', { name: 'Delete' }).click();
      await page.waitForURL('**/#/admin');
      await page.locator('#flash.ok', { hasText: 'deleted' }).waitFor();
      expect((await ctx.t.call('GET', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).status).toBe(404);
      await page.locator('#webhooks .pages').waitFor();
      expect(await page.locator(`#webhooks [data-webhook="${hook.id}"]`).count()).toBe(0);
    } finally {
      await receiver.close();
    }
  });

  it('a viewer key sees the webhooks and their deliveries; each write shows the API\u2019s refusal and changes nothing', async () => {
    const receiver = await startReceiver();
    try {
      const hook = await webhookTo(receiver.url);
      const ids = async () =>
        ((await ctx.t.call('GET', '/v1/webhooks', { key: ctx.team.key })).body.data as { id: string }[]).map(
          (w) => w.id,
        );
      const before = await ids();
      expect((await ctx.t.call('POST', `/v1/webhooks/${hook.id}/test`, { key: ctx.team.key })).status).toBe(202);
      await ctx.t.evolution.jobs.drain();
      const viewer = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
        key: ctx.t.adminKey,
        body: { name: 'dash viewer', role: 'viewer' },
      });
      expect(viewer.status).toBe(201);
      const refused = (
        await ctx.t.call('POST', '/v1/webhooks', {
          key: viewer.body.key,
          body: { url: receiver.url, events: ['run.failed'] },
        })
      ).body.error.message as string;
      expect(refused).toContain('read-only');

      await open('#/admin', viewer.body.key);
      await page.locator(`#webhooks [data-webhook="${hook.id}"]`).waitFor();
      await page.fill('#webhook-url', receiver.url);
      await page.check('#webhook-form input[value="run.failed"]');
      await page.click('#webhook-form button[type=submit]');
      await page.locator('#webhook-form [role=alert]', { hasText: refused }).waitFor();
      expect(await page.locator('#webhook-secret').isHidden()).toBe(true);

      await page.goto(`${url}/#/webhooks/${hook.id}`);
      const [delivery] = await deliveriesOf(hook.id);
      const row = page.locator(`#deliveries tr:has([data-delivery="${delivery!.id}"])`);
      await row.locator('.codes', { hasText: '200' }).waitFor();
      await page.getByRole('button', { name: 'Disable' }).click();
      await page.locator('#flash.error', { hasText: `Disable: ${refused}` }).waitFor();
      await row.getByRole('button', { name: 'Replay' }).click();
      await page.locator('#flash.error', { hasText: `Replay: ${refused}` }).waitFor();

      expect(await ids()).toEqual(before);
      expect((await ctx.t.call('GET', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).body.enabled).toBe(true);
      expect(await deliveriesOf(hook.id)).toHaveLength(1);
      expect((await ctx.t.call('DELETE', `/v1/webhooks/${hook.id}`, { key: ctx.team.key })).status).toBe(200);
    } finally {
      await receiver.close();
    }
  });

  it('the workspace page lists its MCP servers (header names, secret references, never values), adds and removes one; a bad URL shows the API\u2019s error', async () => {
    const ws = (await ctx.t.call('POST', '/v1/workspaces', { key: ctx.team.key, body: { name: 'dash-mcp' } })).body
      .id as string;
    const settingsOf = async () =>
      (await ctx.t.call('GET', `/v1/workspaces/${ws}`, { key: ctx.team.key })).body.settings.mcp_servers;
    const bad = await ctx.t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: ctx.team.key,
      body: { settings: { mcp_servers: [{ name: 'Tracker X', url: 'ftp://tracker.example', headers: {} }] } },
    });
    expect(bad.status).toBe(400);
    await open(`#/ws/${ws}`);
    await page.locator('#mcp-servers .empty').waitFor();
    await page.fill('#mcp-name', 'Tracker X');
    await page.fill('#mcp-url', 'ftp://tracker.example');
    await page.click('#mcp-form button[type=submit]');
    // Each bad field the API named (a bad name, a bad URL), as it named it.
    const problems = (bad.body.error.details as { path: string; message: string }[]).map(
      (d) => `${d.path}: ${d.message}`,
    );
    expect(problems.length).toBeGreaterThan(1);
    const alert = page.locator('#mcp-form [role=alert]');
    await alert.locator('li').first().waitFor();
    expect(await alert.locator('li').allTextContents()).toEqual(problems);
    expect(await settingsOf()).toEqual([]);

    await page.fill('#mcp-name', 'tracker');
    await page.fill('#mcp-url', 'https://tracker.example/mcp');
    await page.fill('#mcp-headers', 'Authorization: Bearer ${secrets.TRACKER_TOKEN}\nX-Tenant: blue-42-private');
    await page.click('#mcp-form button[type=submit]');
    await page.locator('#mcp-form .ok', { hasText: 'tracker added' }).waitFor();
    expect(await settingsOf()).toEqual([
      {
        name: 'tracker',
        url: 'https://tracker.example/mcp',
        headers: { Authorization: 'Bearer ${secrets.TRACKER_TOKEN}', 'X-Tenant': 'blue-42-private' },
      },
    ]);
    const row = page.locator('#mcp-servers tr:has([data-mcp="tracker"])');
    await row.waitFor();
    expect(await row.textContent()).toContain('https://tracker.example/mcp');
    expect(await row.locator('ul.headers li').allTextContents()).toEqual([
      'Authorization from ${secrets.TRACKER_TOKEN}',
      'X-Tenant (value hidden)',
    ]);
    expect(await page.locator('#mcp-servers').textContent()).not.toContain('blue-42-private');
    expect(await page.locator('#mcp-servers').textContent()).not.toContain('Bearer');

    page.once('dialog', (d) => void d.accept());
    await row.getByRole('button', { name: 'Remove' }).click();
    await page.locator('#flash.ok', { hasText: 'tracker removed' }).waitFor();
    await page.locator('#mcp-servers .empty').waitFor();
    expect(await settingsOf()).toEqual([]);
  });

  it('the chat and the run page show MCP tool calls and results (server.tool, arguments, decision, duration, error, an excerpt) as text', async () => {
    const hostile = '<img src=x onerror="window.__xss=5"><script>window.__xss=6</script>';
    const mcp = await startMcpServer(hostile);
    try {
      const { ws, session } = await sessionIn(ctx.t, ctx.team, {
        approval: { mode: 'auto' },
        mcp_servers: [{ name: 'tracker', url: mcp.url, headers: {} }],
      });
      ctx.fake.script(
        { content: '<tool name="tracker.lookup">{"ticket": "KIL-7"}</tool>' },
        { content: '<tool name="tracker.history"></tool>' },
        { content: '<tool name="tracker.broken"></tool>' },
        { content: '<finish>looked it up</finish>' },
      );
      const noMarkup = async () => {
        expect(await page.locator('main img, main script').count()).toBe(0);
        expect(await page.evaluate(() => (window as { __xss?: number }).__xss)).toBeUndefined();
      };
      // Live, in the chat.
      await open(`#/chat/${ws}/${session}`);
      await page.locator('#chat-send:not([disabled])').waitFor();
      await page.fill('#chat-input', 'look up KIL-7');
      await page.click('#chat-send');
      const turn = page.locator('#chat-log .turn');
      await turn.locator('.end.completed').waitFor();
      expect(await turn.locator('.tool.call .tool-name').allTextContents()).toEqual([
        'tracker.lookup',
        'tracker.history',
        'tracker.broken',
      ]);
      expect(await turn.locator('.tool.result pre.result').first().textContent()).toBe(`ticket KIL-7: ${hostile}`);
      await noMarkup();

      const runs = await ctx.t.call('GET', `/v1/runs?session=${session}`, { key: ctx.team.key });
      const run = runs.body.data[0].id as string;
      const events = await eventsUntil(ctx.t, run, TERMINAL);
      expect(events.at(-1)!.event).toBe('run.completed');
      const durations = events
        .filter((e) => e.event === 'tool.result')
        .map((e) => (e.data as { duration_ms: number }).duration_ms);
      expect(durations).toHaveLength(3);

      await page.goto(`${url}/#/runs/${run}`);
      await page.locator('.events li.run-completed').waitFor();
      const calls = page.locator('.events li.tool-call');
      expect(await calls.locator('.tool-name').allTextContents()).toEqual([
        'tracker.lookup',
        'tracker.history',
        'tracker.broken',
      ]);
      expect(await calls.first().locator('.decision').textContent()).toBe('allow');
      expect(JSON.parse((await calls.first().locator('pre.args').textContent()) ?? '')).toEqual({ ticket: 'KIL-7' });
      const results = page.locator('.events li.tool-result');
      expect(await results.locator('.duration').allTextContents()).toEqual(durations.map((d) => ` · ${d} ms`));
      expect(await results.nth(0).locator('pre.result').textContent()).toBe(`ticket KIL-7: ${hostile}`);
      // A long answer: its head, and all of it one click away.
      const long = results.nth(1);
      expect(((await long.locator('pre.result').first().textContent()) ?? '').endsWith('…')).toBe(true);
      await long.locator('summary', { hasText: /show all \d+ characters/ }).click();
      expect(await long.locator('details pre.result').textContent()).toContain('the end');
      const broken = results.nth(2);
      expect(await broken.locator('.tool.result.failed').count()).toBe(1);
      expect(await broken.locator('.status.failed').textContent()).toBe(' · error');
      expect(await broken.locator('pre.result').textContent()).toContain('the tracker is on fire');
      await noMarkup();
    } finally {
      await mcp.close();
    }
  });
});
