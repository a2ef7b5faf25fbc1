/**
 * How long tenant input holds the API's event loop: the longest gap between two turns of the
 * loop while Kiln handles each kind of hostile input, against the same input handled the way
 * it was before (on the loop, with the backtracking engine or plain BPE), in the same run.
 *
 *   npx tsx bench/hostile-input.ts        (BENCH_RUNS=7 by default)
 *
 * Never fails on time: it prints medians, p95 and the ratio to the baseline.
 */
import { getEncoding } from 'js-tiktoken';
import { decideCode } from '../apps/api/src/agent/policy.ts';
import { countTokens } from '../apps/api/src/agent/context.ts';
import { scanSecrets } from '../apps/api/src/workspace/secrets.ts';
import type { WorkspaceSettings } from '../apps/api/src/workspace/settings.ts';
import { heading, row, summarize } from './lib.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 7);

/** The longest the event loop went without a turn while `fn` ran (ms). */
async function stall(fn: () => unknown): Promise<number> {
  let last = performance.now();
  let worst = 0;
  let on = true;
  const tick = () => {
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
    if (on) setImmediate(tick);
  };
  setImmediate(tick);
  await new Promise((r) => setImmediate(r));
  await fn();
  await new Promise((r) => setImmediate(r));
  on = false;
  return Math.max(worst, performance.now() - last);
}

async function measure(fn: (i: number) => unknown): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < RUNS; i++) out.push(await stall(() => fn(i)));
  return out;
}

const policy = {
  mode: 'auto',
  rules: [{ match: '^(a+)+$', behavior: 'ask' }],
  timeout_s: 60,
} as unknown as WorkspaceSettings['approval'];
// 22 characters keep the baseline near a tenth of a second; each more doubles it.
const evil = `${'a'.repeat(22)}!`;

heading('approval rule ^(a+)+$ against a hostile cell (event-loop stall)');
const reBase = summarize(await measure(() => /^(a+)+$/m.test(evil)));
console.log(row('before: RegExp on the loop, 23 characters', reBase));
console.log(row('now: RE2, the same 23 characters', summarize(await measure(() => decideCode(policy, evil))), reBase));
const big = `${'a'.repeat(100_000)}!`;
console.log(row('now: RE2, 100,001 characters', summarize(await measure(() => decideCode(policy, big))), reBase));

heading('token count of a long run of one character (event-loop stall)');
const enc = getEncoding('o200k_base');
const tokBase = summarize(await measure((i) => enc.encode('x'.repeat(4000 + i), 'all')));
console.log(row("before: BPE on the loop, 'x' * 4000", tokBase));
console.log(
  row(
    "now: worker + 64-char cut, 'x' * 30000",
    summarize(await measure((i) => countTokens('x'.repeat(30_000 + i)))),
    tokBase,
  ),
);

heading('secret scan of a 2 MB file (event-loop stall)');
const file = Buffer.from(`${'lorem ipsum dolor sit amet '.repeat(75_000)}password = "Hunter2Secret"\n`);
console.log(row('now: scanner thread', summarize(await measure(() => scanSecrets([{ path: 'big.txt', data: file }])))));
process.exit(0);
