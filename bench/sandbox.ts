/**
 * Sandbox benchmark (`npm run bench:sandbox`): prints figures, never fails on time.
 *
 *  1. warm exec of print(1) through the HTTP API vs `docker exec python3 -c` through dockerode
 *  2. cold session start to first result vs a bare create+start+wait (`docker run --rm`)
 *  3. throughput of trivial execs across 16 concurrent sessions
 *  4. runc and gVisor side by side: warm exec, cold start and throughput per runtime, gvisor/runc
 *  5. first exec of a new session by workspace size, 0-512 MB (bench/sandbox-workspace.ts)
 *
 * Sections 1–3 run in runc (their baselines are runc containers); section 4 needs gVisor
 * registered with dockerd (infra/docker.sh, which `npm run bench:sandbox` runs first).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { connectDocker } from '../apps/api/src/sandbox/docker/connect.ts';
import { startKiln } from '../tests/support/server.ts';
import { firstExecBySize } from './sandbox-workspace.ts';
import { apiCaller, heading, row, type Summary, summarize, timeEach } from './lib.ts';

const N = Number(process.env.BENCH_N ?? 200);
const COLD_N = Number(process.env.BENCH_COLD_N ?? 15);
const THROUGHPUT_S = Number(process.env.BENCH_THROUGHPUT_S ?? 5);
const docker = connectDocker(process.env.DOCKER_HOST);
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';

async function dockerExecBaseline(): Promise<number[]> {
  const c = await docker.createContainer({
    Image: image,
    Cmd: ['sleep', 'infinity'],
    HostConfig: { NetworkMode: 'none' },
  });
  await c.start();
  try {
    return await timeEach(
      N,
      async () => {
        const e = await c.exec({ Cmd: ['python3', '-c', 'print(1)'], AttachStdout: true, AttachStderr: true });
        const stream = await e.start({});
        await new Promise((resolve) => {
          stream.on('end', resolve);
          stream.resume();
        });
      },
      5,
    );
  } finally {
    await c.remove({ force: true });
  }
}

async function dockerRunBaseline(): Promise<number[]> {
  return timeEach(
    COLD_N,
    async () => {
      const c = await docker.createContainer({
        Image: image,
        Cmd: ['python3', '-c', 'print(1)'],
        HostConfig: { NetworkMode: 'none' },
      });
      await c.start();
      await c.wait();
      await c.remove({ force: true });
    },
    2,
  );
}

async function main() {
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-'));
  const adminKey = generateKey('admin');
  // The server runs as its own process, as in production; this process is only the client.
  const boot = (poolSize: number, instance: string, runtimes?: string) =>
    startKiln({
      ...(runtimes ? { KILN_SANDBOX_RUNTIMES: runtimes } : {}),
      KILN_DATA_DIR: dataDir,
      KILN_ADMIN_KEY: adminKey,
      ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
      KILN_INSTANCE_ID: instance,
      KILN_SANDBOX_POOL_SIZE: String(poolSize),
      KILN_SANDBOX_MAX_PER_TEAM: '64',
      KILN_RATE_LIMIT_PER_MINUTE: '1000000',
      KILN_RATE_LIMIT_BURST: '1000000',
      KILN_SANDBOX_IMAGE: image,
    });
  let server = await boot(0, `bench-${process.pid}`);
  const driver = process.env.DATABASE_URL ? 'postgres' : 'pglite';
  const call = apiCaller(() => server.url);
  try {
    const team = await call(adminKey, 'POST', '/v1/teams', { name: 'bench' });
    const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'bench', role: 'owner' });
    const workspaceFor = async (runtime: 'runc' | 'gvisor') =>
      (
        await call(key, 'POST', '/v1/workspaces', {
          name: `bench-${runtime}-${Math.random().toString(36).slice(2, 8)}`,
          settings: { sandbox: { runtime } },
        })
      ).id as string;
    const ws = { id: await workspaceFor('runc') };
    const sessionIn = async (w: string) => (await call(key, 'POST', `/v1/workspaces/${w}/sessions`, {})).id as string;
    const newSession = () => sessionIn(ws.id);
    const execOnce = (s: string) => call(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });

    process.stdout.write(`Kiln sandbox benchmark — database ${driver}, image ${image}\n`);

    heading(`1. warm exec of print(1), ${N} sequential calls`);
    const session = await newSession();
    const warm = summarize(await timeEach(N, () => execOnce(session), 10));
    const dexec = summarize(await dockerExecBaseline());
    process.stdout.write(`${row('baseline: docker exec python3 -c (dockerode)', dexec)}\n`);
    process.stdout.write(`${row('Kiln: POST /v1/sessions/{session}/exec over HTTP', warm, dexec)}\n`);

    heading(`2. cold start: new session to first result, ${COLD_N} times (no warm pool)`);
    const bare = summarize(await dockerRunBaseline());
    const coldSessions: string[] = [];
    const cold = summarize(
      await timeEach(
        COLD_N,
        async () => {
          const s = await newSession();
          coldSessions.push(s);
          await execOnce(s);
        },
        1,
      ),
    );
    for (const s of coldSessions) await call(key, 'DELETE', `/v1/sessions/${s}`);
    process.stdout.write(`${row('baseline: docker run --rm (create+start+wait)', bare)}\n`);
    process.stdout.write(`${row('Kiln: create session + first exec (cold)', cold, bare)}\n`);

    await runtimesSideBySide(workspaceFor, sessionIn, execOnce, (s) => call(key, 'DELETE', `/v1/sessions/${s}`));

    heading(`2b. the same with a warm pool of ${COLD_N} containers (waited for before timing)`);
    server.child.kill('SIGTERM');
    await server.exited;
    const pooled = `bench-pool-${process.pid}`;
    // runc only, so the pool holds runc containers for the runc workspace.
    server = await boot(COLD_N, pooled, 'runc');
    const warmPool = async () =>
      (await docker.listContainers({ filters: { label: [`kiln.owner=${pooled}`, 'kiln.session='] } })).length;
    while ((await warmPool()) < COLD_N) await new Promise((r) => setTimeout(r, 100));
    const poolStart = summarize(
      await timeEach(COLD_N, async () => {
        await execOnce(await newSession());
      }),
    );
    process.stdout.write(`${row('Kiln: create session + first exec (warm pool)', poolStart, bare)}\n`);

    heading(`3. throughput: print(1) across 16 concurrent sessions for ${THROUGHPUT_S} s`);
    const sessions = await Promise.all(Array.from({ length: 16 }, newSession));
    const tp = await throughput(sessions, execOnce);
    process.stdout.write(`${row('per-exec latency under load', tp.latency)}\n`);
    process.stdout.write(
      `  ${'throughput'.padEnd(46)} ${tp.perSecond.toFixed(0)} execs/s (${tp.count} in ${THROUGHPUT_S} s)\n\n`,
    );
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
    rmSync(dataDir, { recursive: true, force: true });
  }
  // 5. First exec of a new session by workspace size (its own server: bench/sandbox-workspace.ts).
  await firstExecBySize(image);
}

/** Execs per second of print(1) across `n` concurrent sessions for THROUGHPUT_S seconds. */
async function throughput(sessions: string[], execOnce: (s: string) => Promise<unknown>) {
  await Promise.all(sessions.map((s) => execOnce(s)));
  let count = 0;
  const latencies: number[] = [];
  const deadline = performance.now() + THROUGHPUT_S * 1000;
  const t0 = performance.now();
  await Promise.all(
    sessions.map(async (s) => {
      while (performance.now() < deadline) {
        const start = performance.now();
        await execOnce(s);
        latencies.push(performance.now() - start);
        count++;
      }
    }),
  );
  return { perSecond: count / ((performance.now() - t0) / 1000), count, latency: summarize(latencies) };
}

/** Section 4: the same three measurements in a runc and a gvisor workspace of one server, with gvisor/runc. */
async function runtimesSideBySide(
  workspaceFor: (runtime: 'runc' | 'gvisor') => Promise<string>,
  sessionIn: (ws: string) => Promise<string>,
  execOnce: (s: string) => Promise<unknown>,
  end: (s: string) => Promise<unknown>,
) {
  const runtimes = ['runc', 'gvisor'] as const;
  const wss = { runc: await workspaceFor('runc'), gvisor: await workspaceFor('gvisor') };
  const label = (r: string, what: string) => `${r.padEnd(6)} ${what}`;
  heading(`4a. runc vs gVisor: warm exec of print(1), ${N} sequential calls each (ratio: gvisor/runc)`);
  const warm: Record<string, Summary> = {};
  for (const r of runtimes) {
    const s = await sessionIn(wss[r]);
    warm[r] = summarize(await timeEach(N, () => execOnce(s), 10));
    await end(s);
  }
  for (const r of runtimes)
    process.stdout.write(`${row(label(r, 'warm exec'), warm[r]!, r === 'gvisor' ? warm.runc : undefined)}
`);

  heading(`4b. runc vs gVisor: cold start, new session to first result, ${COLD_N} times each (no warm pool)`);
  const cold: Record<string, Summary> = {};
  for (const r of runtimes) {
    const made: string[] = [];
    cold[r] = summarize(
      await timeEach(
        COLD_N,
        async () => {
          const s = await sessionIn(wss[r]);
          made.push(s);
          await execOnce(s);
        },
        1,
      ),
    );
    for (const s of made) await end(s);
  }
  for (const r of runtimes)
    process.stdout.write(`${row(label(r, 'cold start'), cold[r]!, r === 'gvisor' ? cold.runc : undefined)}
`);

  heading(`4c. runc vs gVisor: throughput of print(1) across 8 concurrent sessions for ${THROUGHPUT_S} s each`);
  const tp: Record<string, Awaited<ReturnType<typeof throughput>>> = {};
  for (const r of runtimes) {
    const sessions = await Promise.all(Array.from({ length: 8 }, () => sessionIn(wss[r])));
    tp[r] = await throughput(sessions, execOnce);
    for (const s of sessions) await end(s);
  }
  for (const r of runtimes) {
    const ratio = r === 'gvisor' ? `   ${(tp.gvisor!.perSecond / tp.runc!.perSecond).toFixed(2)}× runc` : '';
    process.stdout.write(`${row(label(r, 'per-exec latency under load'), tp[r]!.latency, r === 'gvisor' ? tp.runc!.latency : undefined)}
`);
    process.stdout.write(`  ${label(r, 'throughput').padEnd(46)} ${tp[r]!.perSecond.toFixed(0)} execs/s (${tp[r]!.count})${ratio}
`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
