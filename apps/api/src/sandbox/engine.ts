import { and, eq, inArray, ne, type SQL } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { sandboxes, sessions } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { SandboxBackend } from './backend.ts';
import { Containers, type Sandbox } from './containers.ts';
import { WarmPool } from './pool.ts';
import { DEFAULT_SETTINGS, type WorkspaceSettings } from '../workspace/settings.ts';
import { effectiveLimits, type SandboxLimits } from './limits.ts';
import { cancelledBeforeStart, notRun, RunnerGoneError, type OutputListener, type RunnerResult, type WorkspaceChanges } from './runner-client.ts';
import { tarWorkspace } from './tar.ts';
import { executionWrite, type ExecAudit } from './executions.ts';
import { combine } from '../db/batch.ts';

export interface EngineOptions {
  image: string;
  /** This API instance; containers carry it so replicas never reap each other's live sandboxes. */
  owner: string;
  poolSize: number;
  idleMs: number;
  maxLifetimeMs: number;
  perTeamMax: number;
  /** Server-wide maxima that cap every workspace's settings. */
  maxLimits: SandboxLimits;
  maxOutputBytes: number;
  reapIntervalMs: number;
  /** Clock for idle and lifetime decisions (injectable for tests). */
  now?: () => number;
}

export interface ExecContext {
  teamId: string;
  workspaceId: string;
  sessionId: string;
  runId?: string;
  /** The workspace's directory on this host: copied into /workspace when the sandbox is claimed. */
  workspaceDir?: string;
}

export interface ExecOptions {
  timeoutS?: number;
  /** Audit the execution in the same commit as its record. */
  audit?: ExecAudit;
  /** Do not write the record: return it as `record` for the caller to batch with its own writes. */
  deferRecord?: boolean;
  onOutput?: OutputListener;
  signal?: AbortSignal;
  /** What one step may sync back: the runner stops collecting changes one file past the cap. */
  sync?: { maxFiles: number; maxBytes: number };
}

export interface ExecOutcome extends Omit<RunnerResult, 'ok' | 'changes'> {
  sandbox_id: string;
  execution_id: string;
}

interface Live extends Sandbox {
  teamId: string;
  sessionId: string;
  lastUsed: number;
  busy: boolean;
  /** Serialises executions: one interpreter runs one cell at a time. */
  queue: Promise<unknown>;
  /** This sandbox replaces one the session lost: its first result must say the state is gone. */
  replacesLost: boolean;
  workspaceId: string;
  /** /workspace holds a copy of the workspace that is synced back after each execution. */
  synced: boolean;
}

const ACTIVE = ['starting', 'ready'] as const;

/**
 * Owns every sandbox container of this API instance: a warm pool of started containers with a
 * ready runner, one live sandbox per session (claimed from the pool or created cold), the
 * reaper that reconciles the container runtime (the backend) with the `sandboxes` table, and
 * the execution record.
 */
export class SandboxEngine {
  private live = new Map<string, Live>();
  private acquiring = new Map<string, Promise<Live>>();
  private readonly containers: Containers;
  private readonly pool: WarmPool;
  /** Sandbox ids whose container is being claimed for a session right now: never reaped. */
  private readonly claiming = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly db: Db,
    private readonly backend: SandboxBackend,
    private readonly opts: EngineOptions,
    private readonly log: Logger,
  ) {
    const { image, owner, maxLifetimeMs } = opts;
    this.containers = new Containers(backend, { image, owner, maxLifetimeMs, now: () => this.now() }, log);
    // Warm containers are created with the default settings, capped.
    this.pool = new WarmPool(this.containers, { size: opts.poolSize, limits: this.limitsFor(DEFAULT_SETTINGS.sandbox) }, log);
  }

  private now(): number {
    return this.opts.now ? this.opts.now() : Date.now();
  }

  /** A workspace's sandbox settings capped by the server-wide maxima. */
  limitsFor(settings: WorkspaceSettings['sandbox']): SandboxLimits {
    return effectiveLimits(settings, this.opts.maxLimits);
  }

  /** Reaps what a previous life of this instance left behind, fills the pool, starts the reaper. */
  async start(): Promise<void> {
    await this.reap({ startup: true });
    this.pool.fill();
    this.timer = setInterval(() => {
      this.reap().catch((err) => this.log.error({ err }, 'sandbox reaper failed'));
    }, this.opts.reapIntervalMs);
    this.timer.unref();
  }

  /** Removes every container of this instance: the runner streams die with the process anyway. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.pool.stop();
    clearInterval(this.timer);
    await Promise.allSettled([...this.acquiring.values()]);
    // A warm container still being started removes itself once it is up (`stopped`): wait for it,
    // or the process may exit and leave it running.
    await this.poolSettled();
    const live = [...this.live.values()];
    const warm = this.pool.drain();
    await Promise.allSettled([...live.map((l) => this.release(l.sessionId, 'shutdown')), ...warm.map((w) => this.containers.destroy(w))]);
  }

  get poolReady(): number {
    return this.pool.warm.length;
  }

  /** Resolves once the warm containers being started right now are ready (or failed). */
  poolSettled(): Promise<void> {
    return this.pool.settled();
  }

  /** Resolves when the container runtime answers, rejects with the reason otherwise. */
  ping(): Promise<void> {
    return this.backend.ping();
  }

  /** Runs code in the session's sandbox, creating or claiming one first when it has none. */
  async exec(ctx: ExecContext, limits: SandboxLimits, code: string, opts: ExecOptions = {}): Promise<ExecOutcome & { changes?: WorkspaceChanges; record?: SQL[] }> {
    const live = await this.acquire(ctx, limits);
    // The signal is checked at every hand-off (claimed and synced, dequeued, sent): an abort
    // while waiting has no listener to tell, and the code must then not run at all.
    const run = live.queue.then(() => this.execOn(live, ctx, code, opts));
    live.queue = run.catch(() => undefined);
    return run;
  }

  private async execOn(live: Live, ctx: ExecContext, code: string, opts: ExecOptions): Promise<ExecOutcome & { changes?: WorkspaceChanges; record?: SQL[] }> {
    const timeoutS = Math.min(opts.timeoutS ?? live.limits.timeoutS, live.limits.timeoutS);
    live.busy = true;
    let result: RunnerResult;
    try {
      result = opts.signal?.aborted ? cancelledBeforeStart() : await live.client.exec(code, {
        timeoutMs: timeoutS * 1000,
        maxOutputBytes: this.opts.maxOutputBytes,
        onOutput: opts.onOutput,
        signal: opts.signal,
        sync: live.synced,
        syncCaps: opts.sync,
      });
    } catch (err) {
      if (!(err instanceof RunnerGoneError)) throw err;
      this.log.warn({ sandbox: live.id, reason: err.message }, 'sandbox runner lost');
      await this.release(live.sessionId, 'runner_lost');
      result = lostResult(err.message);
    } finally {
      live.busy = false;
      live.lastUsed = this.now();
    }
    if (live.replacesLost) {
      result.restarted = true;
      live.replacesLost = false;
    }
    const rec = executionWrite({ teamId: ctx.teamId, sessionId: ctx.sessionId, sandboxId: live.id, runId: ctx.runId, code, result }, opts.audit);
    if (!opts.deferRecord) await this.db.execute(combine(rec.writes));
    const executionId = rec.id;
    const { ok: _ok, changes, ...rest } = result as RunnerResult & { ev?: string; id?: string };
    delete (rest as { ev?: string }).ev;
    delete (rest as { id?: string }).id;
    delete (rest as { code_sha256?: string }).code_sha256;
    return { ...rest, sandbox_id: live.id, execution_id: executionId, changes, record: opts.deferRecord ? rec.writes : undefined };
  }

  /** Writes (or, with null, deletes) files in the live sandboxes of a workspace, except one session's. */
  async pushToWorkspace(workspaceId: string, files: { path: string; data: Buffer | null }[], exceptSession?: string): Promise<void> {
    const targets = [...this.live.values()].filter((l) => l.workspaceId === workspaceId && l.synced && l.sessionId !== exceptSession && l.client.alive);
    await Promise.all(targets.map((l) => this.pushTo(l, files)));
  }

  /** Writes (or deletes) files in one session's sandbox, e.g. what the host undid or redacted. */
  async pushToSession(sessionId: string, files: { path: string; data: Buffer | null }[]): Promise<void> {
    const live = this.live.get(sessionId);
    if (live?.synced && live.client.alive) await this.pushTo(live, files);
  }

  private async pushTo(live: Live, files: { path: string; data: Buffer | null }[]): Promise<void> {
    await (live.queue = live.queue.then(async () => {
      for (const f of files) {
        const target = `/workspace/${f.path}`;
        if (f.data) await live.client.putFile(target, f.data);
        else await live.client.deleteFile(target);
      }
    }).catch((err) => this.log.warn({ err, sandbox: live.id }, 'could not update a sandbox copy of the workspace')));
  }

  async putFile(ctx: ExecContext, limits: SandboxLimits, path: string, data: Buffer): Promise<number> {
    const live = await this.acquire(ctx, limits);
    return live.client.putFile(path, data);
  }

  /** Reads a file in the session's running sandbox; null when it has none (a read never starts one). */
  async readLiveFile(sessionId: string, path: string): Promise<Buffer | null> {
    const live = this.live.get(sessionId);
    if (!live?.client.alive) return null;
    return live.client.getFile(path);
  }

  /** The session's live sandbox, or a new one: from the warm pool when its shape fits, else cold. */
  private acquire(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    const existing = this.live.get(ctx.sessionId);
    if (existing?.client.alive) return Promise.resolve(existing);
    let pending = this.acquiring.get(ctx.sessionId);
    if (!pending) {
      pending = this.claim(ctx, limits).finally(() => this.acquiring.delete(ctx.sessionId));
      this.acquiring.set(ctx.sessionId, pending);
    }
    return pending;
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
        this.log.warn({ sandbox: err.sandbox, reason: err.message }, 'a warm sandbox was gone when claimed; claiming another');
      }
    }
  }

  private async claimOnce(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    if (this.stopped) throw new ApiError('sandbox_unavailable', 'the server is shutting down');
    const stale = this.live.get(ctx.sessionId);
    if (stale) await this.release(ctx.sessionId, 'runner_lost');
    const warm = this.pool.take(limits);
    const id = warm?.id ?? newId('sbx');
    // Between the pool and the live map, a claimed container belongs to no list the reaper knows.
    this.claiming.add(id);
    // The database bookkeeping and the container start run side by side: a cold start costs
    // the slower of the two, not their sum. Over the cap, the container is thrown away.
    const container: Promise<Sandbox> = warm
      ? (sameLimits(warm.limits, limits) ? Promise.resolve() : this.backend.update(warm.container, limits)).then(() => ({ ...warm, limits }))
      : this.containers.create(id, limits, { teamId: ctx.teamId, sessionId: ctx.sessionId });
    const booked = this.reserve(id, ctx, limits).then(() => this.hadSandboxBefore(ctx.sessionId));
    const [c, lost] = await Promise.allSettled([container, booked]);
    try {
      if (c.status === 'rejected') throw c.reason;
      if (lost.status === 'rejected') {
        if (warm) {
          this.pool.giveBack(warm);
        } else {
          await this.containers.destroy(c.value);
        }
        throw lost.reason;
      }
      await this.db
        .update(sandboxes)
        .set({ containerId: c.value.container.id, state: 'ready', lastUsedAt: new Date(), expiresAt: this.idleExpiry() })
        .where(eq(sandboxes.id, id));
      // The first request to a warm runner is also the proof that it is still there.
      if (ctx.workspaceDir) await c.value.client.syncIn(await tarWorkspace(ctx.workspaceDir));
      else if (warm) await c.value.client.ping();
      const live: Live = {
        ...c.value,
        teamId: ctx.teamId,
        sessionId: ctx.sessionId,
        workspaceId: ctx.workspaceId,
        synced: Boolean(ctx.workspaceDir),
        lastUsed: this.now(),
        busy: false,
        queue: Promise.resolve(),
        replacesLost: lost.value,
      };
      this.live.set(ctx.sessionId, live);
      live.client.onExit((reason) => {
        if (this.live.get(ctx.sessionId) === live && reason !== 'closed') this.log.warn({ sandbox: live.id, reason }, 'sandbox runner exited');
      });
      return live;
    } catch (err) {
      if (lost.status === 'fulfilled') await this.db.delete(sandboxes).where(eq(sandboxes.id, id));
      if (c.status === 'fulfilled' && lost.status === 'fulfilled') await this.containers.destroy(c.value);
      else if (warm && c.status === 'rejected') await this.containers.destroy(warm);
      if (warm && lost.status === 'fulfilled' && this.containerGone(err)) throw new WarmGone(warm.id, (err as Error).message);
      throw err;
    } finally {
      this.claiming.delete(id);
      this.pool.fill();
    }
  }

  /** The runner stopped answering, or the container no longer exists or no longer runs. */
  private containerGone(err: unknown): boolean {
    return err instanceof RunnerGoneError || this.backend.isGone(err);
  }

  /** Did this session already lose a sandbox? Then its new one must say the state is gone. */
  private async hadSandboxBefore(sessionId: string): Promise<boolean> {
    const rows = await this.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.state, 'removed')))
      .limit(1);
    return rows.length > 0;
  }

  /** Inserts the sandbox row first, then counts: concurrent claims can never exceed the team cap. */
  private async reserve(id: string, ctx: ExecContext, limits: SandboxLimits): Promise<void> {
    await this.db.insert(sandboxes).values({
      id,
      teamId: ctx.teamId,
      workspaceId: ctx.workspaceId,
      sessionId: ctx.sessionId,
      owner: this.opts.owner,
      limits,
      containerId: '',
      image: this.opts.image,
      state: 'starting',
      expiresAt: this.idleExpiry(),
    });
    const active = await this.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.teamId, ctx.teamId), inArray(sandboxes.state, ACTIVE)))
      .orderBy(sandboxes.createdAt, sandboxes.id);
    const rank = active.findIndex((r) => r.id === id);
    if (rank >= this.opts.perTeamMax) {
      await this.db.delete(sandboxes).where(eq(sandboxes.id, id));
      throw new ApiError('sandbox_unavailable', `this team already has ${this.opts.perTeamMax} live sandboxes; end a session or wait for idle ones to be reclaimed`, {}, { 'Retry-After': '5' });
    }
  }

  private idleExpiry(): Date {
    return new Date(this.now() + this.opts.idleMs);
  }

  /** Ends the session's sandbox: closes the runner, removes the container, marks the row. */
  async release(sessionId: string, reason: string): Promise<void> {
    const live = this.live.get(sessionId);
    if (live) {
      this.live.delete(sessionId);
      await this.containers.destroy(live);
      await this.markRemoved([live.id], reason);
    } else {
      const rows = await this.db
        .select({ id: sandboxes.id })
        .from(sandboxes)
        .where(and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.owner, this.opts.owner), ne(sandboxes.state, 'removed')));
      await this.markRemoved(rows.map((r) => r.id), reason);
    }
  }

  /** DELETE /v1/sandboxes/{id}: the session keeps going and gets a fresh sandbox on its next exec. */
  async removeForTeam(teamId: string, id: string): Promise<void> {
    const [row] = await this.db.select().from(sandboxes).where(and(eq(sandboxes.id, id), eq(sandboxes.teamId, teamId), ne(sandboxes.state, 'removed')));
    if (!row) throw ApiError.notFound('sandbox');
    if (row.sessionId && this.live.get(row.sessionId)?.id === id) {
      await this.release(row.sessionId, 'deleted');
      return;
    }
    if (row.containerId) await this.backend.remove(row.containerId).catch(() => undefined);
    await this.markRemoved([id], 'deleted');
  }

  /** The team's live sandboxes, with memory and CPU use sampled from the container runtime. */
  async listForTeam(teamId: string) {
    const rows = await this.db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.teamId, teamId), inArray(sandboxes.state, ACTIVE)))
      .orderBy(sandboxes.id);
    const usage = await Promise.all(rows.map((r) => (r.containerId ? this.backend.stats(r.containerId) : Promise.resolve(null))));
    return rows.map((r, i) => {
      const live = r.sessionId ? this.live.get(r.sessionId) : undefined;
      const state = r.state === 'starting' ? 'starting' : live?.id === r.id && live.busy ? 'busy' : 'idle';
      return { row: r, state, memoryBytes: usage[i]?.memoryBytes ?? null, cpuPercent: usage[i]?.cpuPercent ?? null };
    });
  }

  private async markRemoved(ids: string[], reason: string): Promise<void> {
    if (ids.length === 0) return;
    await this.db
      .update(sandboxes)
      .set({ state: 'removed', removedAt: new Date(), removedReason: reason })
      .where(and(inArray(sandboxes.id, ids), ne(sandboxes.state, 'removed')));
  }

  /**
   * Reconciles the container runtime with the database. Any replica of this installation removes its
   * containers past their hard lifetime (never another installation's, whatever their age);
   * this instance also removes its own containers that are neither pooled nor live
   * (all of them at start-up: their runner streams died with the previous process), sandboxes
   * idle longer than the idle timeout, and those whose session has ended.
   */
  async reap(opts: { startup?: boolean } = {}): Promise<{ removed: number }> {
    const now = this.now();
    let removed = 0;
    for (const [sessionId, live] of this.live) {
      if (!live.client.alive || (!live.busy && now - live.lastUsed > this.opts.idleMs)) {
        await this.release(sessionId, live.client.alive ? 'idle' : 'runner_lost');
        removed++;
      }
    }
    const liveIds = [...this.live.keys()];
    if (liveIds.length) {
      const ended = await this.db
        .select({ id: sessions.id })
        .from(sessions)
        .where(and(inArray(sessions.id, liveIds), ne(sessions.status, 'active')));
      for (const s of ended) {
        await this.release(s.id, 'session_ended');
        removed++;
      }
    }
    const containers = await this.backend.list();
    // A container is this installation's when it is this instance's or names a row of this
    // database (another replica's); any other is another installation's and never touched.
    const foreign = containers.filter((c) => c.owner !== this.opts.owner).map((c) => c.sandboxId);
    const known = new Set(
      foreign.length ? (await this.db.select({ id: sandboxes.id }).from(sandboxes).where(inArray(sandboxes.id, foreign))).map((r) => r.id) : [],
    );
    for (const info of containers) {
      const sbx = info.sandboxId;
      if (this.containers.isCreating(sbx) || this.claiming.has(sbx)) continue;
      // Asked now, not before the listing: a warm container that finished starting (or was
      // claimed) while the list was being fetched is pooled or live by the time we get here.
      const kept = this.pool.has(info.id) || [...this.live.values()].some((l) => l.container.id === info.id);
      const mine = info.owner === this.opts.owner;
      if (!mine && !known.has(sbx)) continue;
      const expired = info.expiresAt !== undefined && info.expiresAt < now;
      if (kept && !expired && !opts.startup) continue;
      if (!expired && !mine) continue;
      await this.backend.remove(info.id).catch(() => undefined);
      if (kept) {
        this.pool.drop(info.id);
        const live = [...this.live.values()].find((l) => l.container.id === info.id);
        if (live) await this.release(live.sessionId, 'expired');
      }
      removed++;
    }
    const liveSandboxIds = [...this.live.values()].map((l) => l.id);
    const orphanRows = await this.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.owner, this.opts.owner), eq(sandboxes.state, 'ready')));
    await this.markRemoved(
      orphanRows.map((r) => r.id).filter((id) => !liveSandboxIds.includes(id)),
      opts.startup ? 'server_restarted' : 'orphaned',
    );
    if (removed) this.log.info({ removed }, 'reaped sandboxes');
    if (!opts.startup) this.pool.fill();
    return { removed };
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

function lostResult(reason: string): RunnerResult {
  return notRun(137, { type: 'SandboxLost', message: `the sandbox stopped responding and was replaced; variables are lost (${reason})` }, true);
}
