import type { Readable, Writable } from 'node:stream';
import type { SandboxRuntime } from '../workspace/settings.ts';
import type { SandboxLimits } from './limits.ts';

/**
 * What the warm pool, the claims and the reaper need from a container runtime. Every sandbox
 * container carries what is in its request (sandbox id, instance, team, session, expiry) where
 * every replica of every installation using the same runtime can read it back with `list`:
 * the reaper decides from that alone which containers are this installation's and which are
 * past their lifetime. Implementations: `docker/` (one Docker Engine).
 */
export interface SandboxBackend {
  /**
   * Creates (does not start) a hardened container for the request, whose runner and code run
   * as a uid no other live sandbox of this runtime has, other replicas' included.
   */
  create(req: ContainerRequest): Promise<SandboxContainer>;
  start(container: SandboxContainer): Promise<void>;
  /** Starts the runner in the running container, as the container's own uid, and connects to its stdio. */
  attachRunner(container: SandboxContainer): Promise<RunnerChannel>;
  /** Applies the limits that can change on a running container (memory, CPU, pids). */
  update(container: SandboxContainer, limits: SandboxLimits): Promise<void>;
  /** Removes a container, running or not; resolves once it is gone, also when it already was. */
  remove(containerId: string): Promise<void>;
  /** Every sandbox container of this runtime, whichever instance or installation created it. */
  list(): Promise<ListedContainer[]>;
  /** The container's memory and CPU use now; null when it cannot be read (e.g. it is gone). */
  stats(containerId: string): Promise<Usage | null>;
  /** What this backend can do (asked at start-up): shared code asks it rather than knowing the engine. */
  capabilities(): Promise<BackendCapabilities>;
  /**
   * For a backend whose capabilities change while it runs (a fleet whose nodes join and leave):
   * `listener` is called after each change, and the engine asks `capabilities()` again.
   */
  onCapabilities?(listener: () => void): void;
  /** The host's memory and CPUs, for placement across several backends (asked again and again). */
  capacity?(): Promise<{ memoryMb: number; cpus: number }>;
  /** Resolves when the runtime answers within `timeoutMs`, rejects with the reason otherwise. */
  ping(timeoutMs?: number): Promise<void>;
  /** Whether an error this backend threw says the container no longer exists or no longer runs. */
  isGone(err: unknown): boolean;
  /**
   * Checkpoints a pausable container (one created with `pausable`, whose runner was detached) to
   * its host's disk and stops it: its memory leaves the host's RAM. Resolves with the checkpoint's
   * size on disk, null when it cannot be read. Backends that cannot pause do not implement it.
   */
  pause?(container: SandboxContainer): Promise<{ bytes: number | null }>;
  /**
   * Starts a paused container from its checkpoint (deleted once restored: its memory is the
   * container's again) and connects to its runner, which kept everything it held. Its hard
   * lifetime now ends at `lifetimeEndsAt` (epoch ms: time paused does not count), later than its
   * container's record says: a host that reaps by itself (a node) keeps it until then.
   */
  resume?(container: SandboxContainer, lifetimeEndsAt: number): Promise<RunnerChannel>;
  /**
   * Connects again to the runner of a running pausable container, whose connection another
   * replica held (and lost with it): the runner, which kept everything, drops that connection
   * for this one once it proves itself with the key the runner was given. Backends that cannot
   * pause do not implement it.
   */
  reattach?(container: SandboxContainer): Promise<RunnerChannel>;
  /**
   * For a container with `treeMount`: fills its /workspace with the working tree at `dir` (of the
   * API's host) from the copy of workspace `workspaceId` the backend keeps on its host, sending it
   * only the files that changed (tree-sync.ts). Only while no code of the sandbox has run.
   */
  fillTree?(container: SandboxContainer, workspaceId: string, dir: string): Promise<void>;
  /** Builds the images of sandbox templates; a runtime without it has no templates. */
  readonly images?: ImageBuilder;
  /**
   * An allowlist sandbox's new patterns: its next request through the egress proxy obeys them.
   * Backends without egress do not implement the egress methods (their sandboxes have no network).
   */
  setAllow?(container: SandboxContainer, allow: readonly string[]): Promise<void>;
  /** The egress requests the container made (allowed and refused) that the proxy has logged and no call took yet. */
  takeEgress?(container: SandboxContainer): Promise<EgressEvent[]>;
  /**
   * Removes the egress networks of an instance's sandboxes whose container is gone; with `all`
   * (start-up, shutdown: none of its sandboxes is live), its proxy and every network of it.
   */
  sweepEgress?(instance: string, opts?: { all?: boolean }): Promise<void>;
}

/** What a backend can do; the engine, the pool and the routes decide from this. */
export interface BackendCapabilities {
  /**
   * Which of Kiln's sandbox runtimes it has (runc always; gvisor when it is registered), and for
   * each whether its sandboxes can have network allowlist (reach the egress proxy).
   */
  runtimes: RuntimeOffer[];
  /**
   * Its sandboxes can have a directory of the API's own host mounted at /workspace (the engine
   * then copies the working tree there); else the tree goes to the runner as a tar.
   */
  hostWorkspaceMounts: boolean;
  /**
   * Whether a sandbox created with `from` can be given `to` in place (`update`), as a warm one is
   * when a workspace claims it; else a claim with `to` starts a new one.
   */
  resizable(from: SandboxLimits, to: SandboxLimits, runtime: SandboxRuntime): boolean;
  /**
   * A container is bound for good to the team it is created for (its share of the host: fair
   * share's team cgroup, fixed at creation). Warm containers are then made for a team, and only
   * that team's sessions claim them; else they are made for no team and any team claims them.
   */
  teamBound: boolean;
}

/** A runtime a backend can run, and whether its sandboxes can reach the egress proxy. */
export interface RuntimeOffer {
  runtime: SandboxRuntime;
  egress: boolean;
  /** Its sandboxes (those without network) can be paused to disk and resumed with their memory (`pause`). */
  pause?: boolean;
  /** Why they cannot, when it is a runtime that could be paused on another host (said once in the log). */
  pauseOff?: string;
}

/** How a sandbox reaches the network: not at all, or through the egress proxy to the names listed. */
export type ContainerNetwork = { mode: 'none' } | { mode: 'allowlist'; allow: readonly string[] };

/** One request a sandbox made through the egress proxy, as the proxy logged it. */
export interface EgressEvent {
  host: string;
  port: number;
  method: string;
  allowed: boolean;
  /** The HTTP status the proxy answered (403 for a refusal; 200 for an established CONNECT). */
  status: number;
  /** Bytes the sandbox sent and received through the proxy. */
  bytes_out: number;
  bytes_in: number;
}

/** What a template's image is made of: the base image and what goes on top (every name already validated). */
export interface ImageRecipe {
  /** The base sandbox image's id. */
  base: string;
  /**
   * The base image by name (`KILN_SANDBOX_IMAGE`): a fleet's host builds on what this names there
   * (its base may have an id of its own: built there, or replaced since), `base` only where it has
   * no image of this name. Unset (a build queued by an older server): `base` only.
   */
  baseRef?: string;
  tag: string;
  labels: Record<string, string>;
  apt: string[];
  pip: string[];
  pipIndexUrl: string;
  /** The Debian mirror for apt; undefined keeps the base image's sources. */
  debianMirror?: string;
  files: { path: string; content: string }[];
  /** Where the files go in the image. */
  filesDir: string;
  /** Changes once a day, so that what apt knows of the mirror is at most a day old. */
  aptDay: string;
}

/** The label every template image carries (its value: the template definition's hash). */
export const TEMPLATE_LABEL = 'kiln.template';
/** The label of a sandbox image Kiln built from sandbox-image/ (its Dockerfile's LABEL). */
export const SANDBOX_IMAGE_LABEL = 'kiln.sandbox';

/** Builds and removes template images where the sandboxes run. */
export interface ImageBuilder {
  /** The image's id, or null when there is no such image. */
  idOf(ref: string): Promise<string | null>;
  /**
   * Each host it builds on builds on a base image of its own (a fleet): a template's hash names the
   * base of one of them only, so it cannot tell whether the base changed under a template.
   */
  readonly basePerHost?: boolean;
  /**
   * Builds the image, passing each line of output on; rejects with ImageBuildFailed when a step
   * fails or the build outlasts `timeoutMs`, with the signal's reason when it is aborted. A
   * builder over several hosts (a fleet) resolves with a `BuildShortfall` when the image is on
   * some of them and its build failed on the others.
   */
  build(
    recipe: ImageRecipe,
    opts: { onLine: (line: string) => void; timeoutMs: number; signal: AbortSignal },
  ): Promise<BuildShortfall | undefined>;
  /** Removes the image; one still in use by a container stays (resolves either way). */
  remove(ref: string): Promise<void>;
  /** The template images it has (tags of images labelled `kiln.template`). */
  held?(): Promise<string[]>;
  /**
   * Tells `listener` when where images are built changes (a fleet's host joins, or one that takes
   * sandboxes now has other images): templates already built are then built where they are missing.
   */
  onChange?(listener: () => void): void;
}

/** Where a build over several hosts failed, while the others have the image. */
export interface BuildShortfall {
  missingOn: { host: string; error: string }[];
}

/** A build that ran and failed: the message names the failing step and its error. */
export class ImageBuildFailed extends Error {}

export interface ContainerRequest {
  image: string;
  /** The sandbox (row in `sandboxes`) the container is for. */
  sandboxId: string;
  /** The API instance creating it. */
  instance: string;
  /** The team and session it is created for; empty for a warm container. */
  teamId: string;
  sessionId: string;
  /** Its hard lifetime: past this, any replica of the installation removes it. */
  expiresAt: Date;
  limits: SandboxLimits;
  /** runc (the engine's default runtime) or gvisor (runsc, with no network). */
  runtime: SandboxRuntime;
  /**
   * A directory of the runtime's host to bind-mount at /workspace instead of the container's
   * own tmpfs (workspace-mounts.ts: already a size-limited, nosuid, nodev tmpfs); unset, the tmpfs.
   */
  workspaceDir?: string;
  /**
   * Asks for /workspace as a mount of the backend's own host that `fillTree` fills from the copy
   * of the workspace it keeps (a sandbox node); a backend (or fleet member) without one ignores it,
   * and the container's `treeMount` says which it got.
   */
  treeMount?: boolean;
  /** Unset: no network (what every warm container has). */
  network?: ContainerNetwork;
  /**
   * It may be paused (its runtime offers `pause`): its runner then lives apart from the runtime's
   * connection to it, so that a checkpoint can take it along.
   */
  pausable?: boolean;
}

/** A created container: the runtime's id for it and the uid its runner and code run as. */
export interface SandboxContainer {
  id: string;
  uid: number;
  runtime: SandboxRuntime;
  /** It can be paused (see ContainerRequest.pausable). */
  pausable?: boolean;
  /**
   * With network allowlist: the proxy URL (with this sandbox's own credentials) its
   * interpreter gets as HTTP_PROXY / HTTPS_PROXY at every execution.
   */
  proxyUrl?: string;
  /** Its /workspace is a mount of its host that `fillTree` fills (ContainerRequest.treeMount). */
  treeMount?: boolean;
}

/** A sandbox container found in the runtime, with what its request recorded on it. */
export interface ListedContainer {
  id: string;
  /** Empty when it carries none. */
  sandboxId: string;
  instance: string;
  /** Epoch milliseconds; undefined when unreadable (such a container is never past its lifetime). */
  expiresAt: number | undefined;
  /** A pausable container that is not running: paused (checkpointed), or ended and waiting to be reaped. */
  stopped?: boolean;
}

/**
 * Why a runner's connection failed when the host it runs on stopped answering and its connection
 * was dropped (a sandbox node gone silent): the sandbox is recorded `node_lost`, not `runner_lost`.
 */
export class HostLost extends Error {}

/** The runner process's stdio, however the runtime reaches it. */
export interface RunnerChannel {
  /** Frames to the runner; ending it tells the runner to clean up and exit. */
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  /** Drops the connection at once. */
  destroy(): void;
  /**
   * Calls back once the connection has ended (without an error) or failed; at once if it already
   * has. A `HostLost` error: the sandbox's host stopped answering and its connection was dropped.
   */
  onClose(listener: (err?: Error) => void): void;
}

export interface Usage {
  memoryBytes: number;
  cpuPercent: number | null;
}
