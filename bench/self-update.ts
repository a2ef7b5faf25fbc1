/**
 * Platform self-update benchmark (`npm run bench:self-update`): prints figures, never fails on time.
 *
 * On a clone of this checkout, a server started as its own process takes BENCH_ROUNDS harmless
 * patches (a README line and a comment in a TypeScript file each) through submit → self-check →
 * apply → relay restart, and says
 *  1. how long the self-check took from submit to ready, and each of its steps (install is a
 *     node_modules link: the lockfile is unchanged; type-check, dashboard and smoke run side by side;
 *     the first round's type-check has no state to start from, the others start from the last
 *     update's, and the ratio of the two is printed)
 *  2. the restart's downtime as the relay measured it (SIGTERM to the new version's /readyz 200)
 *  3. the downtime a client saw: the longest run of failed /healthz polls (every 10 ms) around it
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { alive } from '../apps/relay/src/relay.ts';
import { cloneProject, freePort, gitSync } from '../tests/support/checkout.ts';
import { startKiln } from '../tests/support/server.ts';
import { heading, row, summarize } from './lib.ts';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const ROOT = fileURLToPath(new URL('..', import.meta.url));

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-bench-selfupdate-'));
  const checkout = join(dir, 'src');
  cloneProject(ROOT, checkout);
  const adminKey = generateKey('admin');
  const port = await freePort();
  const first = await startKiln(
    { KILN_DATA_DIR: join(dir, 'data'), KILN_ADMIN_KEY: adminKey, KILN_PORT: String(port), KILN_SOURCE_DIR: checkout },
    checkout,
  );
  const url = first.url;
  const pids = new Set([first.child.pid!]);
  const api = async (path: string, method = 'GET', body?: unknown) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminKey}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return (await res.json()) as any;
  };
  const until = async <T>(fn: () => Promise<T | undefined>): Promise<T> => {
    for (;;) {
      const v = await fn().catch(() => undefined);
      if (v !== undefined) return v;
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  const steps = new Map<string, number[]>();
  const relay: number[] = [];
  /** Submit to ready, as a client polling every 100 ms sees it (the middle steps overlap). */
  const checked: number[] = [];
  const client: number[] = [];
  try {
    for (let i = 0; i < ROUNDS; i++) {
      // One line of the README and one of a TypeScript file (a comment: its exported types stay).
      const edited = ['README.md', 'apps/api/src/db/health.ts'].map((f) => join(checkout, f));
      const originals = edited.map((f) => readFileSync(f, 'utf8'));
      writeFileSync(edited[0]!, `${originals[0]}\nBenchmark round ${i}.\n`);
      writeFileSync(edited[1]!, `${originals[1]}// Benchmark round ${i}.\n`);
      const patch = `${gitSync(checkout, 'diff')}\n`;
      for (const [j, f] of edited.entries()) writeFileSync(f, originals[j]!);

      const t0 = performance.now();
      const submitted = await api('/v1/system/updates', 'POST', { patch, reason: `benchmark round ${i}` });
      const ready = await until(async () => {
        const u = await api(`/v1/system/updates/${submitted.id}`);
        return u.status === 'checking' ? undefined : u;
      });
      if (ready.status !== 'ready') throw new Error(`self-check failed: ${JSON.stringify(ready.checks.at(-1))}`);
      checked.push(performance.now() - t0);
      for (const c of ready.checks) {
        // The first check of a server has no type-check state; the others start from the last update's.
        const name =
          c.name !== 'typecheck' ? c.name : i === 0 ? 'typecheck, first (no state)' : 'typecheck, incremental';
        steps.set(name, [...(steps.get(name) ?? []), c.duration_ms]);
      }

      // Poll /healthz from just before the apply until the update is finished.
      let polling = true;
      let gapStart: number | undefined;
      let longest = 0;
      const poller = (async () => {
        while (polling) {
          const ok = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) }).then(
            (r) => r.ok,
            () => false,
          );
          const now = performance.now();
          if (!ok) gapStart ??= now;
          else if (gapStart !== undefined) {
            longest = Math.max(longest, now - gapStart);
            gapStart = undefined;
          }
          await new Promise((r) => setTimeout(r, 10));
        }
      })();
      await api(`/v1/system/updates/${submitted.id}/apply`, 'POST');
      const done = await until(async () => {
        const u = await api(`/v1/system/updates/${submitted.id}`);
        return u.status === 'applying' ? undefined : u;
      });
      polling = false;
      await poller;
      if (done.status !== 'applied') throw new Error(`apply ended ${done.status}: ${done.error}`);
      pids.add((await api('/v1/system/version')).pid);
      relay.push(done.checks.at(-1).duration_ms);
      client.push(longest);
    }
  } finally {
    for (const p of pids) if (alive(p)) process.kill(p, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }

  heading(
    `Platform self-update, ${ROUNDS} round(s) of a two-line patch (README + a TypeScript comment) (PGlite, ${new Date().toISOString().slice(0, 10)})`,
  );
  for (const [name, samples] of steps) process.stdout.write(`${row(`self-check step: ${name}`, summarize(samples))}\n`);
  const [full, incremental] = ['typecheck, first (no state)', 'typecheck, incremental'].map((n) => steps.get(n));
  if (full?.length && incremental?.length)
    process.stdout.write(
      `type-check, first ÷ incremental (median): ${(summarize(full).p50 / summarize(incremental).p50).toFixed(2)}×\n`,
    );
  process.stdout.write(`${row('self-check, submit → ready', summarize(checked))}\n`);
  process.stdout.write(`${row('restart downtime (relay: SIGTERM → /readyz 200)', summarize(relay))}\n`);
  process.stdout.write(`${row('restart downtime seen by a client (/healthz)', summarize(client))}\n`);
}

await main();
