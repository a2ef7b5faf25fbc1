import { randomBytes } from 'node:crypto';
import { sql } from 'drizzle-orm';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../apps/api/src/config.ts';
import { ConfigError } from '../../apps/api/src/lib/errors.ts';
import { statementKind } from '../../apps/api/src/db/statements.ts';
import { JobRunner } from '../../apps/api/src/jobs/runner.ts';
import { KilnMetrics } from '../../apps/api/src/metrics/metrics.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { createTestDatabase, DRIVERS, rowsOf } from '../support/db.ts';
import { exec, sessionIn } from '../support/sandbox.ts';
import { callMcpTool } from '../support/mcp.ts';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of Prometheus's text format (what prom-client writes): `name{a="b",…} value`. */
function parse(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
      labels[l[1]!] = l[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    samples.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return samples;
}

/** One scrape, parsed: `get(name, labels)` sums the samples of that name whose labels include those given. */
class Scrape {
  readonly samples: Sample[];
  constructor(readonly text: string) {
    this.samples = parse(text);
  }
  has(name: string, labels: Record<string, string> = {}): boolean {
    return this.matching(name, labels).length > 0;
  }
  get(name: string, labels: Record<string, string> = {}): number {
    return this.matching(name, labels).reduce((sum, s) => sum + s.value, 0);
  }
  private matching(name: string, labels: Record<string, string>) {
    return this.samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  }
}

const TOKEN = `metrics-${randomBytes(16).toString('hex')}`;

async function scrape(t: TestApp, key = TOKEN): Promise<Scrape> {
  const r = await t.app.request('/metrics', { headers: { authorization: `Bearer ${key}` } });
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return new Scrape(await r.text());
}

/** The difference of one series between two scrapes. */
const moved = (before: Scrape, after: Scrape, name: string, labels: Record<string, string> = {}) =>
  after.get(name, labels) - before.get(name, labels);

describe('GET /metrics (Prometheus)', () => {
  const ctx = useAgentApp('metrics', { env: { KILN_METRICS_TOKEN: TOKEN } });
  const auto = { approval: { mode: 'auto' } };

  it('answers KILN_METRICS_TOKEN and org-admin keys; no key or an unknown one is 401, a team key 403', async () => {
    const { t, team } = ctx;
    const none = await t.call('GET', '/metrics');
    expect(none.status).toBe(401);
    expect(none.body.error).toMatchObject({ code: 'unauthorized', request_id: expect.any(String) });
    const wrong = await t.call('GET', '/metrics', { key: `${TOKEN}x` });
    expect(wrong.status).toBe(401);
    expect(wrong.body.error.code).toBe('unauthorized');
    const teamKey = await t.call('GET', '/metrics', { key: team.key });
    expect(teamKey.status).toBe(403);
    expect(teamKey.body.error).toMatchObject({ code: 'forbidden' });
    expect(teamKey.body.error.message).toContain('org-admin key');
    const viewer = await t.team('metrics-viewer', 'viewer');
    expect((await t.call('GET', '/metrics', { key: viewer.key })).status).toBe(403);

    const byToken = await scrape(t, TOKEN);
    const byAdmin = await scrape(t, t.adminKey);
    for (const s of [byToken, byAdmin]) {
      expect(s.text).toContain('# TYPE kiln_http_request_duration_seconds histogram');
      expect(s.text).toContain('# TYPE kiln_runs gauge');
      // prom-client's process metrics, on this app's registry.
      expect(s.has('process_cpu_user_seconds_total')).toBe(true);
      expect(s.has('nodejs_eventloop_lag_seconds')).toBe(true);
    }
    // The 403 was observed under the route's pattern, like any request.
    expect(byAdmin.get('kiln_http_request_duration_seconds_count', { route: '/metrics', status: '403' })).toBe(2);
  });

  it('is in the OpenAPI document with its operationId, bearer security and 401/403', async () => {
    const doc = (await ctx.t.call('GET', '/openapi.json')).body;
    const op = doc.paths['/metrics'].get;
    expect(op).toMatchObject({ operationId: 'getMetrics', security: [{ bearer: [] }] });
    expect(Object.keys(op.responses['200'].content)).toEqual(['text/plain']);
    expect(Object.keys(op.responses)).toEqual(expect.arrayContaining(['200', '401', '403']));
  });

  it('counts HTTP requests by method, route pattern and status; an unknown path is "unmatched"', async () => {
    const { t, team } = ctx;
    const { ws, session } = await sessionIn(t, team);
    const before = await scrape(t);
    const N = 7;
    for (let i = 0; i < N; i++)
      expect((await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).status).toBe(200);
    expect((await t.call('GET', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    // Another team's workspace is a 404 under the same pattern.
    const other = await t.team('metrics-other');
    expect((await t.call('GET', `/v1/workspaces/${ws}`, { key: other.key })).status).toBe(404);
    // No key at all: a 401 of the route it was for.
    expect((await t.call('GET', `/v1/workspaces/${ws}`)).status).toBe(401);
    expect((await t.call('GET', `/no/such/${ws}`, { key: team.key })).status).toBe(404);
    expect((await t.call('PROPFIND', '/v1/workspaces', { key: team.key })).status).toBe(404);
    const after = await scrape(t);

    const count = 'kiln_http_request_duration_seconds_count';
    const route = '/v1/workspaces/:workspace';
    expect(moved(before, after, count, { method: 'GET', route, status: '200' })).toBe(N);
    expect(moved(before, after, count, { method: 'GET', route, status: '404' })).toBe(1);
    expect(moved(before, after, count, { method: 'GET', route, status: '401' })).toBe(1);
    expect(moved(before, after, count, { method: 'GET', route: '/v1/sessions/:session', status: '200' })).toBe(1);
    expect(moved(before, after, count, { method: 'GET', route: 'unmatched', status: '404' })).toBe(1);
    expect(moved(before, after, count, { method: 'other', route: 'unmatched', status: '404' })).toBe(1);
    // The buckets agree with the count: every request is in +Inf, and the sum of seconds grew.
    const bucket = { method: 'GET', route, status: '200', le: '+Inf' };
    expect(moved(before, after, 'kiln_http_request_duration_seconds_bucket', bucket)).toBe(N);
    expect(moved(before, after, 'kiln_http_request_duration_seconds_sum', { route, status: '200' })).toBeGreaterThan(0);

    // Route labels are patterns: no id (nor the unknown path) reaches a label value.
    expect(after.text).not.toContain(ws);
    expect(after.text).not.toContain(session);
    const routes = new Set(after.samples.flatMap((s) => (s.labels.route ? [s.labels.route] : [])));
    for (const r of routes) expect(r === 'unmatched' || !/[a-z]+_[0-9a-z]{8,}/.test(r), r).toBe(true);
    expect(routes).toContain('/v1/workspaces');
  });

  it('counts an MCP tool call once, as the /mcp request, not also the /v1 calls its tool makes in-process', async () => {
    const { t, team } = ctx;
    const { ws } = await sessionIn(t, team);
    const before = await scrape(t);
    const r = await callMcpTool(t.app, team.key, 'list_commits', { workspace: ws });
    expect(r.status).toBe(200);
    expect(await r.text()).toContain('"workspace_id"');
    const after = await scrape(t);
    const count = 'kiln_http_request_duration_seconds_count';
    expect(moved(before, after, count, { method: 'POST', route: '/mcp', status: '200' })).toBe(1);
    // The tool read the workspace's commits through /v1: those inner requests are not requests of their own.
    expect(moved(before, after, count, { route: '/v1/workspaces/:workspace/commits' })).toBe(0);
    expect(moved(before, after, count, { route: '/v1/workspaces/:workspace' })).toBe(0);
  });

  it('times database statements by driver and kind', async () => {
    const { t, team } = ctx;
    const before = await scrape(t);
    const created = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'metrics-db' } });
    expect(created.status).toBe(201);
    const after = await scrape(t);
    const count = 'kiln_db_statement_duration_seconds_count';
    // Background work (leases, timers) may add statements: at least the request's own are there.
    expect(moved(before, after, count, { driver: 'postgres', kind: 'insert' })).toBeGreaterThanOrEqual(1);
    expect(moved(before, after, count, { driver: 'postgres', kind: 'select' })).toBeGreaterThanOrEqual(1);
    expect(after.has(count, { driver: 'pglite' })).toBe(false);

    expect(statementKind('select 1')).toBe('select');
    expect(statementKind(' (SELECT 1) union all (select 2)')).toBe('select');
    expect(statementKind('insert into "runs" values ($1)')).toBe('insert');
    expect(statementKind('with w0 as (update runs set steps = 1) insert into usage values ($1)')).toBe('update');
    expect(statementKind('with calls as (select 1) select * from calls')).toBe('select');
    expect(statementKind('delete from jobs')).toBe('delete');
    expect(statementKind('begin')).toBe('other');
  });

  it('counts sandbox executions, timeouts and OOM kills, and shows sandboxes by state from the database', async () => {
    const { t, team } = ctx;
    const { session } = await sessionIn(t, team, {
      sandbox: { runtime: 'runc', memory_mb: 256, pids: 64, disk_mb: 64, timeout_s: 30 },
    });
    const before = await scrape(t);
    expect((await exec(t, team.key, session, 'print(1)')).stdout).toBe('1\n');
    expect((await exec(t, team.key, session, 'x = 2')).error).toBeUndefined();
    const slow = await exec(t, team.key, session, 'import time\ntime.sleep(30)', 1);
    expect(slow.error!.type).toBe('Timeout');
    const hog = await exec(t, team.key, session, 'hog = []\nwhile True:\n    hog.append(bytearray(16 * 1024 * 1024))');
    expect(hog.error!.type).toBe('OutOfMemory');
    expect((await exec(t, team.key, session, 'print(3)')).stdout).toBe('3\n');
    const after = await scrape(t);

    const runc = { runtime: 'runc' };
    expect(moved(before, after, 'kiln_sandbox_execution_duration_seconds_count', runc)).toBe(5);
    expect(moved(before, after, 'kiln_sandbox_execution_timeouts_total', runc)).toBe(1);
    expect(moved(before, after, 'kiln_sandbox_oom_kills_total', runc)).toBe(1);
    expect(moved(before, after, 'kiln_sandbox_oom_kills_total', { runtime: 'gvisor' })).toBe(0);

    const [row] = rowsOf<{ ready: number; starting: number }>(
      await t.database.db.execute(sql`select count(*) filter (where state = 'ready')::int as ready,
        count(*) filter (where state = 'starting')::int as starting from sandboxes`),
    );
    expect(row!.ready).toBeGreaterThanOrEqual(1);
    // This session's sandbox, started by its first execution.
    expect(moved(before, after, 'kiln_sandboxes', { state: 'ready' })).toBe(1);
    expect(after.get('kiln_sandboxes', { state: 'ready' })).toBe(row!.ready);
    expect(after.get('kiln_sandboxes', { state: 'starting' })).toBe(row!.starting);
    expect(after.has('kiln_sandboxes', { state: 'removed' })).toBe(false);
    // The test apps keep no warm pool.
    expect(after.get('kiln_sandbox_pool_warm')).toBe(0);
  });

  it('counts a scripted run’s steps, its tokens by model and kind and its model calls; runs by status come from the database', async () => {
    const { t, team, fake } = ctx;
    const { session } = await sessionIn(t, team, auto);
    const before = await scrape(t);
    fake.script(
      {
        content: '<thinking>Compute.</thinking><python>print(6 * 7)</python>',
        usage: { prompt_tokens: 11, completion_tokens: 3 },
      },
      {
        content: '<thinking>Again.</thinking><python>print(7 * 7)</python>',
        usage: { prompt_tokens: 13, completion_tokens: 5 },
      },
      { content: '<finish>42 and 49</finish>', usage: { prompt_tokens: 17, completion_tokens: 7 } },
    );
    const { run } = await converse(t, team.key, session, 'Compute two products');
    expect(run).toMatchObject({ status: 'completed', steps: 3 });

    // A model that fails: one call, one error, no tokens; the run fails.
    const { session: second } = await sessionIn(t, team, auto);
    fake.script({ status: 500, error: { message: 'boom' } });
    const failed = await converse(t, team.key, second, 'hello');
    expect(failed.run).toMatchObject({ status: 'failed', steps: 1, error: { code: 'model_unavailable' } });
    const after = await scrape(t);

    const model = { model: 'fake-model' };
    expect(moved(before, after, 'kiln_run_steps_total')).toBe(4);
    expect(moved(before, after, 'kiln_model_tokens_total', { ...model, kind: 'prompt' })).toBe(11 + 13 + 17);
    expect(moved(before, after, 'kiln_model_tokens_total', { ...model, kind: 'completion' })).toBe(3 + 5 + 7);
    expect(moved(before, after, 'kiln_model_request_duration_seconds_count', model)).toBe(4);
    expect(moved(before, after, 'kiln_model_request_errors_total', { ...model, code: 'model_unavailable' })).toBe(1);
    expect(moved(before, after, 'kiln_sandbox_execution_duration_seconds_count', { runtime: 'runc' })).toBe(2);

    const counts = rowsOf<{ status: string; n: number }>(
      await t.database.db.execute(sql`select status, count(*)::int as n from runs group by status`),
    );
    const inDb = Object.fromEntries(counts.map((c) => [c.status, Number(c.n)]));
    expect(inDb.completed).toBeGreaterThanOrEqual(1);
    expect(inDb.failed).toBeGreaterThanOrEqual(1);
    for (const status of ['queued', 'in_progress', 'requires_action', 'completed', 'failed', 'cancelled'])
      expect(after.get('kiln_runs', { status }), status).toBe(inDb[status] ?? 0);
    expect(moved(before, after, 'kiln_runs', { status: 'completed' })).toBe(1);
    expect(moved(before, after, 'kiln_runs', { status: 'failed' })).toBe(1);

    // A replica on the same database tells the same runs (read at scrape time), but counted no steps of its own.
    const replica = await createTestApp({ replicaOf: t, env: { KILN_METRICS_TOKEN: TOKEN } });
    try {
      const there = await scrape(replica);
      for (const status of ['completed', 'failed', 'in_progress'])
        expect(there.get('kiln_runs', { status }), status).toBe(after.get('kiln_runs', { status }));
      expect(there.get('kiln_run_steps_total')).toBe(0);
      expect(there.has('kiln_model_tokens_total')).toBe(false);
    } finally {
      await replica.close();
    }
  });

  it('shows jobs queued, running and failed from the jobs table', async () => {
    const { t } = ctx;
    const runner = new JobRunner(
      t.database.db,
      { instance: 'metrics-test', pollMs: 60_000, leaseMs: 60_000 },
      pino({ level: 'silent' }),
    );
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    runner.handle<{ do: 'fail' | 'hold' }>('metrics-test', async (p) => {
      if (p.do === 'fail') throw new Error('this job fails');
      started();
      await held;
    });
    const before = await scrape(t);
    const later = new Date(Date.now() + 3_600_000);
    await runner.enqueue('metrics-test', { do: 'hold' }, { runAt: later });
    await runner.enqueue('metrics-test', { do: 'hold' }, { runAt: later });
    await runner.enqueue('metrics-test', { do: 'fail' }, { maxAttempts: 1 });
    expect(await runner.drain()).toBe(1);
    await runner.enqueue('metrics-test', { do: 'hold' });
    const draining = runner.drain();
    await running;
    const during = await scrape(t);
    release();
    expect(await draining).toBe(1);
    const after = await scrape(t);

    expect(moved(before, during, 'kiln_jobs', { status: 'queued' })).toBe(2);
    expect(moved(before, during, 'kiln_jobs', { status: 'running' })).toBe(1);
    expect(moved(before, during, 'kiln_jobs', { status: 'failed' })).toBe(1);
    expect(moved(before, after, 'kiln_jobs', { status: 'running' })).toBe(0);
    expect(after.has('kiln_jobs', { status: 'succeeded' })).toBe(false);
  });

  it('folds model names past the cap into "other", so tenants cannot grow the label set', async () => {
    const m = new KilnMetrics({
      db: ctx.t.database.db,
      log: pino({ level: 'silent' }),
      models: ['default'],
      maxModels: 3,
      processMetrics: false,
    });
    const usage = { usage: { promptTokens: 1, completionTokens: 1 } };
    for (const name of ['default', 'a', 'b', 'c', 'd', 'a', 'x'.repeat(101)]) m.modelCall(name, 5, usage);
    const s = new Scrape(await m.scrape());
    const models = new Set(s.samples.filter((x) => x.name === 'kiln_model_tokens_total').map((x) => x.labels.model));
    expect(models).toEqual(new Set(['default', 'a', 'b', 'other']));
    expect(s.get('kiln_model_tokens_total', { model: 'other', kind: 'prompt' })).toBe(3);
    expect(s.get('kiln_model_tokens_total', { model: 'a', kind: 'prompt' })).toBe(2);
    // A registry of its own: the app's series are not in it, nor its in the app's.
    expect(s.has('kiln_http_request_duration_seconds_count')).toBe(false);
    expect((await scrape(ctx.t)).has('kiln_model_tokens_total', { model: 'default' })).toBe(false);
  });
});

describe('GET /metrics of an app with a warm pool, on PGlite, whose database goes away', () => {
  let t: TestApp;
  beforeAll(async () => {
    // The pool without fair share: warm containers for any team (with it, tests/integration/sandbox-fair-share.test.ts).
    t = await createTestApp({
      driver: 'pglite',
      sandbox: { poolSize: 1 },
      env: { KILN_METRICS_TOKEN: TOKEN, KILN_SANDBOX_FAIR_SHARE: 'off' },
    });
    await t.engine.poolSettled();
  });
  afterAll(() => t.close());

  it('shows the warm pool, times PGlite statements, and still answers (with a scrape error) when the database is down', async () => {
    const up = await scrape(t);
    expect(up.get('kiln_sandbox_pool_warm')).toBe(1);
    expect(up.get('kiln_db_statement_duration_seconds_count', { driver: 'pglite' })).toBeGreaterThan(0);
    expect(up.get('kiln_scrape_errors_total', { source: 'database' })).toBe(0);
    expect(up.get('kiln_runs', { status: 'completed' })).toBe(0);

    await t.database.close();
    const down = await scrape(t);
    expect(down.get('kiln_scrape_errors_total', { source: 'database' })).toBe(1);
    // The gauges read from the database are left out; what this process knows is still there.
    expect(down.has('kiln_runs')).toBe(false);
    expect(down.has('kiln_jobs')).toBe(false);
    expect(down.get('kiln_sandbox_pool_warm')).toBe(1);
    expect(down.get('kiln_http_request_duration_seconds_count', { route: '/metrics', status: '200' })).toBe(1);
  });
});

describe.each(DRIVERS)('statement timings on %s', (driver) => {
  it('tell every statement once, in transactions and savepoints and when it fails, and none after unsubscribing', async () => {
    const d = await createTestDatabase(driver);
    try {
      const seen: string[] = [];
      const off = d.onStatement((drv, kind, s) => {
        expect(drv).toBe(driver);
        expect(s).toBeGreaterThanOrEqual(0);
        seen.push(kind);
      });
      await d.db.execute(sql`select 1`);
      await d.db.transaction(async (tx) => {
        await tx.execute(sql`insert into jobs (id, kind, payload) values ('job_metrics1', 'k', '{}'::jsonb)`);
        await tx.execute(sql`update jobs set attempts = 1 where id = 'job_metrics1'`);
        await tx.transaction(async (sp) => {
          await sp.execute(
            sql`with gone as (delete from jobs where id = 'job_metrics1' returning id) select count(*) from gone`,
          );
        });
      });
      await expect(d.db.execute(sql`select * from no_such_table`)).rejects.toThrow(/no_such_table/);
      off();
      await d.db.execute(sql`select 2`);
      // postgres.js opens savepoints itself; drizzle sends PGlite's as statements.
      const savepoint = driver === 'pglite' ? ['other'] : [];
      expect(seen).toEqual(['select', 'insert', 'update', ...savepoint, 'delete', ...savepoint, 'select']);
    } finally {
      await d.drop();
    }
  });
});

describe('KILN_METRICS_TOKEN', () => {
  it('is optional, at least 16 printable characters without spaces, and never echoed when wrong', () => {
    expect(loadConfig({}).metrics.token).toBeUndefined();
    expect(loadConfig({ KILN_METRICS_TOKEN: TOKEN }).metrics.token).toBe(TOKEN);
    for (const bad of ['short-secret', 'sixteen chars with spaces']) {
      let problems: string[] = [];
      try {
        loadConfig({ KILN_METRICS_TOKEN: bad });
      } catch (err) {
        if (err instanceof ConfigError) problems = err.problems;
      }
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^KILN_METRICS_TOKEN: .*\(value hidden\)$/);
      expect(problems[0]).not.toContain(bad);
    }
  });
});
