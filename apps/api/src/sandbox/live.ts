import { and, eq, inArray, ne, type SQL, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { sandboxes } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { ContainerNetwork, SandboxBackend } from './backend.ts';
import type { Containers, Sandbox } from './containers.ts';
import type { SandboxLimits } from './limits.ts';
import type { WarmPool } from './pool.ts';
import { ACTIVE, markRemoved } from './rows.ts';
import { RunnerGoneError } from './runner-client.ts';
import { copyTree, WORKSPACE_TOO_LARGE } from './copy-tree.ts';
import { tarChunks } from './tar.ts';
import { readHead } from '../workspace/git.ts';
import type { SandboxRuntime } from '../workspace/settings.ts';

export interface ExecContext {
  teamId: string;
  workspaceId: string;
  sessionId: string;
  runId?: string;
  /** The workspace's directory on this host: copied into /workspace when the sandbox is claimed. */
  workspaceDir?: string;
  /** The workspace's idle time (its `sandbox.idle_s`, capped); unset, the server's. */
  idleMs?: number;
  /** The workspace's `sandbox.runtime`: a new sandbox runs in it. */
  runtime: SandboxRuntime;
  /** The workspace's `sandbox.template`: a new sandbox gets that template's image in service. */
  template?: string | null;
  /** The workspace's network (`sandbox.network` and `allow`, as the server permits); unset, none. */
  network?: ContainerNetwork;
}

/** The image in service of a team's template (throws the API's error when it has none). */
export interface TemplateImages {
  imageOf(teamId: string, templateId: string): Promise<string>;
}

const modeOf = (n: ContainerNetwork | undefined) => n?.mode ?? 'none';

/** A session's sandbox. */
export interface Live extends Sandbox {
  teamId: string;
  sessionId: string;
  /** Reclaimed once idle (not busy) past lastUsed + idleMs; the row's last_used_at and expires_at mirror both. */
  lastUsed: number;
  idleMs: number;
  busy: boolean;
  /** Serialises executions: one interpreter runs one cell at a time. */
  queue: Promise<unknown>;
  /** This sandbox replaces one the session lost: its first result must say the state is gone. */
  replacesLost: boolean;
  workspaceId: string;
  /** /workspace holds a copy of the workspace that is synced back after each execution. */
  synced: boolean;
  /** Its network mode, fixed when the container was created; `allow` is pushed to the proxy before each execution. */
  network: ContainerNetwork;
}

export interface LiveOptions {
  image: string;
  /** This API instance: the owner of the rows and containers it creates. */
  owner: string;
  idleMs: number;
  perTeamMax: number;
  now: () => number;
}

export interface LiveDeps {
  db: Db;
  backend: SandboxBackend;
  containers: Containers;
  pool: WarmPool;
  log: Logger;
}

type FileWrite = { path: string; data: Buffer | null };

/**
 * The live sandboxes of this instance, one per session: claimed from the warm pool or created
 * cold (under the team's cap), recorded in `sandboxes`, kept up to date with commits made
 * elsewhere, and released.
 */
export class LiveSandboxes {
  private readonly bySession = new Map<string, Live>();
  private readonly acquiring = new Map<string, Promise<Live>>();
  /** Sandbox ids whose container is being claimed for a session right now: never reaped. */
  private readonly claiming = new Set<string>();
  private stopped = false;
  constructor(
    private readonly deps: LiveDeps,
    private readonly opts: LiveOptions,
    /** Templates' images in service; without, every sandbox gets the base image. */
    private readonly templates?: TemplateImages,
  ) {}

  get(sessionId: string): Live | undefined {
    return this.bySession.get(sessionId);
  }

  /** A view, not a copy: a sandbox released while iterating is skipped, one claimed meanwhile is seen. */
  values(): IterableIterator<Live> {
    return this.bySession.values();
  }

  isClaiming(sandboxId: string): boolean {
    return this.claiming.has(sandboxId);
  }

  /** Refuses new claims and waits for those under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.allSettled([...this.acquiring.values()]);
  }

  /** The session's live sandbox, or a new one: from the warm pool when its shape fits, else cold. */
  acquire(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    const existing = this.bySession.get(ctx.sessionId);
    // A container's network cannot change: another mode takes a new sandbox (claimOnce releases this one).
    if (existing?.client.alive && modeOf(existing.network) === modeOf(ctx.network)) {
      if (ctx.network) existing.network = ctx.network;
      // The workspace's idle time as of this use: a settings change reaches the sandbox here at the latest.
      existing.idleMs = ctx.idleMs ?? this.opts.idleMs;
      return Promise.resolve(existing);
    }
    let pending = this.acquiring.get(ctx.sessionId);
    if (!pending) {
      pending = this.claim(ctx, limits).finally(() => this.acquiring.delete(ctx.sessionId));
      this.acquiring.set(ctx.sessionId, pending);
    }
    return pending;
  }

  /** Writes (or, with null, deletes) files in the live sandboxes of a workspace, except one session's. */
  async pushToWorkspace(workspaceId: string, files: FileWrite[], exceptSession?: string): Promise<void> {
    const targets = [...this.bySession.values()].filter(
      (l) => l.workspaceId === workspaceId && l.synced && l.sessionId !== exceptSession && l.client.alive,
    );
    await Promise.all(targets.map((l) => this.pushTo(l, files)));
  }

  /** Writes (or deletes) files in one session's sandbox, e.g. what the host undid or redacted. */
  async pushToSession(sessionId: string, files: FileWrite[]): Promise<void> {
    const live = this.bySession.get(sessionId);
    if (live?.synced && live.client.alive) await this.pushTo(live, files);
  }

  private async pushTo(live: Live, files: FileWrite[]): Promise<void> {
    await (live.queue = live.queue
      .then(async () => {
        for (const f of files) {
          const target = `/workspace/${f.path}`;
          if (f.data) await live.client.putFile(target, f.data);
          else await live.client.deleteFile(target);
        }
      })
      .catch((err) => {
        this.deps.log.warn({ err, sandbox: live.id }, 'could not update a sandbox copy of the workspace');
      }));
  }

  /** Ends the session's sandbox: closes the runner, removes the container, marks the row. */
  async release(sessionId: string, reason: string): Promise<void> {
    const { db, containers } = this.deps;
    const live = this.bySession.get(sessionId);
    if (live) {
      this.bySession.delete(sessionId);
      await containers.destroy(live);
      await markRemoved(db, [live.id], reason);
    } else {
      const rows = await db
        .select({ id: sandboxes.id })
        .from(sandboxes)
        .where(
          and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.owner, this.opts.owner), ne(sandboxes.state, 'removed')),
        );
      await markRemoved(
        db,
        rows.map((r) => r.id),
        reason,
      );
    }
  }

  /**
   * A sandbox for the session. A warm container that turns out to be gone when it is claimed
   * (removed or killed behind this server's back: its runner answers no more) is thrown away
   * and the claim tried again with the next one, or a cold one: the caller never sees it.
   */
  private async claim(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    for (;;) {
      try {
        return await this.claimOnce(ctx, limits);
      } catch (err) {
        if (!(err instanceof WarmGone)) throw err;
        this.deps.log.warn(
          { sandbox: err.sandbox, reason: err.message },
          'a warm sandbox was gone when claimed; claiming another',
        );
      }
    }
  }

  private async claimOnce(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    const { db, containers, pool, log } = this.deps;
    if (this.stopped) throw new ApiError('sandbox_unavailable', 'the server is shutting down');
    const stale = this.bySession.get(ctx.sessionId);
    if (stale) await this.release(ctx.sessionId, stale.client.alive ? 'network_changed' : 'runner_lost');
    const image =
      ctx.template && this.templates ? await this.templates.imageOf(ctx.teamId, ctx.template) : this.opts.image;
    // The warm pool holds containers without a network only: an allowlist sandbox is created cold.
    // First choice, one already filled with this workspace at its HEAD (no copy at all).
    const key = { runtime: ctx.runtime };
    const offNet = modeOf(ctx.network) === 'none';
    const head = ctx.workspaceDir ? readHead(ctx.workspaceDir) : null;
    const warm = offNet
      ? (ctx.workspaceDir && pool.takePrepared(limits, key, image, { id: ctx.workspaceId, head })) ||
        pool.take(limits, key, image, ctx.teamId)
      : undefined;
    const id = warm?.id ?? newId('sbx');
    // Between the pool and the live map, a claimed container belongs to no list the reaper knows.
    this.claiming.add(id);
    // The database bookkeeping and the container start run side by side: a cold start costs
    // the slower of the two, not their sum. Over the cap, the container is thrown away.
    const container: Promise<Sandbox> = warm
      ? this.fit(warm, limits)
      : containers.create(id, limits, ctx.runtime, {
          session: {
            teamId: ctx.teamId,
            sessionId: ctx.sessionId,
            network: modeOf(ctx.network) === 'none' ? undefined : ctx.network,
          },
          copyFrom: ctx.workspaceDir,
          image,
        });
    const booked = this.reserve(id, ctx, limits, image).then(() => this.hadSandboxBefore(ctx.sessionId));
    const [c, lost] = await Promise.allSettled([container, booked]);
    try {
      if (c.status === 'rejected') throw c.reason;
      if (lost.status === 'rejected') {
        if (warm) {
          pool.giveBack(warm);
        } else {
          await containers.destroy(c.value);
        }
        throw lost.reason;
      }
      const containerId = c.value.container.id;
      await db
        .update(sandboxes)
        .set({ containerId, state: 'ready', lastUsedAt: new Date(this.opts.now()), expiresAt: this.idleExpiry(ctx) })
        .where(eq(sandboxes.id, id));
      // The first request to a warm runner is also the proof that it is still there.
      if (ctx.workspaceDir) await this.copyIn(c.value, ctx.workspaceDir);
      else if (warm) await c.value.client.ping();
      const live: Live = {
        ...c.value,
        teamId: ctx.teamId,
        sessionId: ctx.sessionId,
        workspaceId: ctx.workspaceId,
        synced: Boolean(ctx.workspaceDir),
        lastUsed: this.opts.now(),
        idleMs: ctx.idleMs ?? this.opts.idleMs,
        busy: false,
        queue: Promise.resolve(),
        replacesLost: lost.value,
        network: ctx.network ?? { mode: 'none' },
      };
      this.bySession.set(ctx.sessionId, live);
      live.client.onExit((reason) => {
        if (this.bySession.get(ctx.sessionId) !== live || reason === 'closed') return;
        log.warn({ sandbox: live.id, reason }, 'sandbox runner exited');
      });
      return live;
    } catch (err) {
      if (lost.status === 'fulfilled') await db.delete(sandboxes).where(eq(sandboxes.id, id));
      if (c.status === 'fulfilled' && lost.status === 'fulfilled') await containers.destroy(c.value);
      else if (warm && c.status === 'rejected') await containers.destroy(warm);
      if (warm && lost.status === 'fulfilled' && this.containerGone(err)) {
        throw new WarmGone(warm.id, (err as Error).message);
      }
      throw err;
    } finally {
      this.claiming.delete(id);
      // Only a claim that got its sandbox counts for the warm order: one refused (at the team's
      // maximum, say) would otherwise move its team to the front and push another's container out.
      const claimed = this.bySession.get(ctx.sessionId)?.id === id;
      if (claimed) pool.claimedBy(ctx.teamId, image);
      pool.fill();
      // The workspace's next session gets a container filled with its tree ahead of time, when
      // the pool's containers fit it (another runtime or shape could never take one).
      if (claimed && ctx.workspaceDir && offNet && pool.serves(limits, key))
        pool.prepare(ctx.workspaceId, ctx.teamId, ctx.workspaceDir, image);
    }
  }

  /**
   * The workspace's working tree into the sandbox's /workspace, before any code of the session
   * runs there: copied by the host into the sandbox's own mounted directory when it has one
   * (the runner then only takes the manifest of what it finds), else as a tar through the
   * runner's frames. A runner that is gone fails either way, before anything is copied.
   */
  private async copyIn(sandbox: Sandbox, workspaceDir: string): Promise<void> {
    if (!sandbox.workspaceDir) {
      await sandbox.client.syncIn(tarChunks(workspaceDir)).catch((err: Error) => {
        // Unpacking ran out of room in the sandbox's /workspace: the tenant's to shrink (or size up), not a 500.
        if (err instanceof RunnerGoneError || !/\[Errno 28\]/.test(err.message)) throw err;
        throw new ApiError('payload_too_large', WORKSPACE_TOO_LARGE);
      });
      return;
    }
    const t0 = performance.now();
    // A cold start copied while its container started (containers.ts); a warm one copies now.
    await sandbox.client.ping();
    const copied = sandbox.filled
      ? 'while starting'
      : await copyTree(workspaceDir, sandbox.workspaceDir, sandbox.container.uid);
    const t1 = performance.now();
    await sandbox.client.syncLocal();
    const ms = (t: number) => Math.round(t * 10) / 10;
    this.deps.log.debug(
      { sandbox: sandbox.id, copied, copy_ms: ms(t1 - t0), manifest_ms: ms(performance.now() - t1) },
      'workspace copied into the sandbox',
    );
  }

  /** The warm container with the session's limits (those a running container can change, applied if they differ). */
  private async fit(warm: Sandbox, limits: SandboxLimits): Promise<Sandbox> {
    if (!sameLimits(warm.limits, limits)) await this.deps.backend.update(warm.container, limits);
    return { ...warm, limits };
  }

  /** The runner stopped answering, or the container no longer exists or no longer runs. */
  private containerGone(err: unknown): boolean {
    return err instanceof RunnerGoneError || this.deps.backend.isGone(err);
  }

  /** Did this session already lose a sandbox? Then its new one must say the state is gone. */
  private async hadSandboxBefore(sessionId: string): Promise<boolean> {
    const rows = await this.deps.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.state, 'removed')))
      .limit(1);
    return rows.length > 0;
  }

  /** Inserts the sandbox row first, then counts: concurrent claims can never exceed the team cap. */
  private async reserve(id: string, ctx: ExecContext, limits: SandboxLimits, image: string): Promise<void> {
    const { db } = this.deps;
    await db.insert(sandboxes).values({
      id,
      teamId: ctx.teamId,
      workspaceId: ctx.workspaceId,
      sessionId: ctx.sessionId,
      owner: this.opts.owner,
      limits,
      containerId: '',
      image,
      runtime: ctx.runtime,
      state: 'starting',
      expiresAt: this.idleExpiry(ctx),
    });
    const active = await db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.teamId, ctx.teamId), inArray(sandboxes.state, ACTIVE)))
      .orderBy(sandboxes.createdAt, sandboxes.id);
    const rank = active.findIndex((r) => r.id === id);
    if (rank >= this.opts.perTeamMax) {
      await db.delete(sandboxes).where(eq(sandboxes.id, id));
      const message =
        `this team already has ${this.opts.perTeamMax} live sandboxes; ` +
        'end a session or wait for idle ones to be reclaimed';
      throw new ApiError('sandbox_unavailable', message, {}, { 'Retry-After': '5' });
    }
  }

  private idleExpiry(ctx: ExecContext): Date {
    return new Date(this.opts.now() + (ctx.idleMs ?? this.opts.idleMs));
  }

  /** The sandbox was used (or kept alive) now: its idle deadline moves to now + its idle time, here and in its row. */
  async touch(live: Live): Promise<void> {
    live.lastUsed = this.opts.now();
    await this.saveDeadline(live);
  }

  /** A workspace's idle time changed: its sandboxes here take it at once, counted from their last use. */
  async setIdle(workspaceId: string, idleMs: number): Promise<void> {
    for (const l of this.bySession.values()) if (l.workspaceId === workspaceId) l.idleMs = idleMs;
    // Every replica's rows: another replica takes up the new deadlines at its next reaper pass.
    await this.deps.db
      .update(sandboxes)
      .set({ expiresAt: sql`${sandboxes.lastUsedAt} + ${idleMs} * interval '1 millisecond'` })
      .where(and(eq(sandboxes.workspaceId, workspaceId), ne(sandboxes.state, 'removed')));
  }

  /**
   * Keeps a session's sandbox of another replica alive through its row (that replica takes the
   * deadline up at its next reaper pass). Returns the sandboxes kept, with their container.
   */
  async touchElsewhere(sessionId: string, idleMs: number): Promise<{ id: string; containerId: string }[]> {
    const now = this.opts.now();
    return this.deps.db
      .update(sandboxes)
      .set({ lastUsedAt: new Date(now), expiresAt: new Date(now + idleMs) })
      .where(
        and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.state, 'ready'), ne(sandboxes.owner, this.opts.owner)),
      )
      .returning({ id: sandboxes.id, containerId: sandboxes.containerId });
  }

  /** The statement that writes the sandbox's idle deadline into its row, where listings and other replicas read it. */
  deadlineWrite(live: Live): SQL {
    return this.deps.db
      .update(sandboxes)
      .set({ lastUsedAt: new Date(live.lastUsed), expiresAt: new Date(live.lastUsed + live.idleMs) })
      .where(and(eq(sandboxes.id, live.id), ne(sandboxes.state, 'removed')))
      .getSQL();
  }

  async saveDeadline(live: Live): Promise<void> {
    await this.deps.db.execute(this.deadlineWrite(live));
  }

  /**
   * Takes up the deadlines other replicas wrote into the rows of this instance's sandboxes (a
   * keepalive or a settings change made there). A row older than what this instance knows
   * (an execution's deadline still being written) is ignored; one another replica marked removed
   * is released here too.
   */
  async adoptDeadlines(): Promise<void> {
    const byId = new Map([...this.bySession.values()].map((l) => [l.id, l]));
    if (!byId.size) return;
    const rows = await this.deps.db
      .select({
        id: sandboxes.id,
        state: sandboxes.state,
        lastUsedAt: sandboxes.lastUsedAt,
        expiresAt: sandboxes.expiresAt,
      })
      .from(sandboxes)
      .where(inArray(sandboxes.id, [...byId.keys()]));
    for (const r of rows) {
      const l = byId.get(r.id);
      if (!l) continue;
      // Another replica gave it up (it could not reach this one, http/replicas.ts): it goes here too.
      if (r.state === 'removed') {
        if (this.bySession.get(l.sessionId) === l) await this.release(l.sessionId, 'removed_elsewhere');
        continue;
      }
      if (r.lastUsedAt.getTime() < l.lastUsed) continue;
      l.lastUsed = r.lastUsedAt.getTime();
      l.idleMs = r.expiresAt.getTime() - l.lastUsed;
    }
  }
}

/** A warm container was gone when it was claimed: the claim is tried again. */
class WarmGone extends Error {
  constructor(
    readonly sandbox: string,
    message: string,
  ) {
    super(message);
  }
}

const sameLimits = (a: SandboxLimits, b: SandboxLimits) =>
  a.memoryMb === b.memoryMb && a.cpus === b.cpus && a.pids === b.pids && a.diskMb === b.diskMb;
