/**
 * Ecosystem benchmark (`npm run bench:ecosystem`): what MCP, metrics and webhooks cost, each
 * against a baseline measured in the same run. Prints medians, p95 and ratios; never fails on time.
 *
 *  1. MCP overhead: `run_python` and `list_commits` through /mcp (the SDK's own Client on its
 *     Streamable HTTP transport) against POST /v1/sessions/{id}/exec and GET …/commits, same
 *     session, same runtime (runc), alternating call by call.
 *  2. Metrics on the request path: GET /v1/workspaces/{id} with the app's statement timing
 *     listening (as in production) and with its listener taken off the database, alternating in
 *     blocks. (The request-duration histogram has no switch: it is in both series.) Then one
 *     GET /metrics scrape with a few hundred runs and jobs in the database.
 *  3. Webhook latency: an event owed (webhookEventWrite, the statement a run's terminal write
 *     includes) at a random moment → the local receiver has the signed POST, with the job
 *     runner running as in production: the webhook lane polls every KILN_WEBHOOK_POLL_MS (500,
 *     the default), against 2000 (the runner's own poll, which the lane used before it had one).
 *  4. Webhook throughput: 200 owed deliveries to one fast receiver, at KILN_WEBHOOK_CONCURRENCY
 *     8 (the default) and 1.
 *
 * The app runs in process (the server's own compose, on PGlite or, with DATABASE_URL, a new
 * Postgres database) and is served over HTTP on 127.0.0.1; every request below goes over HTTP.
 */
import { createHmac } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadavg } from 'node:os';
import { serve, type ServerType } from '@hono/node-server';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { webhookEventWrite } from '../apps/api/src/webhooks/events.ts';
import { converse } from '../tests/support/agent.ts';
import { createTestApp, type TestApp } from '../tests/support/app.ts';
import { startFakeOpenAI } from '../tests/support/fake-openai.ts';
import { sessionIn } from '../tests/support/sandbox.ts';
import { heading, row, summarize, timeEach, type Summary } from './lib.ts';

const N = Number(process.env.BENCH_N ?? 50);
const GET_N = Number(process.env.BENCH_GET_N ?? 500);
const SCRAPE_N = Number(process.env.BENCH_SCRAPE_N ?? 30);
const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const EVENTS = Number(process.env.BENCH_EVENTS ?? 30);
const DELIVERIES = Number(process.env.BENCH_DELIVERIES ?? 200);
const TEAMS = 8;
const METRICS_TOKEN = 'bench-metrics-token-0123456789abcdef';
const driver = process.env.DATABASE_URL ? 'postgres' : 'pglite';
const out = (line: string) => process.stdout.write(`${line}\n`);
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');

/** Serves an app over HTTP on 127.0.0.1. */
async function listen(t: TestApp): Promise<{ url: string; server: ServerType }> {
  const server = serve({ fetch: t.app.fetch, port: 0, hostname: '127.0.0.1' });
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}
const closeServer = (server: ServerType | Server) => new Promise<void>((resolve) => server.close(() => resolve()));

/**
 * A webhook receiver on 127.0.0.1 that answers 204 at once, checks every signature and calls
 * `onEvent` with the event's body and the moment it was received.
 */
async function startReceiver() {
  const secrets: string[] = [];
  let onEvent: (body: any, at: number) => void = () => {};
  let bad = 0;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const at = performance.now();
      const body = Buffer.concat(chunks).toString();
      const signed = `${req.headers['webhook-id']}.${req.headers['webhook-timestamp']}.${body}`;
      const sigs = String(req.headers['webhook-signature'] ?? '').split(' ');
      const ok = secrets.some((s) => {
        const mac = createHmac('sha256', Buffer.from(s.slice('whsec_'.length), 'base64'))
          .update(signed)
          .digest('base64');
        return sigs.includes(`v1,${mac}`);
      });
      res.writeHead(ok ? 204 : 401).end();
      if (ok) onEvent(JSON.parse(body), at);
      else bad++;
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    secrets,
    bad: () => bad,
    on(fn: (body: any, at: number) => void) {
      onEvent = fn;
    },
    close: () => closeServer(server),
  };
}
type Receiver = Awaited<ReturnType<typeof startReceiver>>;

/** A JSON call over HTTP; throws on a status of 300 or more. */
function caller(url: string) {
  return async (key: string, method: string, path: string, body?: unknown) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text.startsWith('{') ? JSON.parse(text) : text;
  };
}

/** A team of the app with one webhook (subscribed to run.completed) to the receiver; returns the team's id and key. */
async function hookedTeam(t: TestApp, url: string, receiver: Receiver, name: string) {
  const team = await t.team(name);
  const hook = await caller(url)(team.key, 'POST', '/v1/webhooks', { url: receiver.url, events: ['run.completed'] });
  receiver.secrets.push(hook.secret);
  return team;
}

const owe = (teamId: string, seq: number) => webhookEventWrite('run.completed', teamId, { seq });

/**
 * Owes `n` events at moments spread at random over `windowMs` (so each falls at a random phase
 * of the runner's poll); returns each one's time from its committed write to its arrival.
 */
async function latency(t: TestApp, receiver: Receiver, teamId: string, n: number, windowMs: number) {
  const committed = new Map<number, number>();
  const took: number[] = [];
  let done: () => void = () => {};
  const all = new Promise<void>((resolve) => {
    done = resolve;
  });
  receiver.on((body, at) => {
    const t0 = committed.get(body.data.seq);
    if (t0 === undefined) return;
    took.push(at - t0);
    committed.delete(body.data.seq);
    if (took.length === n) done();
  });
  const writes = Array.from({ length: n }, async (_, seq) => {
    await new Promise((r) => setTimeout(r, Math.random() * windowMs));
    await t.database.db.execute(owe(teamId, seq));
    committed.set(seq, performance.now());
  });
  await Promise.all(writes);
  await all;
  return took;
}

/** Owes `n` events (round-robin over `teams`) in one transaction, wakes the runner, and times until all have arrived. */
async function throughput(t: TestApp, receiver: Receiver, teams: string[], n: number) {
  let got = 0;
  let done: () => void = () => {};
  const all = new Promise<void>((resolve) => {
    done = resolve;
  });
  receiver.on(() => {
    if (++got === n) done();
  });
  await t.database.db.transaction(async (tx) => {
    for (let i = 0; i < n; i++) await tx.execute(owe(teams[i % teams.length]!, i));
  });
  let statements = 0;
  const count = t.database.onStatement(() => statements++);
  const t0 = performance.now();
  t.evolution.jobs.wake();
  await all;
  const ms = performance.now() - t0;
  count();
  return { ms, statements: statements / n };
}

/** A fresh app (no sandboxes) with the job runner running, for one webhook figure. */
async function webhookApp(env: Record<string, string>) {
  const t = await createTestApp({ driver, sandbox: false, env: { KILN_OUTBOUND_ALLOW: '127.0.0.1', ...env } });
  const { url, server } = await listen(t);
  await t.evolution.start();
  return {
    t,
    url,
    async close() {
      await closeServer(server);
      await t.close();
    },
  };
}

const rate = (n: number, r: { ms: number; statements: number }) =>
  `${((n / r.ms) * 1000).toFixed(1)} deliveries/s (${(r.ms / 1000).toFixed(2)} s for ${n}; ${r.statements.toFixed(1)} statements each)`;

async function main() {
  const started = performance.now();
  out(`Kiln ecosystem benchmark — database ${driver}, load average at start ${load()}`);
  const fake = await startFakeOpenAI();
  const receiver = await startReceiver();
  const t = await createTestApp({
    driver,
    model: { baseURL: fake.url, model: 'fake-model' },
    env: { KILN_OUTBOUND_ALLOW: '127.0.0.1', KILN_JOBS_POLL_MS: '2000', KILN_METRICS_TOKEN: METRICS_TOKEN },
  });
  const { url, server } = await listen(t);
  const call = caller(url);
  let mcp: Client | undefined;
  let getBaseline: Summary | undefined;
  let tp8 = { ms: Number.NaN, statements: 0 };
  let lat500: Summary = { n: 0, p50: Number.NaN, p95: Number.NaN };
  try {
    const team = await t.team('bench');
    const { ws, session } = await sessionIn(t, team, { sandbox: { runtime: 'runc' } });

    heading(`1. MCP overhead: ${N} calls of each, alternating, after 5 of each to warm up (runtime runc)`);
    mcp = new Client({ name: 'kiln-bench', version: '1' });
    await mcp.connect(
      new StreamableHTTPClientTransport(new URL(`${url}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${team.key}` } },
      }),
    );
    const client = mcp;
    const restExec = async () => {
      const r = await call(team.key, 'POST', `/v1/sessions/${session}/exec`, { code: 'print(1)' });
      if (r.stdout !== '1\n') throw new Error(`exec: ${JSON.stringify(r)}`);
    };
    const mcpExec = async () => {
      const r: any = await client.callTool({
        name: 'run_python',
        arguments: { workspace: ws, session, code: 'print(1)' },
      });
      if (r.isError || r.structuredContent?.stdout !== '1\n') throw new Error(`run_python: ${JSON.stringify(r)}`);
    };
    const restCommits = async () => {
      const r = await call(team.key, 'GET', `/v1/workspaces/${ws}/commits`);
      if (!r.data?.length) throw new Error(`commits: ${JSON.stringify(r)}`);
    };
    const mcpCommits = async () => {
      const r: any = await client.callTool({ name: 'list_commits', arguments: { workspace: ws } });
      if (r.isError) throw new Error(`list_commits: ${JSON.stringify(r)}`);
    };
    const alternate = async (a: () => Promise<void>, b: () => Promise<void>) => {
      for (let i = 0; i < 5; i++) {
        await a();
        await b();
      }
      const as: number[] = [];
      const bs: number[] = [];
      for (let i = 0; i < N; i++) {
        as.push(...(await timeEach(1, a)));
        bs.push(...(await timeEach(1, b)));
      }
      return [summarize(as), summarize(bs)] as const;
    };
    const [execRest, execMcp] = await alternate(restExec, mcpExec);
    out(row('baseline: POST /v1/sessions/{id}/exec print(1)', execRest));
    out(row('MCP run_python print(1), same session', execMcp, execRest));
    out(`  MCP − REST, p50: ${(execMcp.p50 - execRest.p50).toFixed(2)} ms`);
    const [commitsRest, commitsMcp] = await alternate(restCommits, mcpCommits);
    out(row('baseline: GET /v1/workspaces/{id}/commits', commitsRest));
    out(row('MCP list_commits', commitsMcp, commitsRest));
    out(`  MCP − REST, p50: ${(commitsMcp.p50 - commitsRest.p50).toFixed(2)} ms`);

    heading(
      `2. metrics on the request path: GET /v1/workspaces/{id}, ${GET_N} with statement timing, ${GET_N} without`,
    );
    let statements = 0;
    const count = t.database.onStatement(() => statements++);
    const getWs = async () => {
      const r = await call(team.key, 'GET', `/v1/workspaces/${ws}`);
      if (r.id !== ws) throw new Error(`workspace: ${JSON.stringify(r)}`);
    };
    await getWs();
    statements = 0;
    for (let i = 0; i < 10; i++) await getWs();
    count();
    out(`  statements per request: ${(statements / 10).toFixed(1)}`);
    const on: number[] = [];
    const off: number[] = [];
    const block = 50;
    await timeEach(50, getWs);
    for (let i = 0; i < GET_N / block; i++) {
      t.timeStatements(false);
      off.push(...(await timeEach(block, getWs)));
      t.timeStatements(true);
      on.push(...(await timeEach(block, getWs)));
    }
    getBaseline = summarize(off);
    out(row('baseline: statement timing off', getBaseline));
    out(row('statement timing on (production)', summarize(on), getBaseline));

    // Runs for the scrape of 2b, made before the job runner starts (its reviews of idle sessions would take the scripted answers).
    // Ten sessions of RUNS / 10 runs each, side by side (a longer conversation would be condensed: another model call).
    const runner = await t.team('runs');
    const rs = await sessionIn(t, runner);
    fake.script(...Array.from({ length: RUNS }, () => ({ content: '<finish>done</finish>' })));
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        const s = await call(runner.key, 'POST', `/v1/workspaces/${rs.ws}/sessions`, {});
        for (let i = 0; i < RUNS / 10; i++) {
          const { run } = await converse(t, runner.key, s.id, `run ${i}`);
          if (run.status !== 'completed') throw new Error(`run ${i}: ${JSON.stringify(run)}`);
        }
      }),
    );

    heading(`3. webhook latency: owed event → signed POST received, ${EVENTS} events, KILN_WEBHOOK_POLL_MS 500`);
    const hooked = await hookedTeam(t, url, receiver, 'hooks');
    await t.evolution.start();
    lat500 = summarize(await latency(t, receiver, hooked.id, EVENTS, 3000));
    out(row('KILN_WEBHOOK_POLL_MS 500 (default)', lat500));
    out(`  p50 / poll interval: ${(lat500.p50 / 500).toFixed(2)}`);

    heading(`4a. webhook throughput: ${DELIVERIES} owed deliveries over ${TEAMS} teams, KILN_WEBHOOK_CONCURRENCY 8`);
    const teams = [hooked.id];
    for (let i = 1; i < TEAMS; i++) teams.push((await hookedTeam(t, url, receiver, `hooks-${i}`)).id);
    tp8 = await throughput(t, receiver, teams, DELIVERIES);
    out(`  concurrency 8, ${TEAMS} teams: ${rate(DELIVERIES, tp8)}`);
    const tp8one = await throughput(t, receiver, [hooked.id], DELIVERIES);
    out(`  concurrency 8, one team (KILN_WEBHOOK_TEAM_CONCURRENCY 2): ${rate(DELIVERIES, tp8one)}`);

    heading(`2b. GET /metrics with ${RUNS} runs and the jobs above in the database, ${SCRAPE_N} scrapes`);
    let bytes = 0;
    const scrape = async () => {
      const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
      const text = await res.text();
      if (res.status !== 200 || !text.includes('kiln_'))
        throw new Error(`metrics: ${res.status} ${text.slice(0, 200)}`);
      bytes = text.length;
    };
    const scrapes = summarize(await timeEach(SCRAPE_N, scrape, 3));
    out(row('baseline: GET /v1/workspaces/{id} (section 2)', getBaseline));
    out(row(`GET /metrics (${(bytes / 1024).toFixed(0)} KiB)`, scrapes, getBaseline));
    out(`  load average: ${load()}`);
  } finally {
    await mcp?.close();
    await closeServer(server);
    await t.close();
  }

  heading(`3b. webhook latency, ${EVENTS} events, KILN_WEBHOOK_POLL_MS 2000 (the runner's poll; a new app)`);
  const slow = await webhookApp({ KILN_WEBHOOK_POLL_MS: '2000' });
  let lat2000: Summary;
  try {
    const team = await hookedTeam(slow.t, slow.url, receiver, 'hooks');
    lat2000 = summarize(await latency(slow.t, receiver, team.id, EVENTS, 10_000));
    out(row('KILN_WEBHOOK_POLL_MS 2000', lat2000));
    out(`  p50 / poll interval: ${(lat2000.p50 / 2000).toFixed(2)}`);
    out(`  poll 500 / poll 2000, p50: ${(lat500.p50 / lat2000.p50).toFixed(2)}×`);
  } finally {
    await slow.close();
  }

  heading(
    `4b. webhook throughput, ${DELIVERIES} deliveries over ${TEAMS} teams, KILN_WEBHOOK_CONCURRENCY 1 (a new app)`,
  );
  const one = await webhookApp({ KILN_WEBHOOK_CONCURRENCY: '1' });
  try {
    const teams: string[] = [];
    for (let i = 0; i < TEAMS; i++) teams.push((await hookedTeam(one.t, one.url, receiver, `hooks-${i}`)).id);
    const tp1 = await throughput(one.t, receiver, teams, DELIVERIES);
    out(`  concurrency 1, ${TEAMS} teams: ${rate(DELIVERIES, tp1)}`);
    out(`  concurrency 8 / concurrency 1, deliveries per second: ${(tp1.ms / tp8.ms).toFixed(2)}×`);
  } finally {
    await one.close();
  }
  if (receiver.bad()) throw new Error(`${receiver.bad()} requests with a bad signature`);
  await receiver.close();
  await fake.close();
  out(`\nload average at the end ${load()}; ${((performance.now() - started) / 1000).toFixed(0)} s in all\n`);
}

main().catch((err) => {
  process.stderr.write(`${err.stack ?? err}\n`);
  process.exit(1);
});
