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

interface RawStats {
  memory_stats?: { usage?: number; stats?: Record<string, number> };
  cpu_stats?: { cpu_usage?: { total_usage?: number }; system_cpu_usage?: number; online_cpus?: number };
  precpu_stats?: { cpu_usage?: { total_usage?: number }; system_cpu_usage?: number };
}

/**
 * Memory and CPU use of sandbox containers. CPU needs two readings: with a recent previous
 * sample a one-shot reading is enough; otherwise Docker is asked to take two (about a second).
 */
export class StatsSampler {
  private last = new Map<string, Sample>();

  constructor(private readonly docker: Docker) {}

  async sample(containerId: string): Promise<Usage | null> {
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
    const cpu = raw.cpu_stats ?? {};
    const now: Sample = {
      cpuTotal: cpu.cpu_usage?.total_usage ?? 0,
      systemTotal: cpu.system_cpu_usage ?? 0,
      onlineCpus: cpu.online_cpus ?? 1,
      at: Date.now(),
    };
    const base = fast
      ? prev
      : {
          cpuTotal: raw.precpu_stats?.cpu_usage?.total_usage ?? 0,
          systemTotal: raw.precpu_stats?.system_cpu_usage ?? 0,
        };
    this.last.set(containerId, now);
    const dCpu = now.cpuTotal - base.cpuTotal;
    const dSys = now.systemTotal - base.systemTotal;
    const cpuPercent = dSys > 0 && base.systemTotal > 0 ? Math.round((dCpu / dSys) * now.onlineCpus * 1000) / 10 : null;
    const mem = raw.memory_stats ?? {};
    const inactive = mem.stats?.total_inactive_file ?? mem.stats?.inactive_file ?? 0;
    return { memoryBytes: Math.max(0, (mem.usage ?? 0) - inactive), cpuPercent };
  }

  forget(containerId: string): void {
    this.last.delete(containerId);
  }
}
