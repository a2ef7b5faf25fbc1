import type Docker from 'dockerode';
import type { SandboxRuntime } from '../../workspace/settings.ts';
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
export const KEEPER_USER = '10002:10002';
/**
 * The Docker runtime of a gVisor sandbox: runsc with the platform infra/docker.sh chose and
 * --network=none (these containers have no network; the sandbox gets no netstack at all).
 */
export const GVISOR_NONET_RUNTIME = 'kiln-gvisor-nonet';
/**
 * The runtime of a gVisor sandbox with network allowlist: also no network, but it may connect to
 * a host Unix socket mounted into it (runsc --host-uds=open). Only its egress bridge's socket is.
 */
export const GVISOR_EGRESS_RUNTIME = 'kiln-gvisor-egress';
/** A bridged sandbox's main process: its egress bridge (kiln_bridge.py); an image without one sleeps, with no egress. */
const BRIDGE_CMD = ['sh', '-c', 'python3 -I -S /opt/kiln/kiln_bridge.py; exec sleep infinity'];
const MiB = 1024 * 1024;
/**
 * Under gVisor the container's cgroup holds the whole sandbox: the sentry (the user-space
 * kernel), its gofer and, on the ptrace platform, a host stub process with a few threads for
 * every process of the code. The cgroup limits are therefore the host's budget for all of that,
 * and the workspace's own limits are enforced inside the sandbox, where hitting them ends the
 * code, never the sandbox: processes by RLIMIT_NPROC (gVisor enforces it for the sandbox's own
 * uid), memory by the runner's watchdog (KILN_MEMORY_LIMIT_BYTES, read against gVisor's own
 * accounting in /proc/meminfo). Measured here (ptrace platform): an idle sandbox is ~44 host
 * tasks, a sleeping process ~5 more, but a busy one up to ~31 (a 64-process fork bomb peaked at
 * 2,010). The host budget is capped, so that no sandbox can take a large share of the host's
 * pid space (kernel.pid_max, 32,768 by default): past ~95 busy processes, a fork bomb ends the
 * sandbox (reported as SandboxLost; the session gets a fresh one) instead of meeting the limit.
 */
const GVISOR_TASKS_PER_PROCESS = 40;
const GVISOR_BASE_TASKS = 256;
const GVISOR_MAX_HOST_TASKS = 4096;
const GVISOR_MEMORY_RESERVE_MB = 96;

/** The host cgroup's memory and pid budget for a sandbox of these limits in this runtime. */
function hostLimits(limits: SandboxLimits, runtime: SandboxRuntime): { memoryMb: number; pids: number } {
  if (runtime !== 'gvisor') return { memoryMb: limits.memoryMb, pids: limits.pids };
  return {
    memoryMb: limits.memoryMb + Math.max(GVISOR_MEMORY_RESERVE_MB, Math.ceil(limits.memoryMb / 8)),
    pids: Math.min(limits.pids * GVISOR_TASKS_PER_PROCESS + GVISOR_BASE_TASKS, GVISOR_MAX_HOST_TASKS),
  };
}
const NOFILE = 1024;

export interface SpecInput {
  image: string;
  name: string;
  limits: SandboxLimits;
  labels: Record<string, string>;
  /** The sandbox's own uid (and gid), from SANDBOX_UID_MIN on. */
  uid: number;
  runtime: SandboxRuntime;
  /** A host directory (its own tmpfs) bind-mounted at /workspace instead of the container's tmpfs. */
  workspaceDir?: string;
  /** With network allowlist: the sandbox's own internal network and its address on it; unset, no network. */
  network?: SandboxNetwork;
  /** With fair share: its team's cgroup (cgroups.ts); unset, Docker's default parent. */
  cgroupParent?: string;
  /**
   * A gVisor sandbox with network allowlist (it has no network): the host directory of its egress
   * bridge's socket, mounted read-only at `bridgeMount`, where its main process, the in-sandbox bridge,
   * connects.
   */
  bridge?: { dir: string; mount: string };
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
export function containerSpec({
  image,
  name,
  limits,
  labels,
  uid,
  runtime,
  workspaceDir,
  network,
  cgroupParent,
  bridge,
}: SpecInput): Docker.ContainerCreateOptions {
  const net = networkSpec(network);
  const tmpfs = (mb: number, extra = '') => `rw,nosuid,nodev,size=${mb}m${extra}`;
  const owned = `,uid=${uid},gid=${uid},mode=0755`;
  const sizes = tmpfsSizes(limits);
  const host = hostLimits(limits, runtime);
  // Under gVisor: the workspace's limits, enforced inside the sandbox (see hostLimits).
  const inside =
    runtime === 'gvisor'
      ? {
          env: [`KILN_MEMORY_LIMIT_BYTES=${limits.memoryMb * MiB}`],
          ulimits: [{ Name: 'nproc', Soft: limits.pids, Hard: limits.pids }],
        }
      : { env: [], ulimits: [] };
  return {
    name,
    Image: image,
    Cmd: bridge ? BRIDGE_CMD : ['sleep', 'infinity'],
    User: KEEPER_USER,
    WorkingDir: '/workspace',
    Env: [
      'HOME=/home/sandbox',
      'MPLCONFIGDIR=/tmp/.matplotlib',
      'PYTHONDONTWRITEBYTECODE=1',
      'LANG=C.UTF-8',
      ...inside.env,
    ],
    Labels: labels,
    NetworkDisabled: net.NetworkDisabled,
    ...(net.NetworkingConfig ? { NetworkingConfig: net.NetworkingConfig } : {}),
    AttachStdin: false,
    AttachStdout: false,
    AttachStderr: false,
    HostConfig: {
      // Unset for runc: the engine's default runtime. gVisor sandboxes have no network.
      ...(runtime === 'gvisor' ? { Runtime: bridge ? GVISOR_EGRESS_RUNTIME : GVISOR_NONET_RUNTIME } : {}),
      NetworkMode: net.NetworkMode,
      ...(cgroupParent ? { CgroupParent: cgroupParent } : {}),
      ...(net.Dns ? { Dns: net.Dns, DnsOptions: net.DnsOptions } : {}),
      CapDrop: ['ALL'],
      SecurityOpt: ['no-new-privileges'],
      Privileged: false,
      ReadonlyRootfs: true,
      Tmpfs: {
        '/tmp': tmpfs(sizes.tmp, owned),
        ...(workspaceDir ? {} : { '/workspace': tmpfs(sizes.workspace, owned) }),
        '/home/sandbox': tmpfs(sizes.home, owned),
      },
      // The host's own tmpfs for this sandbox (sized and flagged as the one above would be); a
      // private bind, so nothing mounted under it later on either side propagates to the other.
      Mounts: [
        ...(workspaceDir
          ? [
              {
                Type: 'bind' as const,
                Source: workspaceDir,
                Target: '/workspace',
                ReadOnly: false,
                BindOptions: { Propagation: 'rprivate' as const },
              },
            ]
          : []),
        ...(bridge
          ? [
              {
                Type: 'bind' as const,
                Source: bridge.dir,
                Target: bridge.mount,
                ReadOnly: true,
                BindOptions: { Propagation: 'rprivate' as const },
              },
            ]
          : []),
      ],
      Memory: host.memoryMb * MiB,
      MemorySwap: host.memoryMb * MiB,
      NanoCpus: Math.round(limits.cpus * 1e9),
      PidsLimit: host.pids,
      Ulimits: [
        { Name: 'nofile', Soft: NOFILE, Hard: NOFILE },
        { Name: 'fsize', Soft: limits.diskMb * MiB, Hard: limits.diskMb * MiB },
        ...inside.ulimits,
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
export function updateSpec(limits: SandboxLimits, runtime: SandboxRuntime) {
  const host = hostLimits(limits, runtime);
  return {
    Memory: host.memoryMb * MiB,
    MemorySwap: host.memoryMb * MiB,
    NanoCpus: Math.round(limits.cpus * 1e9),
    PidsLimit: host.pids,
  };
}

/**
 * Limits that can only be set when a container is created (tmpfs sizes, which follow disk and
 * memory; ulimits). Under gVisor also memory and pids: the sandbox enforces them inside, from
 * what it was created with (see container-spec.ts).
 */
export const sameShape = (a: SandboxLimits, b: SandboxLimits, runtime: SandboxRuntime) =>
  JSON.stringify(tmpfsSizes(a)) === JSON.stringify(tmpfsSizes(b)) &&
  (runtime !== 'gvisor' || (a.memoryMb === b.memoryMb && a.pids === b.pids));
