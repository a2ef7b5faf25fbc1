/**
 * Section 6 of `npm run bench:sandbox` (also runnable alone: `tsx bench/sandbox-pause.ts`):
 * pausing a gVisor sandbox to disk and resuming it, through the HTTP API of a server running as
 * its own process, for a sandbox holding 10 MB, 200 MB and 1 GB of Python objects (1 KiB random
 * `bytes`, so that nothing in them compresses), against a cold start of a new gVisor sandbox
 * (new session to first result, no warm pool) measured in the same run.
 *
 *  pause:  POST /v1/sessions/{session}/pause, as the client waited for it
 *  resume: POST /v1/sessions/{session}/resume, as the client waited for it (its result is then
 *          checked with an exec, not timed)
 *
 * Each size's checkpoint on disk is the server's own figure (`checkpoint_bytes`). Ratios are to
 * the cold start's p50. BENCH_PAUSE_N (default 5) samples each; BENCH_PAUSE_MB a comma list of sizes.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, percentile, row, summarize, timeEach, UNTHROTTLED } from './lib.ts';

const PAUSE_N = Number(process.env.BENCH_PAUSE_N ?? 5);
const SIZES_MB = (process.env.BENCH_PAUSE_MB ?? '10,200,1024').split(',').map(Number);

export async function pauseAndResume(image: string): Promise<void> {
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-pause-'));
  const adminKey = generateKey('admin');
  const server = await startKiln({
    KILN_DATA_DIR: dataDir,
    KILN_ADMIN_KEY: adminKey,
    ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
    KILN_INSTANCE_ID: `bench-pause-${process.pid}`,
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_SANDBOX_PREPARED_POOL_SIZE: '0',
    ...UNTHROTTLED,
    KILN_SANDBOX_IMAGE: image,
  });
  const call = apiCaller(() => server.url);
  try {
    const team = await call(adminKey, 'POST', '/v1/teams', { name: 'bench-pause' });
    const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'bench', role: 'owner' });
    // Room for 1 GB of objects (and the interpreter) in each sandbox.
    const ws = await call(key, 'POST', '/v1/workspaces', {
      name: 'bench-pause',
      settings: { sandbox: { runtime: 'gvisor', memory_mb: 2048, timeout_s: 300 } },
    });
    const session = async () => (await call(key, 'POST', `/v1/workspaces/${ws.id}/sessions`, {})).id as string;
    const exec = (s: string, code: string) => call(key, 'POST', `/v1/sessions/${s}/exec`, { code });
    const end = (s: string) => call(key, 'DELETE', `/v1/sessions/${s}`);

    heading(
      `6. pause to disk and resume (gVisor), ${PAUSE_N} times per size; ratio: to a cold start of a new gVisor sandbox`,
    );
    const coldMade: string[] = [];
    const cold = summarize(
      await timeEach(
        PAUSE_N,
        async () => {
          const s = await session();
          coldMade.push(s);
          await exec(s, 'print(1)');
        },
        1,
      ),
    );
    for (const s of coldMade) await end(s);
    process.stdout.write(`${row('baseline: cold start, new session to first result', cold)}\n`);

    for (const mb of SIZES_MB) {
      const s = await session();
      await exec(s, `import os\nblob = [os.urandom(1024) for _ in range(${mb} * 1024)]`);
      const pauses: number[] = [];
      const resumes: number[] = [];
      const bytes: number[] = [];
      let failed: string | undefined;
      for (let i = 0; i < PAUSE_N && !failed; i++) {
        let t0 = performance.now();
        const p = await call(key, 'POST', `/v1/sessions/${s}/pause`, {}).catch(() => null);
        if (!p) {
          // Said, not hidden: the server's reason, from its log (the sandbox was removed).
          const why = server
            .stdout()
            .split('\n')
            .filter((l) => /could not checkpoint/.test(l));
          failed = (JSON.parse(why.at(-1) ?? '{}') as { reason?: string }).reason ?? 'unknown';
          break;
        }
        pauses.push(performance.now() - t0);
        if (typeof p.checkpoint_bytes === 'number') bytes.push(p.checkpoint_bytes);
        t0 = performance.now();
        await call(key, 'POST', `/v1/sessions/${s}/resume`, {});
        resumes.push(performance.now() - t0);
        // Everything is still there (not timed).
        const check = await exec(s, 'print(len(blob))');
        if (check.stdout !== `${mb * 1024}\n`)
          throw new Error(
            `after a resume: ${JSON.stringify(check)}\n${server
              .stdout()
              .split('\n')
              .filter((l) => /resume|paus|warn|error/i.test(l))
              .slice(-10)
              .join('\n')}`,
          );
      }
      await end(s);
      const label = `${String(mb).padStart(4)} MB of objects`;
      if (failed)
        process.stdout.write(
          `  ${`${label}: pause ${pauses.length + 1} of ${PAUSE_N} failed`.padEnd(46)} ${failed.slice(0, 300)}\n`,
        );
      if (!pauses.length) continue;
      process.stdout.write(`${row(`${label}: pause`, summarize(pauses), cold)}\n`);
      process.stdout.write(`${row(`${label}: resume`, summarize(resumes), cold)}\n`);
      const disk = bytes.length ? `${(percentile(bytes, 50) / 2 ** 20).toFixed(1)} MiB` : 'unknown';
      process.stdout.write(`  ${`${label}: checkpoint on disk (p50)`.padEnd(46)} ${disk}\n`);
    }
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
    rmSync(dataDir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  pauseAndResume(process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest').catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
