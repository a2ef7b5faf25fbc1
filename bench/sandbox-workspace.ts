/**
 * Section 4 of `npm run bench:sandbox` (also runnable alone: `tsx bench/sandbox-workspace.ts`):
 * the first exec of a NEW session against the size of its workspace's working tree, through
 * the HTTP API of a server running as its own process. The files are written straight into
 * the workspace's directory on the host (as a clone or files added on the host would be), so
 * that only the copy into the sandbox is measured, not their upload.
 *
 *  5a. default sandbox settings, claimed from a warm pool (waited for before each sample): 0-128 MB
 *  5b. sandbox settings large enough for 512 MB in /workspace (memory_mb 2048, disk_mb 1024),
 *      which the warm pool's shape does not fit, so each start is cold: 0, 128 and 512 MB
 *  5c. the tar path (KILN_SANDBOX_WORKSPACE_MOUNT=off, as with a remote Docker Engine), as 4a: 0-64 MB
 *
 * Each row's ratio is to the empty workspace of its own series, measured in the same run.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, fsyncSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { connectDocker } from '../apps/api/src/sandbox/docker/connect.ts';
import { startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, row, type Summary, summarize } from './lib.ts';

const SIZE_N = Number(process.env.BENCH_SIZE_N ?? 7);
/** Which of 5a, 5b, 5c to run (`BENCH_WS_SERIES=c`: the tar path only); all by default. */
const SERIES = new Set((process.env.BENCH_WS_SERIES ?? 'abc').split(''));
const POOL = 2;
const MiB = 1024 * 1024;
/** The files of a workspace: 1 MiB each, 32 to a directory, plus a few small ones. */
const FILE_BYTES = MiB;

/** Writes `mb` files of 1 MiB under `dir/data` (fsynced, so no write-back competes with the timing). */
export function fillWorkspace(dir: string, mb: number): void {
  const chunk = randomBytes(FILE_BYTES);
  for (let i = 0; i < mb; i++) {
    const sub = join(dir, 'data', `d${Math.floor(i / 32)}`);
    mkdirSync(sub, { recursive: true });
    // On disk before the timing starts, so that no write-back of them competes with it.
    const fd = openSync(join(sub, `f${i}.bin`), 'w');
    writeSync(fd, chunk);
    fsyncSync(fd);
    closeSync(fd);
  }
}

type Series = (label: string, sizes: number[], settings: unknown, warm: boolean) => Promise<void>;

/**
 * Boots a server of its own (warm pool of POOL containers) with KILN_SANDBOX_WORKSPACE_MOUNT =
 * `mount`, runs `body` with a function that prints one series, and stops the server.
 */
async function withServer(image: string, mount: 'auto' | 'off', body: (series: Series) => Promise<void>) {
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-ws-'));
  const adminKey = generateKey('admin');
  const owner = `bench-ws-${mount}-${process.pid}`;
  const docker = connectDocker(process.env.DOCKER_HOST);
  const server = await startKiln({
    KILN_DATA_DIR: dataDir,
    KILN_ADMIN_KEY: adminKey,
    ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
    KILN_SANDBOX_WORKSPACE_MOUNT: mount,
    KILN_INSTANCE_ID: owner,
    KILN_SANDBOX_POOL_SIZE: String(POOL),
    KILN_SANDBOX_MAX_PER_TEAM: '64',
    KILN_RATE_LIMIT_PER_MINUTE: '1000000',
    KILN_RATE_LIMIT_BURST: '1000000',
    KILN_SANDBOX_IMAGE: image,
    KILN_LOG_LEVEL: 'info',
  });
  const call = apiCaller(() => server.url);
  const warmCount = async () =>
    (await docker.listContainers({ filters: { label: [`kiln.owner=${owner}`, 'kiln.session='] } })).length;
  try {
    const copy = /"workspace_copy":"(\w+)"/.exec(server.stdout())?.[1] ?? 'unknown';
    const team = await call(adminKey, 'POST', '/v1/teams', { name: 'bench-ws' });
    const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'bench', role: 'owner' });
    // With fair share (on by default where the host allows it) warm containers are made for the
    // teams that claimed a sandbox last: a new server makes none until this team has claimed one.
    const first = await call(key, 'POST', '/v1/workspaces', { name: 'warm-up' });
    const warmUp = (await call(key, 'POST', `/v1/workspaces/${first.id}/sessions`, {})).id as string;
    await call(key, 'POST', `/v1/sessions/${warmUp}/exec`, { code: 'print(1)' });
    await call(key, 'DELETE', `/v1/sessions/${warmUp}`);
    const waitWarm = async () => {
      const until = performance.now() + 120_000;
      while ((await warmCount()) < POOL) {
        if (performance.now() > until) throw new Error(`the warm pool did not reach ${POOL} containers in 120 s`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    /** Only the session's creation and its first exec are timed, not waiting for the pool or the deletion. */
    const firstExecs = async (wsId: string): Promise<number[]> => {
      const out: number[] = [];
      for (let i = 0; i < SIZE_N; i++) {
        // Also before a cold start: no refill of the pool competes with the sample for the CPU.
        await waitWarm();
        // And the container the server fills for this workspace's next session (host mounts:
        // after each claim) is ready, as the pool's are: the server says so in its log.
        const filled = () =>
          server
            .stdout()
            .split('\n')
            .filter((l) => l.includes(`"workspace":"${wsId}"`) && l.includes('next session')).length;
        const until = performance.now() + 10_000;
        while (copy === 'mount' && i > 0 && filled() < i && performance.now() < until)
          await new Promise((r) => setTimeout(r, 50));
        const t0 = performance.now();
        const s = (await call(key, 'POST', `/v1/workspaces/${wsId}/sessions`, {})).id as string;
        await call(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });
        out.push(performance.now() - t0);
        await call(key, 'DELETE', `/v1/sessions/${s}`);
      }
      return out;
    };
    await body(async (label, sizes, settings, warm) => {
      heading(
        `5${label}. first exec of a new session by workspace size, ${SIZE_N} sessions each ` +
          `(${warm ? `warm pool of ${POOL}` : 'cold start'}; workspace copy: ${copy})`,
      );
      let empty: Summary | undefined;
      for (const mb of sizes) {
        const ws = await call(key, 'POST', '/v1/workspaces', { name: `size-${label}-${mb}`, settings });
        fillWorkspace(join(dataDir, 'workspaces', ws.id), mb);
        const samples = await firstExecs(ws.id).catch((err: Error) => err);
        if (samples instanceof Error) {
          process.stdout.write(`  ${`${mb} MB`.padEnd(46)} failed: ${samples.message.slice(0, 160)}\n`);
          continue;
        }
        const s = summarize(samples);
        empty ??= s;
        process.stdout.write(`${row(`${mb} MB workspace: new session + first exec`, s, empty)}\n`);
      }
    });
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
    rmSync(dataDir, { recursive: true, force: true });
  }
}

/** Prints section 5: the host mount (5a, 5b), then the tar path it replaces, for comparison (5c). */
export async function firstExecBySize(image: string): Promise<void> {
  const big = { sandbox: { memory_mb: 2048, disk_mb: 1024 } };
  if (SERIES.has('a') || SERIES.has('b'))
    await withServer(image, 'auto', async (series) => {
      if (SERIES.has('a')) await series('a', [0, 16, 64, 128], undefined, true);
      if (SERIES.has('b')) await series('b', [0, 128, 512], big, false);
    });
  // The tar path (a remote Docker Engine's): a 128 MB tar does not fit the default sandbox's memory.
  if (SERIES.has('c')) await withServer(image, 'off', (series) => series('c', [0, 16, 64], undefined, true));
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  firstExecBySize(process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest').catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
