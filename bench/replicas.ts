/**
 * Replica benchmark (`npm run bench:replicas`): what a request costs when it reaches the replica
 * that does not hold the session's sandbox and is sent on to the one that does
 * (apps/api/src/http/replicas.ts). Prints figures, never fails on time.
 *
 * Two servers, each its own process, on one Postgres database (made for the run and dropped at
 * its end; DATABASE_URL's server, default the local one) and one workspaces directory, as two
 * `npm start` replicas behind a load balancer. One session whose sandbox A holds:
 *
 *  1. warm exec of print(1) sent to A (the holder) and to B (sent on to A), in alternating blocks
 *  2. the same with one server alone on its own database (no other replica: nothing is looked up),
 *     as the single-machine baseline
 *  3. a holder that dies: a third replica C holds BENCH_TAKEOVER_N gVisor sessions, each with a
 *     variable, and is killed (SIGKILL); once B no longer hears from it (15 s), each session's
 *     first exec at B (B takes the running sandbox over: the variable is still there), against a
 *     new gVisor session's first exec at B (what every one of them got before: a new sandbox,
 *     its state gone)
 *
 * BENCH_N (execs per path, 200) and BENCH_TAKEOVER_N (sessions, 6; 0 skips section 3) change the sizes.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { createPgDatabase, dropPgDatabase } from '../tests/support/db.ts';
import { type KilnProcess, startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, row, summarize, timeEach } from './lib.ts';

const N = Number(process.env.BENCH_N ?? 200);
const TAKEOVER_N = Number(process.env.BENCH_TAKEOVER_N ?? 6);
const BLOCK = 25;
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
const KEY = '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'.replace(/./g, () =>
  Math.floor(Math.random() * 16).toString(16),
);

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-bench-replicas-'));
  const shared = await createPgDatabase();
  const alone = await createPgDatabase();
  const adminKey = generateKey('admin');
  const common = {
    KILN_ADMIN_KEY: adminKey,
    KILN_SECRETS_KEY: KEY,
    KILN_WORKSPACES_DIR: join(dir, 'workspaces'),
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_SANDBOX_PREPARED_POOL_SIZE: '0',
    KILN_RATE_LIMIT_PER_MINUTE: '1000000',
    KILN_RATE_LIMIT_BURST: '1000000',
    KILN_SANDBOX_IMAGE: image,
    KILN_LOG_LEVEL: 'warn',
  };
  const servers: KilnProcess[] = [];
  const start = async (name: string, db: string, workspaces = common.KILN_WORKSPACES_DIR) => {
    const s = await startKiln({
      ...common,
      DATABASE_URL: db,
      KILN_WORKSPACES_DIR: workspaces,
      KILN_DATA_DIR: join(dir, name),
      KILN_INSTANCE_ID: `bench-${name}-${process.pid}`,
    });
    servers.push(s);
    return s;
  };
  try {
    const a = await start('a', shared);
    const b = await start('b', shared);
    const single = await start('single', alone, join(dir, 'single-workspaces'));
    // Each replica reads who else is up at its heartbeat (every 5 s): until then it is alone.
    const heard = Date.now() + 6000;

    const session = async (url: string) => {
      const call = apiCaller(() => url);
      const team = await call(adminKey, 'POST', '/v1/teams', { name: `bench-${Math.random()}` });
      const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'b', role: 'owner' });
      const ws = await call(key, 'POST', '/v1/workspaces', { name: 'w', settings: { sandbox: { runtime: 'runc' } } });
      const s = (await call(key, 'POST', `/v1/workspaces/${ws.id}/sessions`, {})).id as string;
      await call(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });
      return { key, s };
    };
    const held = await session(a.url);
    const lone = await session(single.url);
    await new Promise((r) => setTimeout(r, Math.max(0, heard - Date.now())));
    const exec = (url: string, key: string, s: string) => async () => {
      const r = await apiCaller(() => url)(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });
      if (r.stdout !== '1\n') throw new Error(`unexpected answer: ${JSON.stringify(r)}`);
    };
    // The first call through B proves it is sent on: it answers from A's sandbox.
    const via = await apiCaller(() => b.url)(held.key, 'POST', `/v1/sessions/${held.s}/exec`, { code: 'print(1)' });
    const direct = await apiCaller(() => a.url)(held.key, 'POST', `/v1/sessions/${held.s}/exec`, { code: 'print(1)' });
    if (via.sandbox_id !== direct.sandbox_id) throw new Error('B did not send the request on to the holder');

    heading(`warm exec of print(1), ${N} per path, in alternating blocks of ${BLOCK} (runc, Postgres)`);
    const samples: Record<'holder' | 'other' | 'single', number[]> = { holder: [], other: [], single: [] };
    const paths = {
      holder: exec(a.url, held.key, held.s),
      other: exec(b.url, held.key, held.s),
      single: exec(single.url, lone.key, lone.s),
    };
    for (let done = 0; done < N; done += BLOCK)
      for (const which of ['holder', 'other', 'single'] as const)
        samples[which].push(...(await timeEach(Math.min(BLOCK, N - done), paths[which], 2)));
    const holder = summarize(samples.holder);
    const single1 = summarize(samples.single);
    process.stdout.write(`${row('one server alone (baseline)', single1)}\n`);
    process.stdout.write(`${row('replica A, which holds the sandbox', holder, single1)}\n`);
    process.stdout.write(`${row('replica B, sent on to A', summarize(samples.other), holder)}\n`);
    process.stdout.write(
      "  (A's ratio is against the server alone: the holder's own lookup; B's is against A: the hop)\n",
    );
    if (TAKEOVER_N > 0) await takeover(b.url, adminKey, () => start('c', shared));
  } finally {
    for (const s of servers) s.child.kill('SIGTERM');
    await Promise.all(servers.map((s) => s.exited));
    await dropPgDatabase(shared);
    await dropPgDatabase(alone);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Section 3: a replica killed while it holds gVisor sessions; their next exec at B takes them over. */
async function takeover(bUrl: string, adminKey: string, startC: () => Promise<KilnProcess>): Promise<void> {
  const c = await startC();
  const callC = apiCaller(() => c.url);
  const callB = apiCaller(() => bUrl);
  const team = await callC(adminKey, 'POST', '/v1/teams', { name: `bench-takeover-${Math.random()}` });
  const { key } = await callC(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'b', role: 'owner' });
  const ws = await callC(key, 'POST', '/v1/workspaces', { name: 'w', settings: { sandbox: { runtime: 'gvisor' } } });
  const sessions: string[] = [];
  for (let i = 0; i < TAKEOVER_N; i++) {
    const s = (await callC(key, 'POST', `/v1/workspaces/${ws.id}/sessions`, {})).id as string;
    await callC(key, 'POST', `/v1/sessions/${s}/exec`, { code: `kept = ${i}` });
    sessions.push(s);
  }
  c.child.kill('SIGKILL');
  await c.exited;
  // B stops hearing from C 15 s after C's last heartbeat (every 5 s), at B's next heartbeat.
  await new Promise((r) => setTimeout(r, 21_000));
  heading(`a holder killed with ${TAKEOVER_N} gVisor sessions: their first exec at another replica`);
  const taken: number[] = [];
  for (const [i, s] of sessions.entries()) {
    const t0 = performance.now();
    const r = await callB(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(kept)' });
    taken.push(performance.now() - t0);
    if (r.stdout !== `${i}\n` || r.restarted) throw new Error(`not taken over: ${JSON.stringify(r)}`);
  }
  const fresh: number[] = [];
  for (let i = 0; i < TAKEOVER_N; i++) {
    const s = (await callB(key, 'POST', `/v1/workspaces/${ws.id}/sessions`, {})).id as string;
    const t0 = performance.now();
    await callB(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });
    fresh.push(performance.now() - t0);
    await callB(key, 'DELETE', `/v1/sessions/${s}`);
  }
  for (const s of sessions) await callB(key, 'DELETE', `/v1/sessions/${s}`);
  const baseline = summarize(fresh);
  process.stdout.write(`${row('a new gVisor session, first exec (baseline)', baseline)}\n`);
  process.stdout.write(`${row('a dead holder’s session, taken over, variables kept', summarize(taken), baseline)}\n`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
