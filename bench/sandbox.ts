/**
 * Sandbox benchmark (`npm run bench:sandbox`): prints figures, never fails on time.
 *
 *  1. warm exec of print(1) through the HTTP API vs `docker exec python3 -c` through dockerode
 *  2. cold session start to first result vs a bare create+start+wait (`docker run --rm`)
 *  3. throughput of trivial execs across 16 concurrent sessions of one workspace, with the settings a
 *     user gets (warm and prepared pools at their defaults) against the prepared pool off, same run
 *  4. runc and gVisor side by side: warm exec, cold start and throughput per runtime, gvisor/runc
 *  5. first exec of a new session by workspace size, 0-512 MB (bench/sandbox-workspace.ts)
 *  6. pause to disk and resume of a gVisor sandbox holding 10 MB-1 GB, against a cold start (bench/sandbox-pause.ts)
 *
 * Sections 1–3 run in runc (their baselines are runc containers); section 4 needs gVisor
 * registered with dockerd (infra/docker.sh, which `npm run bench:sandbox` runs first).
 * BENCH_SECTIONS=3 (a comma list of 1, 2, 3, 4, 5, 6) runs only those sections.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { loadConfig } from '../apps/api/src/config.ts';
import { connectDocker } from '../apps/api/src/sandbox/docker/connect.ts';
import { startKiln } from '../tests/support/server.ts';
import { pauseAndResume } from './sandbox-pause.ts';
import { firstExecBySize } from './sandbox-workspace.ts';
import { apiCaller, heading, percentile, row, type Summary, summarize, timeEach } from './lib.ts';

const N = Number(process.env.BENCH_N ?? 200);
const COLD_N = Number(process.env.BENCH_COLD_N ?? 15);
const THROUGHPUT_S = Number(process.env.BENCH_THROUGHPUT_S ?? 5);
/** Rounds of section 3: each measures both settings, alternately, so that load from elsewhere hits both alike. */
const THROUGHPUT_ROUNDS = Number(process.env.BENCH_THROUGHPUT_ROUNDS ?? 5);
const SECTIONS = new Set((process.env.BENCH_SECTIONS ?? '1,2,3,4,5,6').split(',').map((x) => x.trim()));
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
  // The team cap and rate limits are raised for the benchmark's 16 concurrent sessions.
  const boot = (instance: string, env: Record<string, string>) =>
    startKiln({
      KILN_DATA_DIR: dataDir,
      KILN_ADMIN_KEY: adminKey,
      ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
      KILN_INSTANCE_ID: instance,
      KILN_SANDBOX_MAX_PER_TEAM: '64',
      KILN_RATE_LIMIT_PER_MINUTE: '1000000',
      KILN_RATE_LIMIT_BURST: '1000000',
      KILN_SANDBOX_IMAGE: image,
      // KILN_SANDBOX_PAUSE=off gives gVisor sandboxes the runner without its relay (section 4 with and without).
      ...(process.env.KILN_SANDBOX_PAUSE ? { KILN_SANDBOX_PAUSE: process.env.KILN_SANDBOX_PAUSE } : {}),
      ...env,
    });
  let server = await boot(`bench-${process.pid}`, { KILN_SANDBOX_POOL_SIZE: '0' });
  const driver = process.env.DATABASE_URL ? 'postgres' : 'pglite';
  const call = apiCaller(() => server.url);
  const restart = async (instance: string, env: Record<string, string>) => {
    server.child.kill('SIGTERM');
    await server.exited;
    server = await boot(instance, env);
  };
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
    const end = (s: string) => call(key, 'DELETE', `/v1/sessions/${s}`);

    process.stdout.write(`Kiln sandbox benchmark — database ${driver}, image ${image}\n`);

    if (SECTIONS.has('1')) {
      heading(`1. warm exec of print(1), ${N} sequential calls`);
      const session = await newSession();
      const warm = summarize(await timeEach(N, () => execOnce(session), 10));
      await end(session);
      const dexec = summarize(await dockerExecBaseline());
      process.stdout.write(`${row('baseline: docker exec python3 -c (dockerode)', dexec)}\n`);
      process.stdout.write(`${row('Kiln: POST /v1/sessions/{session}/exec over HTTP', warm, dexec)}\n`);
    }

    if (SECTIONS.has('2')) {
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
      for (const s of coldSessions) await end(s);
      process.stdout.write(`${row('baseline: docker run --rm (create+start+wait)', bare)}\n`);
      process.stdout.write(`${row('Kiln: create session + first exec (cold)', cold, bare)}\n`);

      heading(`2b. the same with a warm pool of ${COLD_N} containers (waited for before timing)`);
      const pooled = `bench-pool-${process.pid}`;
      // runc only, so the pool holds runc containers for the runc workspace.
      await restart(pooled, { KILN_SANDBOX_POOL_SIZE: String(COLD_N), KILN_SANDBOX_RUNTIMES: 'runc' });
      while ((await warmCount(pooled)) < COLD_N) await new Promise((r) => setTimeout(r, 100));
      const made: string[] = [];
      const poolStart = summarize(
        await timeEach(COLD_N, async () => {
          const s = await newSession();
          made.push(s);
          await execOnce(s);
        }),
      );
      for (const s of made) await end(s);
      process.stdout.write(`${row('Kiln: create session + first exec (warm pool)', poolStart, bare)}\n`);
    }

    if (SECTIONS.has('3')) await throughputSection(restart, newSession, execOnce, end);

    if (SECTIONS.has('4')) {
      await restart(`bench-rt-${process.pid}`, { KILN_SANDBOX_POOL_SIZE: '0' });
      await runtimesSideBySide(workspaceFor, sessionIn, execOnce, end);
    }
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
    rmSync(dataDir, { recursive: true, force: true });
  }
  // 5. First exec of a new session by workspace size (its own server: bench/sandbox-workspace.ts).
  if (SECTIONS.has('5')) await firstExecBySize(image);
  // 6. Pause and resume (its own server: bench/sandbox-pause.ts).
  if (SECTIONS.has('6')) await pauseAndResume(image);
}

/** The warm containers (started for no session yet) of one server instance. */
async function warmCount(instance: string): Promise<number> {
  return (await docker.listContainers({ filters: { label: [`kiln.owner=${instance}`, 'kiln.session='] } })).length;
}

/**
 * Section 3: 16 sessions of one runc workspace execute print(1) in a loop, on a server with the
 * settings a user gets (KILN_SANDBOX_POOL_SIZE and KILN_SANDBOX_PREPARED_POOL_SIZE at their
 * defaults) and on one with the prepared pool off, alternately, THROUGHPUT_ROUNDS times each.
 * KILN_SANDBOX_RUNTIMES=runc on both, so that the pools serve the runc workspace as they do on a
 * host without gVisor (with gVisor offered, its containers are gVisor's and no runc session
 * takes one). Each round starts its sessions and times the loop from their first exec (which
 * claims their sandboxes), so that whatever the pools do after the claims runs under it.
 */
async function throughputSection(
  restart: (instance: string, env: Record<string, string>) => Promise<void>,
  newSession: () => Promise<string>,
  execOnce: (s: string) => Promise<unknown>,
  end: (s: string) => Promise<unknown>,
) {
  // An empty variable is an unset one: the server's own defaults, whatever they are.
  const { poolSize, preparedPoolSize } = loadConfig({}).sandbox;
  const settings = {
    defaults: {
      label: `defaults (pool ${poolSize}, prepared ${preparedPoolSize})`,
      env: { KILN_SANDBOX_POOL_SIZE: '', KILN_SANDBOX_PREPARED_POOL_SIZE: '' },
    },
    off: {
      label: `prepared pool off (pool ${poolSize}, prepared 0)`,
      env: { KILN_SANDBOX_POOL_SIZE: '', KILN_SANDBOX_PREPARED_POOL_SIZE: '0' },
    },
  };
  heading(
    `3. throughput: print(1) across 16 concurrent sessions of one runc workspace for ${THROUGHPUT_S} s, ` +
      `${THROUGHPUT_ROUNDS} rounds per setting (KILN_SANDBOX_RUNTIMES=runc; ratio: defaults/prepared pool off)`,
  );
  const results = { defaults: [] as Throughput[], off: [] as Throughput[] };
  for (let round = 0; round < THROUGHPUT_ROUNDS; round++) {
    for (const which of round % 2 ? (['defaults', 'off'] as const) : (['off', 'defaults'] as const)) {
      const instance = `bench-tp-${which}-${round}-${process.pid}`;
      await restart(instance, { KILN_SANDBOX_RUNTIMES: 'runc', ...settings[which].env });
      const sessions = await Promise.all(Array.from({ length: 16 }, newSession));
      // The loop starts right after the sessions' first exec (which claims their sandboxes): what the
      // pools do after those claims runs under it.
      results[which].push(await throughput(sessions, execOnce));
      for (const s of sessions) await end(s);
    }
  }
  const perSecond = (r: Throughput[]) =>
    percentile(
      r.map((x) => x.perSecond),
      50,
    );
  const latency = (r: Throughput[]) => summarize(r.flatMap((x) => x.latencies));
  for (const which of ['off', 'defaults'] as const) {
    const r = results[which];
    process.stdout.write(
      `${row(`${settings[which].label}: latency`, latency(r), which === 'defaults' ? latency(results.off) : undefined)}\n`,
    );
    const rounds = r.map((x) => x.perSecond.toFixed(0)).join(', ');
    const ratio =
      which === 'defaults' ? `   ${(perSecond(r) / perSecond(results.off)).toFixed(2)}× prepared pool off` : '';
    process.stdout.write(
      `  ${`${settings[which].label}: throughput`.padEnd(46)} median ${perSecond(r).toFixed(0)} execs/s (rounds: ${rounds})${ratio}\n`,
    );
  }
  process.stdout.write('\n');
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
  return { perSecond: count / ((performance.now() - t0) / 1000), count, latency: summarize(latencies), latencies };
}

type Throughput = Awaited<ReturnType<typeof throughput>>;

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
  const tp: Record<string, Throughput> = {};
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
