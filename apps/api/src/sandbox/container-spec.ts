import type Docker from 'dockerode';
import type { SandboxLimits } from './limits.ts';

/** The user the runner and the user's code run as; owns /workspace and /tmp. */
export const SANDBOX_USER = '10001:10001';
/**
 * The container's main process runs as another unprivileged uid, so that the runner's
 * "kill every process of my uid" sweep after a crash can never stop the container itself.
 */
const KEEPER_USER = '10002:10002';
const MiB = 1024 * 1024;
const NOFILE = 1024;
const HOME_MB = 16;

export interface SpecInput {
  image: string;
  name: string;
  limits: SandboxLimits;
  labels: Record<string, string>;
}

/**
 * Create options for a sandbox container with the full hardening list of DESIGN.md: no
 * network, every capability dropped, no-new-privileges, default seccomp, non-root users,
 * read-only root with size-limited tmpfs, memory = memory+swap, CPU and pid limits,
 * nofile/fsize ulimits, an init process, no published ports and no Docker socket.
 */
export function containerSpec({ image, name, limits, labels }: SpecInput): Docker.ContainerCreateOptions {
  const tmpfs = (mb: number, extra = '') => `rw,nosuid,nodev,size=${mb}m${extra}`;
  const owned = ',uid=10001,gid=10001,mode=0755';
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
        '/tmp': tmpfs(limits.diskMb, owned),
        '/workspace': tmpfs(limits.diskMb, owned),
        '/home/sandbox': tmpfs(HOME_MB, owned),
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
