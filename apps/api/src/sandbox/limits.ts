import type { WorkspaceSettings } from '../workspace/settings.ts';
import { tmpfsSizes } from './container-spec.ts';

/** The resources one sandbox may use. */
export interface SandboxLimits {
  memoryMb: number;
  cpus: number;
  pids: number;
  timeoutS: number;
  diskMb: number;
}

/** A workspace's sandbox settings, each capped by the server-wide maximum. */
export function effectiveLimits(ws: WorkspaceSettings['sandbox'], max: SandboxLimits): SandboxLimits {
  return {
    memoryMb: Math.min(ws.memory_mb, max.memoryMb),
    cpus: Math.min(ws.cpus, max.cpus),
    pids: Math.min(ws.pids, max.pids),
    timeoutS: Math.min(ws.timeout_s, max.timeoutS),
    diskMb: Math.min(ws.disk_mb, max.diskMb),
  };
}

/** Limits that can only be set when a container is created (tmpfs sizes, which follow disk and memory; ulimits). */
export const sameShape = (a: SandboxLimits, b: SandboxLimits) => JSON.stringify(tmpfsSizes(a)) === JSON.stringify(tmpfsSizes(b));
