import type { Logger } from 'pino';
import { ApiError } from '../lib/errors.ts';
import type { SandboxRuntime } from '../workspace/settings.ts';
import type { ContainerRequest, SandboxBackend, SandboxContainer } from './backend.ts';
import { copyTree } from './copy-tree.ts';
import { type SandboxLimits, tmpfsSizes } from './limits.ts';
import { RunnerClient, RunnerOutdated } from './runner-client.ts';
import type { WorkspaceMounts } from './workspace-mounts.ts';

/** A started container with a ready runner, warm or a session's. */
export interface Sandbox {
  id: string;
  container: SandboxContainer;
  client: RunnerClient;
  limits: SandboxLimits;
  runtime: SandboxRuntime;
  /** The image it runs: the base sandbox image or a template's. */
  image: string;
  /** Its hard lifetime (epoch ms), as its container records it for every replica's reaper. */
  expiresAt: number;
  /** The host directory mounted at its /workspace (workspace-mounts.ts); unset, the container's own tmpfs. */
  workspaceDir?: string;
  /** Its /workspace (this host's mount, or the backend's: `container.treeMount`) already holds the workspace it was created for (a cold start). */
  filled?: boolean;
  /** A warm container made for one team (a team-bound backend: fair share): only that team claims it. */
  forTeam?: string;
}

/** A cold start's workspace: its working tree on this host, copied into the new sandbox as it starts. */
type Copy = { dir: string; workspaceId: string };
/** The team and session a container is created for; empty for a warm one. */
type SessionOf = Pick<ContainerRequest, 'teamId' | 'sessionId' | 'network'>;
/** What one container is made of. */
type Spec = { limits: SandboxLimits; runtime: SandboxRuntime; session: SessionOf; image: string };
const WARM: SessionOf = { teamId: '', sessionId: '' };

export interface ContainerOptions {
  image: string;
  /** This API instance, recorded on every container it creates. */
  instance: string;
  maxLifetimeMs: number;
  now: () => number;
}

/** Creates sandboxes (container and runner) through the backend, and ends them. */
export class Containers {
  /** Sandbox ids whose container is being created right now: never reaped. */
  private readonly creating = new Set<string>();
  /** Host workspace mounts, when this host can make them (decided once at start-up); else the tar path. */
  private mounts: WorkspaceMounts | null = null;
  /** The runtimes whose new containers are made pausable (decided at start-up). */
  private pausable = new Set<SandboxRuntime>();

  constructor(
    private readonly backend: SandboxBackend,
    private readonly opts: ContainerOptions,
    private readonly log: Logger,
  ) {}

  /** Whether containers get a host workspace mount (decided at start-up). */
  get mountsWorkspaces(): boolean {
    return this.mounts !== null;
  }

  isCreating(sandboxId: string): boolean {
    return this.creating.has(sandboxId);
  }

  /** From now on, containers get a host workspace mount (null: the container's tmpfs and the tar copy). */
  useMounts(mounts: WorkspaceMounts | null): void {
    this.mounts = mounts;
  }

  /** From now on, containers of these runtimes are made pausable (live.ts pauses them at idle). */
  usePause(runtimes: readonly SandboxRuntime[]): void {
    this.pausable = new Set(runtimes);
  }

  /** Takes over another replica's workspace mount with its sandbox (WorkspaceMounts.adoptForeign); false without host mounts. */
  adoptMount(sandboxId: string, dir: string): Promise<boolean> {
    return this.mounts ? this.mounts.adoptForeign(sandboxId, dir) : Promise.resolve(false);
  }

  /** Removes the workspace mounts of sandboxes `keep` does not claim (see WorkspaceMounts.sweep). */
  async sweepMounts(
    keep: (sandboxId: string) => boolean,
    elsewhere?: (sandboxIds: string[]) => Promise<Set<string>>,
  ): Promise<number> {
    return this.mounts ? this.mounts.sweep((id) => this.creating.has(id) || keep(id), elsewhere) : 0;
  }

  /**
   * Creates, starts and connects to a hardened container of `image` (default: the base sandbox
   * image); a warm one is for no team or session yet. With `copyFrom` (a cold start for a session)
   * and a host workspace mount (or one of the backend's host: `fillTree`), the working tree is
   * copied into the mount while the container starts, so the copy costs no time of its own.
   */
  async create(
    id: string,
    limits: SandboxLimits,
    runtime: SandboxRuntime,
    o: { session?: SessionOf; copyFrom?: Copy; image?: string } = {},
  ): Promise<Sandbox> {
    this.creating.add(id);
    try {
      return await this.createNow(
        id,
        { limits, runtime, session: o.session ?? WARM, image: o.image ?? this.opts.image },
        o.copyFrom,
      );
    } finally {
      this.creating.delete(id);
    }
  }

  private async createNow(id: string, spec: Spec, copyFrom?: Copy): Promise<Sandbox> {
    // Made (empty) before the container, so that a warm one has it from the start.
    const workspaceDir = await this.mounts?.create(id, tmpfsSizes(spec.limits).workspace);
    try {
      return await this.createIn(id, spec, workspaceDir, copyFrom);
    } catch (err) {
      if (workspaceDir) await this.removeMount(id);
      throw err;
    }
  }

  private async createIn(
    id: string,
    { limits, runtime, session, image }: Spec,
    workspaceDir: string | undefined,
    copyFrom: Copy | undefined,
  ): Promise<Sandbox> {
    const expiresAt = this.opts.now() + this.opts.maxLifetimeMs;
    const container = await this.backend.create({
      image,
      sandboxId: id,
      instance: this.opts.instance,
      ...session,
      expiresAt: new Date(expiresAt),
      limits,
      runtime,
      workspaceDir,
      // No mount of this host: one of the backend's own host, filled from its copy of the workspace.
      ...(!workspaceDir && this.backend.fillTree ? { treeMount: true } : {}),
      pausable: this.pausable.has(runtime),
    });
    let filling: Promise<unknown> | undefined;
    try {
      if (workspaceDir) await this.mounts?.own(workspaceDir, container.uid);
      // No code runs in the container before its first exec: the host is the mount's only writer meanwhile.
      if (workspaceDir && copyFrom) filling = copyTree(copyFrom.dir, workspaceDir, container.uid);
      else if (container.treeMount && copyFrom)
        filling = this.backend.fillTree!(container, copyFrom.workspaceId, copyFrom.dir);
      const [started, filled] = await Promise.allSettled([
        this.backend
          .start(container)
          .then(async () => RunnerClient.start(await this.backend.attachRunner(container), undefined, true)),
        filling,
      ]);
      if (started.status === 'rejected') throw started.reason;
      if (filled.status === 'rejected') {
        started.value.close();
        throw filled.reason;
      }
      return {
        id,
        container,
        client: started.value,
        limits,
        runtime,
        image,
        expiresAt,
        workspaceDir,
        filled: filling !== undefined,
      };
    } catch (err) {
      await this.backend.remove(container.id).catch(() => undefined);
      // A new sandbox of this image would be no better: the caller is told why, not that it failed.
      if (err instanceof RunnerOutdated) throw new ApiError('unavailable', `image ${image}: ${err.message}`);
      throw err;
    }
  }

  /** Closes the runner and removes the container, then its workspace mount. */
  async destroy(c: Sandbox): Promise<void> {
    c.client.close();
    const removed = await this.backend.remove(c.container.id).then(
      () => true,
      (err) => {
        this.log.warn({ err, sandbox: c.id }, 'could not remove sandbox container');
        return false;
      },
    );
    // A container that could not be removed keeps its mount: the reaper's sweep takes it with the container.
    if (removed && c.workspaceDir) await this.removeMount(c.id);
  }

  /** Removes the workspace mount of a sandbox whose container is gone (a paused one's, kept while it slept). */
  async removeMountOf(id: string): Promise<void> {
    if (this.mounts) await this.removeMount(id);
  }

  private async removeMount(id: string): Promise<void> {
    await this.mounts?.remove(id).catch((err) => {
      this.log.warn({ err, sandbox: id }, 'could not remove a sandbox workspace mount');
    });
  }
}
