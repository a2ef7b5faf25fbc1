import type Docker from 'dockerode';
import type { SandboxLimits } from './limits.ts';

/**
 * Each sandbox's runner and user code run as a uid of their own from this range (the engine
 * picks one no other live sandbox of this Docker host has), which owns /workspace, /tmp and
 * home. Per-uid kernel limits (inotify instances and watches, user namespaces, keys, POSIX
 * message queues) are then the sandbox's own: one tenant exhausting them leaves every other
 * sandbox untouched. Far above any uid a host or image allocates.
 */
export const SANDBOX_UID_MIN = 2_000_000_000;
export const SANDBOX_UID_COUNT = 100_000_000;
/**
 * The container's main process runs as another unprivileged uid, so that the runner's
 * "kill every process of my uid" sweep after a crash can never stop the container itself.
 * It only sleeps, so sharing it between sandboxes shares nothing the user's code can use.
 */
const KEEPER_USER = '10002:10002';
const MiB = 1024 * 1024;
const NOFILE = 1024;
const HOME_MB = 16;
const MIN_TMPFS_MB = 4;
/** What the runner, a fresh interpreter (with numpy, pandas and matplotlib loaded) and the page cache need. */
const RESERVE_MB = 96;

export interface SpecInput {
  image: string;
  name: string;
  limits: SandboxLimits;
  labels: Record<string, string>;
  /** The sandbox's own uid (and gid), from SANDBOX_UID_MIN on. */
  uid: number;
}

export const sandboxUser = (uid: number) => `${uid}:${uid}`;

/**
 * Sizes of the writable tmpfs mounts. Their pages are charged to the container's memory
 * cgroup, so if together they could outgrow the memory limit, filling the disk would end
 * in the kernel's OOM killer (which takes the runner once the interpreter is gone) rather
 * than ENOSPC. They therefore share what the memory limit leaves after a reserve for the
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

/**
 * Create options for a sandbox container with the full hardening list of the security model: no
 * network, every capability dropped, no-new-privileges, default seccomp, non-root users,
 * read-only root with size-limited tmpfs, memory = memory+swap, CPU and pid limits,
 * nofile/fsize ulimits, an init process, no published ports and no Docker socket.
 */
export function containerSpec({ image, name, limits, labels, uid }: SpecInput): Docker.ContainerCreateOptions {
  const tmpfs = (mb: number, extra = '') => `rw,nosuid,nodev,size=${mb}m${extra}`;
  const owned = `,uid=${uid},gid=${uid},mode=0755`;
  const sizes = tmpfsSizes(limits);
  return {
    name,
    Image: image,
    Cmd: ['sleep', 'infinity'],
    User: KEEPER_USER,
    WorkingDir: '/workspace',
    Env: ['HOME=/home/sandbox', 'MPLCONFIGDIR=/tmp/.matplotlib', 'PYTHONDONTWRITEBYTECODE=1', 'LANG=C.UTF-8'],
    Labels: labels,
    NetworkDisabled: true,
    AttachStdin: false,
    AttachStdout: false,
    AttachStderr: false,
    HostConfig: {
      NetworkMode: 'none',
      CapDrop: ['ALL'],
      SecurityOpt: ['no-new-privileges'],
      Privileged: false,
      ReadonlyRootfs: true,
      Tmpfs: {
        '/tmp': tmpfs(sizes.tmp, owned),
        '/workspace': tmpfs(sizes.workspace, owned),
        '/home/sandbox': tmpfs(sizes.home, owned),
      },
      Memory: limits.memoryMb * MiB,
      MemorySwap: limits.memoryMb * MiB,
      NanoCpus: Math.round(limits.cpus * 1e9),
      PidsLimit: limits.pids,
      Ulimits: [
        { Name: 'nofile', Soft: NOFILE, Hard: NOFILE },
        { Name: 'fsize', Soft: limits.diskMb * MiB, Hard: limits.diskMb * MiB },
      ],
      Init: true,
      IpcMode: 'private',
      PublishAllPorts: false,
      PortBindings: {},
      Binds: [],
      RestartPolicy: { Name: 'no' },
      LogConfig: { Type: 'none', Config: {} },
    },
  };
}

/** The live-updatable part of the limits (docker update), for a warm container claimed by a workspace. */
export function updateSpec(limits: SandboxLimits) {
  return {
    Memory: limits.memoryMb * MiB,
    MemorySwap: limits.memoryMb * MiB,
    NanoCpus: Math.round(limits.cpus * 1e9),
    PidsLimit: limits.pids,
  };
}
