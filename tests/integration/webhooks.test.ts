import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { webhookEventWrite } from '../../apps/api/src/webhooks/events.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, PAUSED } from '../support/agent.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/**
 * The job runner's clock: the wall clock plus what the tests skipped ahead, so anything queued
 * "now" is due at once and a retry only once the test moves past its backoff.
 */
let skipped = 0;
const jobsNow = () => Date.now() + skipped;
const HOUR = 3600_000;
const ENV = { KILN_OUTBOUND_ALLOW: '127.0.0.1', KILN_WEBHOOK_MAX_ATTEMPTS: '4' };

/** How a receiver answers one request: a status, or closing the connection without a word. */
type Answer = number | 'close';

interface Received {
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
}

/** A webhook receiver on 127.0.0.1: answers from a per-path script (then 200), records what it got. */
async function startReceiver(port = 0) {
  const got: Received[] = [];
  const scripts = new Map<string, Answer[]>();
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '/';
      got.push({ path, headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      const answer = scripts.get(path)?.shift() ?? 200;
      if (answer === 'close') {
        req.socket.destroy();
        return;
      }
      res.writeHead(answer, { 'content-type': 'text/plain' }).end(answer >= 300 ? `nope ${answer}` : 'ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  const at = (server.address() as AddressInfo).port;
  return {
    url: (path: string) => `http://127.0.0.1:${at}${path}`,
    port: at,
    got,
    to: (path: string) => got.filter((r) => r.path === path),
    script: (path: string, ...answers: Answer[]) => scripts.set(path, answers),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/**
 * The verification docs/webhooks.md documents, imported from the page itself (its first js block
 * under "Verifying a request"), so the snippet people copy is the one that checks every delivery here.
 */
type Verify = (secret: string, headers: IncomingHttpHeaders, body: string) => boolean;
let verify: Verify;
beforeAll(async () => {
  const page = readFileSync(fileURLToPath(new URL('../../docs/webhooks.md', import.meta.url)), 'utf8');
  const section = page.slice(page.indexOf('\n## Verifying a request\n'));
  const block = /```js\n([\s\S]*?)```/.exec(section)![1]!;
  const dir = mkdtempSync(join(tmpdir(), 'kiln-verify-'));
  writeFileSync(join(dir, 'verify.mjs'), block);
  verify = (await import(pathToFileURL(join(dir, 'verify.mjs')).href)).verifyWebhook;
  rmSync(dir, { recursive: true, force: true });
});

const ALL = ['run.completed', 'run.failed', 'run.requires_action', 'evolution.committed', 'sandbox.oom'];

describe('webhooks', () => {
  const ctx = useAgentApp('hooks', { env: ENV, jobsNow });
  let rx: Awaited<ReturnType<typeof startReceiver>>;
  let other: { id: string; key: string };
  let viewer: string;
  /** Team hooks: `all` takes every team event, `failed` only run.failed; `other` is another team's, subscribed to all. */
  const hooks: Record<'all' | 'failed' | 'other', { id: string; secret: string }> = {} as never;

  const call = (method: string, path: string, key: string, body?: unknown) => ctx.t.call(method, path, { key, body });
  const deliveries = async (hook: string, key = ctx.team.key) =>
    (await call('GET', `/v1/webhooks/${hook}/deliveries?limit=100&order=asc`, key)).body.data as any[];
  const countRows = async (table: 'webhooks' | 'webhook_deliveries') =>
    rowsOf<{ n: number }>(await ctx.t.database.db.execute(sql.raw(`select count(*)::int as n from ${table}`)))[0]!.n;
  const drain = () => ctx.t.evolution.jobs.drain();

  beforeAll(async () => {
    rx = await startReceiver();
    other = await ctx.t.team('other-hooks');
    const v = await call('POST', `/v1/teams/${ctx.team.id}/keys`, ctx.team.key, { name: 'v', role: 'viewer' });
    viewer = v.body.key;
    const make = async (key: string, url: string, events: string[]) => {
      const r = await call('POST', '/v1/webhooks', key, { url, events, description: 'test receiver' });
      expect(r.status).toBe(201);
      return { id: r.body.id as string, secret: r.body.secret as string };
    };
    hooks.all = await make(ctx.team.key, rx.url('/all'), ALL);
    hooks.failed = await make(ctx.team.key, rx.url('/failed'), ['run.failed']);
    hooks.other = await make(other.key, rx.url('/other'), ALL);
  });
  afterAll(() => rx?.close());

  it('shows the secret once: the create answer has it, get, list and the audit log never do', async () => {
    expect(hooks.all.secret).toMatch(/^whsec_[A-Za-z0-9+/]{32}$/);
    const got = await call('GET', `/v1/webhooks/${hooks.all.id}`, ctx.team.key);
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id: hooks.all.id, url: rx.url('/all'), events: ALL, enabled: true });
    expect(got.body).not.toHaveProperty('secret');
    const list = await call('GET', '/v1/webhooks', viewer);
    expect(list.body.data.map((w: { id: string }) => w.id).sort()).toEqual([hooks.all.id, hooks.failed.id].sort());
    expect(JSON.stringify(list.body)).not.toContain('whsec_');
    const audit = await call('GET', '/v1/audit?limit=100', ctx.team.key);
    const created = audit.body.data.filter((e: { action: string }) => e.action === 'webhook.create');
    expect(created).toHaveLength(2);
    expect(JSON.stringify(audit.body)).not.toContain(hooks.all.secret);
    expect(ctx.t.logText()).not.toContain(hooks.all.secret);
    const stored = rowsOf<{ s: string }>(
      await ctx.t.database.db.execute(sql`select secret_sealed as s from webhooks where id = ${hooks.all.id}`),
    )[0]!.s;
    expect(stored).not.toContain(hooks.all.secret.slice('whsec_'.length));
  });

  it('bad input is a 400 envelope and writes nothing; viewers may not write', async () => {
    const before = await countRows('webhooks');
    const bad = [
      { url: 'ftp://example.com/x', events: ['run.completed'] },
      { url: 'not a url', events: ['run.completed'] },
      { url: 'http://10.1.2.3/hook', events: ['run.completed'] },
      { url: 'http://169.254.169.254/latest', events: ['run.completed'] },
      { url: 'http://[::1]:8080/x', events: ['run.completed'] },
      // IPv6 forms of private IPv4 addresses: compatible, 6to4 (the metadata address), Teredo.
      { url: 'http://[::10.1.2.3]/hook', events: ['run.completed'] },
      { url: 'http://[2002:a9fe:a9fe::]/latest', events: ['run.completed'] },
      { url: 'http://[2001:0:a00:1::1]/hook', events: ['run.completed'] },
      { url: 'https://user:pw@example.com/x', events: ['run.completed'] },
      { url: `https://example.com/${'a'.repeat(2100)}`, events: ['run.completed'] },
      { url: 'https://example.com/x', events: ['run.exploded'] },
      { url: 'https://example.com/x', events: [] },
      { url: 'https://example.com/x', events: ['run.failed', 'run.failed'] },
      { url: 'https://example.com/x' },
      { url: 'https://example.com/x', events: ['run.failed'], extra: 1 },
    ];
    for (const body of bad) {
      const r = await call('POST', '/v1/webhooks', ctx.team.key, body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(r.body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
    }
    const patch = await call('PATCH', `/v1/webhooks/${hooks.all.id}`, ctx.team.key, { url: 'http://10.0.0.1/' });
    expect(patch.status).toBe(400);
    // The refusal says how an operator allows a private receiver.
    expect(patch.body.error.message).toMatch(/10\.0\.0\.1 is not a public address.*KILN_OUTBOUND_ALLOW/);
    expect((await call('PATCH', `/v1/webhooks/${hooks.all.id}`, ctx.team.key, {})).status).toBe(400);
    const denied = await call('POST', '/v1/webhooks', viewer, { url: rx.url('/v'), events: ['run.failed'] });
    expect(denied.status).toBe(403);
    expect(await countRows('webhooks')).toBe(before);
    expect((await call('GET', `/v1/webhooks/${hooks.all.id}`, ctx.team.key)).body.url).toBe(rx.url('/all'));
  });

  it('another team\u2019s webhook and deliveries are 404 on every route', async () => {
    const id = hooks.other.id;
    const k = ctx.team.key;
    const { body: ping } = await call('POST', `/v1/webhooks/${id}/test`, other.key);
    for (const [method, path, body] of [
      ['GET', `/v1/webhooks/${id}`],
      ['PATCH', `/v1/webhooks/${id}`, { enabled: false }],
      ['DELETE', `/v1/webhooks/${id}`],
      ['POST', `/v1/webhooks/${id}/rotate-secret`],
      ['POST', `/v1/webhooks/${id}/test`],
      ['GET', `/v1/webhooks/${id}/deliveries`],
      ['GET', `/v1/webhooks/${id}/deliveries/${ping.id}`],
      ['POST', `/v1/webhooks/${id}/deliveries/${ping.id}/replay`],
      ['GET', `/v1/webhooks/${hooks.all.id}/deliveries/${ping.id}`],
    ] as [string, string, unknown?][]) {
      const r = await call(method, path, k, body);
      expect(r.status, `${method} ${path}`).toBe(404);
      expect(r.body.error.code).toBe('not_found');
    }
    await drain();
    // The ping reached the other team's receiver (and only it), and nothing else changed.
    expect(rx.to('/other').map((r) => JSON.parse(r.body).type)).toEqual(['webhook.test']);
    expect((await call('GET', `/v1/webhooks/${id}`, other.key)).body.enabled).toBe(true);
  });

  it('retries a receiver that fails (500, then a closed connection) with backoff, signs every attempt, logs them, and replays', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    rx.script('/all', 500, 'close');
    ctx.fake.script({ content: '<finish>done</finish>' });
    const { run } = await converse(ctx.t, ctx.team.key, session, 'finish at once');
    expect(run.status).toBe('completed');
    const seen = rx.got.length;
    await drain();
    // First attempt: 500. The delivery waits for its backoff: draining again sends nothing.
    expect(rx.to('/all')).toHaveLength(1);
    let [d] = await deliveries(hooks.all.id);
    expect(d).toMatchObject({ event_type: 'run.completed', status: 'pending', attempts: 1, last_status_code: 500 });
    expect(d.last_error).toMatch(/^HTTP 500: nope 500/);
    const wait = Date.parse(d.next_attempt_at) - Date.parse(d.updated_at);
    expect(wait).toBeGreaterThanOrEqual(48_000);
    expect(wait).toBeLessThanOrEqual(72_000);
    expect(await drain()).toBe(0);
    expect(rx.got.length).toBe(seen + 1);

    skipped += HOUR;
    await drain();
    [d] = await deliveries(hooks.all.id);
    expect(d).toMatchObject({ status: 'pending', attempts: 2, last_status_code: null });
    expect(d.last_error).toBeTruthy();
    const wait2 = Date.parse(d.next_attempt_at) - Date.parse(d.updated_at);
    expect(wait2).toBeGreaterThanOrEqual(144_000);
    expect(wait2).toBeLessThanOrEqual(216_000);

    skipped += HOUR;
    await drain();
    [d] = await deliveries(hooks.all.id);
    expect(d).toMatchObject({ status: 'succeeded', attempts: 3, last_status_code: 200, last_error: null });
    expect(d.delivered_at).toBeTruthy();
    expect(d.attempt_log.map((a: { status_code: number | null }) => a.status_code)).toEqual([500, null, 200]);

    const sent = rx.to('/all');
    expect(sent).toHaveLength(3);
    for (const r of sent) {
      expect(verify(hooks.all.secret, r.headers, r.body)).toBe(true);
      expect(verify(hooks.failed.secret, r.headers, r.body)).toBe(false);
      expect(r.headers['webhook-id']).toBe(d.id);
      expect(r.headers['content-type']).toBe('application/json');
    }
    // A body altered in transit does not verify.
    expect(verify(hooks.all.secret, sent[2]!.headers, sent[2]!.body.replace('completed', 'failed'))).toBe(false);
    const payload = JSON.parse(sent[2]!.body);
    expect(payload).toEqual({
      id: d.event_id,
      type: 'run.completed',
      created_at: expect.any(String),
      team_id: ctx.team.id,
      data: {
        run_id: run.id,
        session_id: session,
        workspace_id: ws,
        status: 'completed',
        error_code: null,
        links: { run: `/v1/runs/${run.id}`, events: `/v1/runs/${run.id}/events` },
      },
    });
    expect(d.payload).toEqual(payload);
    // Subscribed only to run.failed, or another team's: nothing.
    expect(rx.to('/failed')).toHaveLength(0);
    expect(rx.to('/other').filter((r) => JSON.parse(r.body).type !== 'webhook.test')).toHaveLength(0);

    const replay = await call('POST', `/v1/webhooks/${hooks.all.id}/deliveries/${d.id}/replay`, ctx.team.key);
    expect(replay.status).toBe(202);
    expect(replay.body).toMatchObject({ status: 'pending', attempts: 0, replay_of: d.id, event_id: d.event_id });
    expect(replay.body.id).not.toBe(d.id);
    await drain();
    const again = rx.to('/all').at(-1)!;
    expect(again.body).toBe(sent[2]!.body);
    expect(again.headers['webhook-id']).toBe(replay.body.id);
    expect(verify(hooks.all.secret, again.headers, again.body)).toBe(true);
    const log = await deliveries(hooks.all.id);
    expect(log.map((x) => [x.id, x.status])).toEqual([
      [d.id, 'succeeded'],
      [replay.body.id, 'succeeded'],
    ]);
    const audit = await call('GET', '/v1/audit?limit=100', ctx.team.key);
    expect(audit.body.data.map((e: { action: string }) => e.action)).toContain('webhook.replay');
  });

  it('run.failed and run.requires_action reach exactly the webhooks subscribed to them', async () => {
    const before = { all: rx.to('/all').length, failed: rx.to('/failed').length, other: rx.to('/other').length };
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ status: 500, error: { message: 'boom' } });
    const failed = await converse(ctx.t, ctx.team.key, session, 'fail please');
    expect(failed.run.status).toBe('failed');
    const asking = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print("needs a yes")</python>' });
    const paused = await converse(ctx.t, ctx.team.key, asking.session, 'ask first', PAUSED);
    expect(paused.run.status).toBe('requires_action');
    await drain();

    const toAll = rx
      .to('/all')
      .slice(before.all)
      .map((r) => JSON.parse(r.body));
    expect(toAll.map((p) => p.type).sort()).toEqual(['run.failed', 'run.requires_action']);
    const fail = toAll.find((p) => p.type === 'run.failed');
    expect(fail.data).toMatchObject({ run_id: failed.run.id, status: 'failed', error_code: 'model_unavailable' });
    const pause = toAll.find((p) => p.type === 'run.requires_action');
    const approval = paused.events.find((e) => e.event === 'approval.requested')!.data as { approval_id: string };
    expect(pause.data).toMatchObject({
      run_id: paused.run.id,
      status: 'requires_action',
      approval_id: approval.approval_id,
    });
    expect(JSON.stringify(pause)).not.toContain('needs a yes');
    const toFailed = rx.to('/failed').slice(before.failed);
    expect(toFailed.map((r) => JSON.parse(r.body).data.run_id)).toEqual([failed.run.id]);
    expect(verify(hooks.failed.secret, toFailed[0]!.headers, toFailed[0]!.body)).toBe(true);
    expect(rx.to('/other')).toHaveLength(before.other);
    await call('POST', `/v1/runs/${paused.run.id}/cancel`, ctx.team.key);
  });

  it('evolution.committed and sandbox.oom are delivered to the team\u2019s subscribed webhook only', async () => {
    const before = { all: rx.to('/all').length, failed: rx.to('/failed').length, other: rx.to('/other').length };
    const { ws, session } = await sessionIn(ctx.t, ctx.team, {
      approval: { mode: 'auto' },
      sandbox: { memory_mb: 256, timeout_s: 30 },
    });
    const oom = await exec(
      ctx.t,
      ctx.team.key,
      session,
      'hog = []\nwhile True:\n    hog.append(bytearray(16 * 1024 * 1024))',
    );
    expect(oom.error!.type).toBe('OutOfMemory');

    ctx.fake.script(
      { content: '<python>print(sum([1, 2, 3]))</python>' },
      { content: '<finish>The sum is 6.</finish>' },
    );
    expect((await converse(ctx.t, ctx.team.key, session, 'add 1, 2 and 3')).run.status).toBe('completed');
    const review = await call('POST', `/v1/workspaces/${ws}/review`, ctx.team.key, { session_id: session });
    expect(review.status).toBe(202);
    ctx.fake.script({
      content:
        '<write_file path="skills/sums/SKILL.md">\n---\nname: sums\ndescription: Add numbers with sum()\n---\n\nUse `sum(list)`.\n</write_file>\n<finish>Saved how to add numbers</finish>',
    });
    // The review runs in the jobs' default lane; the deliveries it owes go out in the webhooks lane after it.
    while ((await drain()) > 0);
    const evo = (await call('GET', `/v1/workspaces/${ws}/evolutions/${review.body.id}`, ctx.team.key)).body;
    expect(evo.status).toBe('committed');

    const toAll = rx.to('/all').slice(before.all);
    const types = toAll.map((r) => JSON.parse(r.body).type);
    expect(types.sort()).toEqual(['evolution.committed', 'run.completed', 'sandbox.oom']);
    const byType = (t: string) => JSON.parse(toAll.find((r) => JSON.parse(r.body).type === t)!.body);
    expect(byType('sandbox.oom').data).toMatchObject({
      execution_id: oom.execution_id,
      sandbox_id: oom.sandbox_id,
      session_id: session,
      workspace_id: ws,
      status: 'oom',
      memory_mb: 256,
    });
    expect(byType('evolution.committed').data).toMatchObject({
      evolution_id: review.body.id,
      workspace_id: ws,
      kind: 'review',
      status: 'committed',
      commit_sha: evo.commit_sha,
      links: { evolution: `/v1/workspaces/${ws}/evolutions/${review.body.id}` },
    });
    for (const r of toAll) expect(verify(hooks.all.secret, r.headers, r.body)).toBe(true);
    expect(rx.to('/failed')).toHaveLength(before.failed);
    expect(rx.to('/other')).toHaveLength(before.other);
  });

  it('a platform event (update.applied) goes to every team\u2019s webhooks subscribed to it, each with its own team id', async () => {
    const a = await call('POST', '/v1/webhooks', ctx.team.key, { url: rx.url('/upd-a'), events: ['update.applied'] });
    const b = await call('POST', '/v1/webhooks', other.key, { url: rx.url('/upd-b'), events: ['update.applied'] });
    // The statement self-update writes with the applied row (platform/self-update.ts finishApply).
    const data = { update_id: 'upd_test', status: 'applied', applied_at: new Date().toISOString() };
    await ctx.t.database.db.execute(webhookEventWrite('update.applied', null, data));
    await drain();
    const [ra] = rx.to('/upd-a');
    const [rb] = rx.to('/upd-b');
    expect(JSON.parse(ra!.body)).toMatchObject({ type: 'update.applied', team_id: ctx.team.id, data });
    expect(JSON.parse(rb!.body)).toMatchObject({ type: 'update.applied', team_id: other.id, data });
    expect(verify(a.body.secret, ra!.headers, ra!.body)).toBe(true);
    expect(verify(b.body.secret, rb!.headers, rb!.body)).toBe(true);
    expect(rx.to('/all').filter((r) => JSON.parse(r.body).type === 'update.applied')).toHaveLength(0);
    await call('DELETE', `/v1/webhooks/${a.body.id}`, ctx.team.key);
    await call('DELETE', `/v1/webhooks/${b.body.id}`, other.key);
  });

  it('a 4xx fails a delivery at once; a disabled webhook gets no events; rotate-secret changes the signature', async () => {
    rx.script('/failed', 410);
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ status: 500, error: { message: 'boom' } });
    const { run } = await converse(ctx.t, ctx.team.key, session, 'fail again');
    await drain();
    const last = (await deliveries(hooks.failed.id)).at(-1);
    expect(last).toMatchObject({ status: 'failed', attempts: 1, last_status_code: 410, next_attempt_at: null });
    expect(last.payload.data.run_id).toBe(run.id);

    const rotated = await call('POST', `/v1/webhooks/${hooks.failed.id}/rotate-secret`, ctx.team.key);
    expect(rotated.status).toBe(200);
    expect(rotated.body.secret).toMatch(/^whsec_/);
    expect(rotated.body.secret).not.toBe(hooks.failed.secret);
    const replay = await call('POST', `/v1/webhooks/${hooks.failed.id}/deliveries/${last.id}/replay`, ctx.team.key);
    expect(replay.status).toBe(202);
    await drain();
    const resent = rx.to('/failed').at(-1)!;
    expect(verify(rotated.body.secret, resent.headers, resent.body)).toBe(true);
    expect(verify(hooks.failed.secret, resent.headers, resent.body)).toBe(false);

    const off = await call('PATCH', `/v1/webhooks/${hooks.failed.id}`, ctx.team.key, { enabled: false });
    expect(off.body.enabled).toBe(false);
    const count = rx.to('/failed').length;
    ctx.fake.script({ status: 500, error: { message: 'boom' } });
    await converse(ctx.t, ctx.team.key, session, 'and again');
    await drain();
    expect(rx.to('/failed')).toHaveLength(count);
    expect((await call('POST', `/v1/webhooks/${hooks.failed.id}/test`, ctx.team.key)).status).toBe(409);

    const del = await call('DELETE', `/v1/webhooks/${hooks.failed.id}`, ctx.team.key);
    expect(del.body).toEqual({ id: hooks.failed.id, deleted: true });
    expect((await call('GET', `/v1/webhooks/${hooks.failed.id}`, ctx.team.key)).status).toBe(404);
    expect((await call('GET', `/v1/webhooks/${hooks.failed.id}/deliveries`, ctx.team.key)).status).toBe(404);
  });
});

describe('webhook deliveries survive a restart', () => {
  let primary: TestApp;
  beforeAll(async () => {
    primary = await createTestApp({ sandbox: false, env: ENV, jobsNow });
  });
  afterAll(() => primary?.close());

  it('a delivery owed when the app stops, and one whose receiver was down, arrive after the app comes back', async () => {
    // A port nothing listens on (yet): the receiver is down.
    const probe = await startReceiver();
    const port = probe.port;
    await probe.close();

    let app = await createTestApp({ replicaOf: primary, sandbox: false, env: ENV, jobsNow });
    const team = await app.team('restart');
    const made = await app.call('POST', '/v1/webhooks', {
      key: team.key,
      body: { url: `http://127.0.0.1:${port}/hook`, events: ['run.completed'] },
    });
    expect(made.status).toBe(201);
    const ping = await app.call('POST', `/v1/webhooks/${made.body.id}/test`, { key: team.key });
    expect(ping.status).toBe(202);
    // The app goes away before any attempt.
    await app.close();

    app = await createTestApp({ replicaOf: primary, sandbox: false, env: ENV, jobsNow });
    await app.evolution.jobs.drain();
    const log = async () =>
      (await app.call('GET', `/v1/webhooks/${made.body.id}/deliveries/${ping.body.id}`, { key: team.key })).body;
    const refused = await log();
    expect(refused).toMatchObject({ status: 'pending', attempts: 1, last_status_code: null });
    expect(refused.last_error).toMatch(/ECONNREFUSED/);
    await app.close();

    const rx = await startReceiver(port);
    try {
      app = await createTestApp({ replicaOf: primary, sandbox: false, env: ENV, jobsNow });
      expect(await app.evolution.jobs.drain()).toBe(0); // not due before its backoff
      skipped += HOUR;
      await app.evolution.jobs.drain();
      const done = await log();
      expect(done).toMatchObject({ status: 'succeeded', attempts: 2, last_status_code: 200 });
      expect(done.attempt_log.map((a: { status_code: number | null }) => a.status_code)).toEqual([null, 200]);
      expect(rx.got).toHaveLength(1);
      expect(rx.got[0]!.headers['webhook-id']).toBe(ping.body.id);
      expect(verify(made.body.secret, rx.got[0]!.headers, rx.got[0]!.body)).toBe(true);
      expect(JSON.parse(rx.got[0]!.body)).toMatchObject({ type: 'webhook.test', team_id: team.id });
      await app.close();
    } finally {
      await rx.close();
    }
  });
});

describe('webhooks on PGlite', () => {
  it('an owed event fans out and is delivered, signed, on the embedded database too', async () => {
    const t = await createTestApp({ driver: 'pglite', sandbox: false, env: ENV, jobsNow });
    const rx = await startReceiver();
    try {
      const team = await t.team('pglite-hooks');
      const made = await t.call('POST', '/v1/webhooks', {
        key: team.key,
        body: { url: rx.url('/p'), events: ['sandbox.oom'] },
      });
      expect(made.status).toBe(201);
      await t.database.db.execute(webhookEventWrite('sandbox.oom', team.id, { execution_id: 'exe_x', status: 'oom' }));
      await t.database.db.execute(webhookEventWrite('run.failed', team.id, { run_id: 'run_x' }));
      await t.evolution.jobs.drain();
      expect(rx.got.map((r) => JSON.parse(r.body).type)).toEqual(['sandbox.oom']);
      expect(verify(made.body.secret, rx.got[0]!.headers, rx.got[0]!.body)).toBe(true);
      // Nothing subscribed to run.failed: no job was even queued for it.
      const jobs = await t.database.db.execute(sql`select count(*)::int as n from jobs where kind = 'webhook.event'`);
      expect(rowsOf<{ n: number }>(jobs)[0]!.n).toBe(1);
    } finally {
      await rx.close();
      await t.close();
    }
  });
});

describe('webhooks: one team cannot hold up another team’s deliveries', () => {
  const ctx = useAgentApp('hooks-fair', {
    env: { ...ENV, KILN_WEBHOOK_CONCURRENCY: '4', KILN_WEBHOOK_TEAM_CONCURRENCY: '2' },
  });

  it('a team whose receivers never answer holds at most its share of the workers; the other team’s delivery goes out', async () => {
    const slowTeam = ctx.team;
    const fastTeam = await ctx.t.team('hooks-fast');
    // The slow team's receiver takes every request and answers none until the test lets it.
    const held: ServerResponse[] = [];
    let inFlight = 0;
    let peak = 0;
    let answer = false;
    // The fast team's request and the slow team's second one are in flight together: either may
    // reach its receiver first, so the test waits for both rather than reading `held` when the
    // fast one lands.
    let twoHeld!: () => void;
    const heldTwo = new Promise<void>((r) => (twoHeld = r));
    const silent = createServer((req, res) => {
      req.resume();
      inFlight++;
      peak = Math.max(peak, inFlight);
      res.on('close', () => inFlight--);
      if (answer) res.end('ok');
      else {
        held.push(res);
        if (held.length === 2) twoHeld();
      }
    });
    let fastGot!: () => void;
    const fastArrived = new Promise<void>((r) => (fastGot = r));
    const fast = createServer((req, res) => {
      req.resume();
      res.end('ok');
      fastGot();
    });
    for (const s of [silent, fast]) await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const urlOf = (s: Server) => `http://127.0.0.1:${(s.address() as AddressInfo).port}/hook`;
    let drained: Promise<unknown> | undefined;
    try {
      const make = async (key: string, url: string) => {
        const r = await ctx.t.call('POST', '/v1/webhooks', { key, body: { url, events: ['run.failed'] } });
        expect(r.status).toBe(201);
        return r.body.id as string;
      };
      const slowHooks = [];
      for (let i = 0; i < 5; i++) slowHooks.push(await make(slowTeam.key, urlOf(silent)));
      const fastHook = await make(fastTeam.key, urlOf(fast));
      // The slow team's five pings are owed first, so they are first in line.
      for (const h of slowHooks)
        expect((await ctx.t.call('POST', `/v1/webhooks/${h}/test`, { key: slowTeam.key })).status).toBe(202);
      expect((await ctx.t.call('POST', `/v1/webhooks/${fastHook}/test`, { key: fastTeam.key })).status).toBe(202);

      drained = ctx.t.evolution.jobs.drain();
      await Promise.all([fastArrived, heldTwo]);
      // Delivered while two of the slow team's requests hang, and never more than two at once.
      expect(held).toHaveLength(2);
      expect(peak).toBe(2);

      answer = true;
      for (const res of held.splice(0)) res.end('ok');
      await drained;
      while ((await ctx.t.evolution.jobs.drain()) > 0);
      for (const h of slowHooks) {
        const [d] = (await ctx.t.call('GET', `/v1/webhooks/${h}/deliveries`, { key: slowTeam.key })).body.data;
        expect(d).toMatchObject({ status: 'succeeded' });
      }
      const [f] = (await ctx.t.call('GET', `/v1/webhooks/${fastHook}/deliveries`, { key: fastTeam.key })).body.data;
      expect(f).toMatchObject({ status: 'succeeded', attempts: 1 });
      expect(peak).toBe(2);
    } finally {
      // A failed assertion must not leave the drain running into the app's close.
      answer = true;
      for (const res of held.splice(0)) res.end('ok');
      await drained?.catch(() => undefined);
      for (const s of [silent, fast]) {
        s.closeAllConnections();
        await new Promise<void>((r) => s.close(() => r()));
      }
    }
  });
});
