import type Docker from 'dockerode';
import { tmpfsSizes, type SandboxLimits } from '../limits.ts';

/**
 * Each sandbox's runner and user code run as a uid of their own from this range (the backend
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

export interface SpecInput {
  image: string;
  name: string;
  limits: SandboxLimits;
  labels: Record<string, string>;
  /** The sandbox's own uid (and gid), from SANDBOX_UID_MIN on. */
  uid: number;
  /** With network allowlist: the sandbox's own internal network and its address on it; unset, no network. */
  network?: SandboxNetwork;
}

interface SandboxNetwork {
  name: string;
  ip: string;
  /** Where its resolver forwards queries: an address that answers nothing (only the proxy resolves names). */
  dns: string;
}

/** The network part of a sandbox's create options: none at all, or its own internal network only. */
function networkSpec(network: SandboxNetwork | undefined) {
  if (!network) return { NetworkDisabled: true, NetworkMode: 'none' };
  return {
    NetworkDisabled: false,
    NetworkMode: network.name,
    Dns: [network.dns],
    DnsOptions: ['timeout:1', 'attempts:1'],
    NetworkingConfig: { EndpointsConfig: { [network.name]: { IPAMConfig: { IPv4Address: network.ip } } } },
  };
}

export const sandboxUser = (uid: number) => `${uid}:${uid}`;

/**
 * Create options for a sandbox container with the full hardening list of the security model: no
 * network (or, with allowlist, only its own internal network to the egress proxy), every
 * capability dropped, no-new-privileges, default seccomp, non-root users, read-only root with
 * size-limited tmpfs, memory = memory+swap, CPU and pid limits, nofile/fsize ulimits, an init
 * process, no published ports and no Docker socket.
 */
export function containerSpec({ image, name, limits, labels, uid, network }: SpecInput): Docker.ContainerCreateOptions {
  const net = networkSpec(network);
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
    NetworkDisabled: net.NetworkDisabled,
    ...(net.NetworkingConfig ? { NetworkingConfig: net.NetworkingConfig } : {}),
    AttachStdin: false,
    AttachStdout: false,
    AttachStderr: false,
    HostConfig: {
      NetworkMode: net.NetworkMode,
      ...(net.Dns ? { Dns: net.Dns, DnsOptions: net.DnsOptions } : {}),
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
