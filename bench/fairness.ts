/**
 * Fair-share benchmark (`npm run bench:fairness`): how much a noisy team slows another, with
 * KILN_SANDBOX_FAIR_SHARE off and on, per runtime. Prints figures, never fails on time.
 *
 * In each phase (one server per runtime and setting): team B's print(1) exec latency and the
 * API's GET /healthz, first quiet, then while team A's 10 sandboxes (its quota) each spin two
 * CPU-bound processes holding 300 MB and rewrite a file on /tmp (tmpfs) for LOAD_S seconds.
 * Ratios are loaded / quiet of the same phase. Targets (issue 24, item 5): B's p50 ≤ 1.2× quiet,
 * /healthz p95 ≤ 1.5× quiet. Bounded in time; every container (by its owner label) and the
 * benchmark's own cgroup parent are removed at the end, also on failure.
 *
 *   BENCH_FAIRNESS_RUNTIMES=runc,gvisor   BENCH_FAIRNESS_LOAD_S=20   BENCH_FAIRNESS_N=40
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { removeCgroupTree } from '../apps/api/src/sandbox/docker/cgroups.ts';
import { connectDocker } from '../apps/api/src/sandbox/docker/connect.ts';
import { type KilnProcess, startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, type Summary, summarize } from './lib.ts';

const RUNTIMES = (process.env.BENCH_FAIRNESS_RUNTIMES ?? 'runc,gvisor').split(',') as ('runc' | 'gvisor')[];
const LOAD_S = Number(process.env.BENCH_FAIRNESS_LOAD_S ?? 20);
const MODES = (process.env.BENCH_FAIRNESS_MODES ?? 'off,on,cap').split(',') as Mode[];
const N = Number(process.env.BENCH_FAIRNESS_N ?? 40);
const NOISY = 10;
/** The team cap of the third setting: half the host's CPUs. */
const TEAM_CPUS = Math.max(1, availableParallelism() / 2);
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
const docker = connectDocker(process.env.DOCKER_HOST);
const CGROUP = `kiln-bench-${process.pid}`;

/** Two spinning processes (the parent holds 300 MB) and a writer of 8 MB files on /tmp, for `s` seconds. */
const noisy = (s: number) => `
import os, time
end = time.time() + ${s}
held = bytearray(300 * 1024 * 1024)
for i in range(0, len(held), 4096): held[i] = 1
kids = []
for role in ('spin', 'spin', 'write'):
    pid = os.fork()
    if pid == 0:
        block = b'x' * (8 * 1024 * 1024)
        while time.time() < end:
            if role == 'write':
                with open('/tmp/noise', 'wb') as f: f.write(block)
                os.unlink('/tmp/noise')
        os._exit(0)
    kids.append(pid)
for k in kids: os.waitpid(k, 0)
print('done')
`;

interface Phase {
  exec: { quiet: Summary; loaded: Summary; loadedMax: number };
  /** How many of A's loads ran to their end. */
  ran: number;
  healthz: { quiet: Summary; loaded: Summary };
}

type Mode = 'off' | 'on' | 'cap';

async function phase(runtime: 'runc' | 'gvisor', mode: Mode, dataDir: string, adminKey: string): Promise<Phase> {
  const instance = `bench-fair-${mode}-${runtime}-${process.pid}`;
  let server: KilnProcess | undefined;
  try {
    server = await startKiln({
      KILN_DATA_DIR: dataDir,
      KILN_ADMIN_KEY: adminKey,
      ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
      KILN_INSTANCE_ID: instance,
      KILN_SANDBOX_FAIR_SHARE: mode === 'off' ? 'off' : 'on',
      ...(mode === 'cap' ? { KILN_SANDBOX_TEAM_MAX_CPUS: String(TEAM_CPUS) } : {}),
      KILN_SANDBOX_CGROUP: CGROUP,
      KILN_RATE_LIMIT_PER_MINUTE: '1000000',
      KILN_RATE_LIMIT_BURST: '1000000',
      KILN_SANDBOX_IMAGE: image,
    });
    const url = server.url;
    const call = apiCaller(() => url);
    const teamKey = async (name: string, memory: number) => {
      const team = await call(adminKey, 'POST', '/v1/teams', { name: `${name}-${instance}` });
      const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name, role: 'owner' });
      const ws = await call(key, 'POST', '/v1/workspaces', {
        name,
        settings: { sandbox: { runtime, cpus: 2, memory_mb: memory, timeout_s: LOAD_S + 60 } },
      });
      return { key, ws: ws.id as string };
    };
    const a = await teamKey('noisy', 1024);
    const b = await teamKey('quiet', 512);
    const session = async (t: { key: string; ws: string }) =>
      (await call(t.key, 'POST', `/v1/workspaces/${t.ws}/sessions`, {})).id as string;
    const run = (t: { key: string }, s: string, code: string) =>
      call(t.key, 'POST', `/v1/sessions/${s}/exec`, { code });
    const healthz = async () => {
      const res = await fetch(`${url}/healthz`);
      await res.arrayBuffer();
    };

    const bs = await session(b);
    for (let i = 0; i < 5; i++) await run(b, bs, 'print(1)');
    // B's execs and the health checks side by side, spread over a window: the same way quiet and loaded.
    const window = (until: number) =>
      Promise.all([timedUntil(until, N, () => run(b, bs, 'print(1)')), timedUntil(until, N * 2, healthz)]);
    const [quietExec, quietHealth] = await window(performance.now() + (LOAD_S - 6) * 1000);

    // Team A's sandboxes, started (a cold start each) before the load, then all loaded at once.
    const as = await Promise.all(Array.from({ length: NOISY }, () => session(a)));
    for (const s of as) await run(a, s, 'print(1)');
    const loads = as.map((s) => run(a, s, noisy(LOAD_S)));
    const started = performance.now();
    await new Promise((r) => setTimeout(r, 3000));
    // B's execs and the health checks side by side, within the load's time (less ramp-up and tail).
    const until = started + (LOAD_S - 3) * 1000;
    const [loadedExec, loadedHealth] = await window(until);
    // The load counts only if it ran: each of A's executions printed "done" at its end.
    const ran = (await Promise.allSettled(loads)).filter(
      (r) => r.status === 'fulfilled' && String(r.value.stdout).includes('done'),
    ).length;
    for (const s of [...as, bs])
      await call(s === bs ? b.key : a.key, 'DELETE', `/v1/sessions/${s}`).catch(() => undefined);
    return {
      exec: { quiet: summarize(quietExec), loaded: summarize(loadedExec), loadedMax: Math.max(...loadedExec) },
      ran,
      healthz: { quiet: summarize(quietHealth), loaded: summarize(loadedHealth) },
    };
  } finally {
    if (server) {
      server.child.kill('SIGTERM');
      await server.exited;
    }
    const left = await docker.listContainers({ all: true, filters: { label: [`kiln.owner=${instance}`] } });
    await Promise.all(
      left.map((c) =>
        docker
          .getContainer(c.Id)
          .remove({ force: true })
          .catch(() => undefined),
      ),
    );
  }
}

/** Up to `n` sequential timings, none started after `until`. */
async function timedUntil(until: number, n: number, fn: () => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  while (out.length < n && performance.now() < until) {
    const t0 = performance.now();
    await fn();
    out.push(performance.now() - t0);
    // Spread over the load's window rather than all at its start.
    await new Promise((r) => setTimeout(r, ((until - performance.now()) / Math.max(1, n - out.length)) * 0.5));
  }
  return out;
}

const f = (v: number) => `${v.toFixed(1)} ms`.padStart(10);
const x = (v: number, base: number) => `${(v / base).toFixed(2)}×`.padStart(7);

async function main() {
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-fair-'));
  const adminKey = generateKey('admin');
  process.stdout.write(
    `Kiln fair-share benchmark — team A: ${NOISY} sandboxes × (2 spinning processes, 300 MB, tmpfs writes) for ${LOAD_S} s; team B: print(1)\n`,
  );
  try {
    for (const runtime of RUNTIMES) {
      heading(`${runtime}: team B's print(1) exec and GET /healthz, quiet vs loaded (ratio: loaded / quiet)`);
      for (const m of MODES) {
        const p = await phase(runtime, m, dataDir, adminKey);
        const mode = { off: 'fair share off', on: 'fair share on ', cap: `on + ${TEAM_CPUS} CPU cap` }[m].padEnd(16);
        const { quiet, loaded, loadedMax } = p.exec;
        process.stdout.write(
          `  ${runtime.padEnd(6)} ${mode}  B exec   quiet p50 ${f(quiet.p50)} p95 ${f(quiet.p95)} | loaded (n=${loaded.n}) p50 ${f(loaded.p50)} ${x(loaded.p50, quiet.p50)}  p95 ${f(loaded.p95)} ${x(loaded.p95, quiet.p95)}  max ${f(loadedMax)}  (A: ${p.ran}/${NOISY} loads ran)\n`,
        );
        const h = p.healthz;
        process.stdout.write(
          `  ${runtime.padEnd(6)} ${mode}  /healthz quiet p50 ${f(h.quiet.p50)} p95 ${f(h.quiet.p95)} | loaded (n=${h.loaded.n}) p50 ${f(h.loaded.p50)} ${x(h.loaded.p50, h.quiet.p50)}  p95 ${f(h.loaded.p95)} ${x(h.loaded.p95, h.quiet.p95)}\n`,
        );
      }
    }
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
    await removeCgroupTree(CGROUP).catch((err) => console.error(`could not remove cgroup ${CGROUP}: ${err}`));
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
