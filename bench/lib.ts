/** Small helpers shared by the benchmarks: percentiles and aligned printing. */

export function percentile(samples: number[], p: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx]!;
}

export interface Summary {
  n: number;
  p50: number;
  p95: number;
}

export function summarize(samples: number[]): Summary {
  return { n: samples.length, p50: percentile(samples, 50), p95: percentile(samples, 95) };
}

/** Times `fn` `n` times (after `warmup` untimed runs), in milliseconds. */
export async function timeEach(n: number, fn: (i: number) => Promise<unknown>, warmup = 0): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await fn(i);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await fn(i);
    out.push(performance.now() - t0);
  }
  return out;
}

/** CPU time this process has used (user + system), in milliseconds. */
export function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** Like `timeEach`, but measures the CPU time this process spent, not the wall-clock time. */
export async function cpuEach(n: number, fn: (i: number) => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const c0 = cpuMs();
    await fn(i);
    out.push(cpuMs() - c0);
  }
  return out;
}

const ms = (v: number) => `${v.toFixed(2)} ms`;

export function row(label: string, s: Summary, baseline?: Summary): string {
  const ratio = baseline ? `   ${(s.p50 / baseline.p50).toFixed(2)}× baseline p50` : '';
  return `  ${label.padEnd(46)} n=${String(s.n).padEnd(5)} p50 ${ms(s.p50).padStart(11)}   p95 ${ms(s.p95).padStart(11)}${ratio}`;
}

export function heading(text: string): void {
  process.stdout.write(`\n${text}\n`);
}

/** Server settings that keep a benchmark's many sessions clear of the team cap and the rate limits. */
export const UNTHROTTLED = {
  KILN_SANDBOX_MAX_PER_TEAM: '64',
  KILN_RATE_LIMIT_PER_MINUTE: '1000000',
  KILN_RATE_LIMIT_BURST: '1000000',
};

/** A JSON client for the API at `url()` (asked at every call: the server may be restarted); throws on a status of 300 or more. */
export function apiCaller(url: () => string) {
  return async (key: string, method: string, path: string, body?: unknown) => {
    const res = await fetch(`${url()}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = await res.json();
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
}
