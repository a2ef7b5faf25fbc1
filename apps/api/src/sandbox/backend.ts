import type { Readable, Writable } from 'node:stream';
import type { SandboxLimits } from './limits.ts';

/**
 * What the warm pool, the claims and the reaper need from a container runtime. Every sandbox
 * container carries what is in its request (sandbox id, owner, team, session, expiry) where
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
  /** Resolves when the runtime answers within `timeoutMs`, rejects with the reason otherwise. */
  ping(timeoutMs?: number): Promise<void>;
  /** Whether an error this backend threw says the container no longer exists or no longer runs. */
  isGone(err: unknown): boolean;
  /**
   * An allowlist sandbox's new patterns: its next request through the egress proxy obeys them.
   * Backends without egress do not implement the egress methods (their sandboxes have no network).
   */
  setAllow?(container: SandboxContainer, allow: readonly string[]): Promise<void>;
  /** The egress requests the container made (allowed and refused) that the proxy has logged and no call took yet. */
  takeEgress?(container: SandboxContainer): Promise<EgressEvent[]>;
  /**
   * Removes the egress networks of an owner's sandboxes whose container is gone; with `all`
   * (start-up, shutdown: none of its sandboxes is live), its proxy and every network of it.
   */
  sweepEgress?(owner: string, opts?: { all?: boolean }): Promise<void>;
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

export interface ContainerRequest {
  image: string;
  /** The sandbox (row in `sandboxes`) the container is for. */
  sandboxId: string;
  /** The API instance creating it. */
  owner: string;
  /** The team and session it is created for; empty for a warm container. */
  teamId: string;
  sessionId: string;
  /** Its hard lifetime: past this, any replica of the installation removes it. */
  expiresAt: Date;
  limits: SandboxLimits;
  /** Unset: no network (what every warm container has). */
  network?: ContainerNetwork;
}

/** A created container: the runtime's id for it and the uid its runner and code run as. */
export interface SandboxContainer {
  id: string;
  uid: number;
  /**
   * With network allowlist: the proxy URL (with this sandbox's own credentials) its
   * interpreter gets as HTTP_PROXY / HTTPS_PROXY at every execution.
   */
  proxyUrl?: string;
}

/** A sandbox container found in the runtime, with what its request recorded on it. */
export interface ListedContainer {
  id: string;
  /** Empty when it carries none. */
  sandboxId: string;
  owner: string;
  /** Epoch milliseconds; undefined when unreadable (such a container is never past its lifetime). */
  expiresAt: number | undefined;
}

/** The runner process's stdio, however the runtime reaches it. */
export interface RunnerChannel {
  /** Frames to the runner; ending it tells the runner to clean up and exit. */
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  /** Drops the connection at once. */
  destroy(): void;
  /** Calls back once the connection has ended (without an error) or failed; at once if it already has. */
  onClose(listener: (err?: Error) => void): void;
}

export interface Usage {
  memoryBytes: number;
  cpuPercent: number | null;
}
