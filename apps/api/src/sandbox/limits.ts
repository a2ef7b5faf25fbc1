import type { WorkspaceSettings } from '../workspace/settings.ts';

/** The resources one sandbox may use. */
export interface SandboxLimits {
  memoryMb: number;
  cpus: number;
  pids: number;
  timeoutS: number;
  diskMb: number;
}

const HOME_MB = 16;
const MIN_TMPFS_MB = 4;
/** What the runner, a fresh interpreter (with numpy, pandas and matplotlib loaded) and the page cache need. */
const RESERVE_MB = 96;

/**
 * Sizes of the sandbox's writable tmpfs mounts (/workspace, /tmp, home). Their pages are
 * charged to the container's memory cgroup, so if together they could outgrow the memory
 * limit, filling the disk would end in the kernel's OOM killer (which takes the runner once
 * the interpreter is gone) rather than ENOSPC. They therefore share what the memory limit leaves after a reserve for the
 * runner and interpreter (a quarter of the limit, at least RESERVE_MB): home gets up to
 * 16 MB (dotfiles and caches), /workspace and /tmp split the rest evenly, each capped by
 * the disk limit; a floor keeps tiny sandboxes usable (their budget is the memory anyway).
 */
export function tmpfsSizes(limits: SandboxLimits): { workspace: number; tmp: number; home: number } {
  const budget = limits.memoryMb - Math.max(RESERVE_MB, Math.ceil(limits.memoryMb / 4));
  const home = Math.max(MIN_TMPFS_MB, Math.min(HOME_MB, Math.floor(budget / 8)));
  const each = Math.max(MIN_TMPFS_MB, Math.min(limits.diskMb, Math.floor((budget - home) / 2)));
  return { workspace: each, tmp: each, home };
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
