import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Usage } from '../backend.ts';

interface Sample {
  cpuTotal: number;
  systemTotal: number;
  onlineCpus: number;
  at: number;
}

/** How old the previous sample may be to compute CPU use from a fast one-shot reading. */
const FRESH_MS = 30_000;
/** A watched container's reading older than this is not used (its stream stalled). */
const LIVE_MS = 5_000;
/** How long a listing waits for a just-started container's first reading. */
const FIRST_READING_MS = 2_500;

interface RawStats {
  memory_stats?: { usage?: number; stats?: Record<string, number> };
  cpu_stats?: { cpu_usage?: { total_usage?: number }; system_cpu_usage?: number; online_cpus?: number };
  precpu_stats?: { cpu_usage?: { total_usage?: number }; system_cpu_usage?: number };
}

/** Memory use without the page cache the kernel can drop (what `docker stats` shows). */
function memoryOf(raw: RawStats): number {
  const mem = raw.memory_stats ?? {};
  const inactive = mem.stats?.total_inactive_file ?? mem.stats?.inactive_file ?? 0;
  return Math.max(0, (mem.usage ?? 0) - inactive);
}

/** CPU use in percent of one CPU between two readings; null when they cannot tell. */
function cpuBetween(now: Sample, base: { cpuTotal: number; systemTotal: number }): number | null {
  const dCpu = now.cpuTotal - base.cpuTotal;
  const dSys = now.systemTotal - base.systemTotal;
  return dSys > 0 && base.systemTotal > 0 ? Math.round((dCpu / dSys) * now.onlineCpus * 1000) / 10 : null;
}

function sampleOf(raw: RawStats): Sample {
  const cpu = raw.cpu_stats ?? {};
  return {
    cpuTotal: cpu.cpu_usage?.total_usage ?? 0,
    systemTotal: cpu.system_cpu_usage ?? 0,
    onlineCpus: cpu.online_cpus ?? 1,
    at: Date.now(),
  };
}

/** A container this instance started: Docker streams its readings (one a second) from its start. */
interface Watch {
  /** When the container was started (watching begins then): its first reading's CPU is its average since. */
  since: number;
  stream?: Readable;
  latest?: { usage: Usage; at: number };
  waiters: ((u: Usage | null) => void)[];
  stopped: boolean;
}

/**
 * Memory and CPU use of sandbox containers. The containers this instance starts are watched
 * from their start (Docker's stats stream), so a listing answers at once with a reading of the
 * last second, a new sandbox's included. Another replica's container is read on demand: CPU
 * needs two readings, so with a recent previous sample a one-shot reading is enough; otherwise
 * Docker is asked to take two (about a second).
 */
export class StatsSampler {
  private last = new Map<string, Sample>();
  private readonly watches = new Map<string, Watch>();

  constructor(private readonly docker: Docker) {}

  /** Follows a started container's readings until `forget`. */
  watch(containerId: string): void {
    if (this.watches.has(containerId)) return;
    const w: Watch = { since: Date.now(), waiters: [], stopped: false };
    this.watches.set(containerId, w);
    const end = () => {
      if (this.watches.get(containerId) === w) this.watches.delete(containerId);
      for (const resolve of w.waiters.splice(0)) resolve(null);
    };
    void (this.docker.getContainer(containerId).stats({ stream: true }) as Promise<Readable>).then((stream) => {
      if (w.stopped) {
        stream.destroy();
        return;
      }
      w.stream = stream;
      let buffered = '';
      stream.setEncoding('utf8');
      stream.on('data', (chunk: string) => {
        buffered += chunk;
        // One JSON document per line; a line longer than any reading is not one.
        if (buffered.length > 1 << 20) buffered = '';
        for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
          const line = buffered.slice(0, nl);
          buffered = buffered.slice(nl + 1);
          let raw: RawStats;
          try {
            raw = JSON.parse(line) as RawStats;
          } catch {
            continue;
          }
          const now = sampleOf(raw);
          const elapsedNs = (now.at - w.since) * 1e6;
          const usage = {
            memoryBytes: memoryOf(raw),
            // The first reading has no previous one: CPU then is the average since the start.
            cpuPercent:
              cpuBetween(now, {
                cpuTotal: raw.precpu_stats?.cpu_usage?.total_usage ?? 0,
                systemTotal: raw.precpu_stats?.system_cpu_usage ?? 0,
              }) ?? (elapsedNs > 0 ? Math.round((now.cpuTotal / elapsedNs) * 1000) / 10 : null),
          };
          w.latest = { usage, at: Date.now() };
          for (const resolve of w.waiters.splice(0)) resolve(usage);
        }
      });
      stream.on('error', end);
      stream.on('close', end);
      stream.on('end', end);
    }, end);
  }

  async sample(containerId: string): Promise<Usage | null> {
    const w = this.watches.get(containerId);
    if (w) {
      if (w.latest && Date.now() - w.latest.at < LIVE_MS) return w.latest.usage;
      const first = await new Promise<Usage | null>((resolve) => {
        const timer = setTimeout(() => resolve(null), FIRST_READING_MS);
        w.waiters.push((u) => {
          clearTimeout(timer);
          resolve(u);
        });
      });
      if (first) return first;
    }
    return this.readOnce(containerId);
  }

  private async readOnce(containerId: string): Promise<Usage | null> {
    const prev = this.last.get(containerId);
    const fast = prev !== undefined && Date.now() - prev.at < FRESH_MS;
    let raw: RawStats;
    try {
      raw = (await this.docker
        .getContainer(containerId)
        .stats({ stream: false, 'one-shot': fast } as { stream: false })) as RawStats;
    } catch {
      return null;
    }
    const now = sampleOf(raw);
    const base = fast
      ? prev
      : {
          cpuTotal: raw.precpu_stats?.cpu_usage?.total_usage ?? 0,
          systemTotal: raw.precpu_stats?.system_cpu_usage ?? 0,
        };
    this.last.set(containerId, now);
    return { memoryBytes: memoryOf(raw), cpuPercent: cpuBetween(now, base) };
  }

  forget(containerId: string): void {
    this.last.delete(containerId);
    const w = this.watches.get(containerId);
    if (!w) return;
    w.stopped = true;
    this.watches.delete(containerId);
    w.stream?.destroy();
    for (const resolve of w.waiters.splice(0)) resolve(null);
  }
}
