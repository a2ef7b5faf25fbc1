import { and, asc, desc, eq, inArray, isNotNull, ne, not, or, type SQL, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { sandboxes } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { ContainerNetwork, RunnerChannel, SandboxBackend, SandboxContainer } from './backend.ts';
import type { Containers, Sandbox } from './containers.ts';
import type { SandboxLimits } from './limits.ts';
import type { WarmPool } from './pool.ts';
import { ACTIVE, markRemoved } from './rows.ts';
import { RunnerClient, RunnerGoneError } from './runner-client.ts';
import { changesSince, type FileWrite } from './resync.ts';
import { copyTree, WORKSPACE_TOO_LARGE } from './copy-tree.ts';
import { tarChunks } from './tar.ts';
import { readHead } from '../workspace/git.ts';
import { containerNode, onANode } from './node/registry.ts';
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
  /**
   * How long its sandbox, once idle, may stay paused (checkpointed to disk) before it is removed
   * (its `sandbox.paused_ttl_s`, capped); 0 or unset: an idle sandbox is removed, never paused.
   */
  pausedTtlMs?: number;
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
  /** The workspace's directory on this host that copy is of. */
  repoDir?: string;
  /** Its network mode, fixed when the container was created; `allow` is pushed to the proxy before each execution. */
  network: ContainerNetwork;
  /** How long it may stay paused once idle (0: never paused, removed at idle). */
  pausedTtlMs: number;
  /** Why the session's previous sandbox (whose state this one lacks) ended; told with its first result. */
  lostReason?: string;
  /** It was just resumed from a pause, in this many ms: told with its first result. */
  resumedMs?: number;
}

/**
 * What reaching a sandbox's runner again takes, kept in its row: while it runs (`sandboxes.runner`,
 * for another replica to take it over once its holder is gone: `takeOverRunning`) and while it is
 * paused (`sandboxes.checkpoint`, with the key always: `PausedState`).
 */
interface RunnerState {
  /**
   * The key its runner's frames are signed with (base64): a new relay proves itself with it.
   * Unset for a sandbox whose runner is its holder's exec (no other replica can reach it): its
   * row keeps its mount only, so that whoever finds it gone removes that too.
   */
  key?: string;
  uid: number;
  /** Its hard lifetime's end (epoch ms); paused, when it was paused: after the resume, what was left of it. */
  hardExpiresAt: number;
  /** The workspace's HEAD when its /workspace copy was made (null: it has none): what changed since is sent again. */
  head: string | null;
  /** Its host workspace mount (kept while it is paused). */
  mount?: string;
}

/** What resuming a paused sandbox needs (`sandboxes.checkpoint`). */
type PausedState = RunnerState & { key: string };

/** Past a cell's time limit, how long a sandbox taken over may still be running it (the runner's grace to stop it, and more). */
const CELL_END_GRACE_MS = 15_000;

/** Checkpoints failing, none succeeding, before pausing is turned off for the process. */
const PAUSE_FAILURES_OFF = 3;

/** Why a session's sandbox was paused: it sat idle, someone asked, or its server is stopping. */
export type PauseCause = 'idle' | 'requested' | 'shutdown';

/** What became of a pause: paused (its checkpoint's bytes), or why not. */
export type PauseOutcome =
  | { paused: true; bytes: number | null; ms: number }
  | { paused: false; reason: 'no_sandbox' | 'busy' | 'unpausable' | 'used' | 'failed' };

export interface LiveOptions {
  image: string;
  /** This API instance, which the rows and containers it creates carry. */
  instance: string;
  idleMs: number;
  perTeamMax: number;
  now: () => number;
  /** The most checkpoint bytes one team's paused sandboxes, and all of this instance's, may hold; oldest go first. */
  pausedMaxBytes?: { team: number; all: number };
  /** Whether another instance is known to be gone (EngineOptions.instanceGone); unset: none ever is. */
  instanceGone?: (instance: string) => boolean;
}

/** Told of each pause and resume (metrics). */
interface PauseListener {
  paused(ms: number): void;
  resumed(ms: number): void;
  /** A gone replica's sandbox met by a request here: taken over, or lost. */
  tookOver(outcome: 'taken' | 'lost'): void;
}

export interface LiveDeps {
  db: Db;
  backend: SandboxBackend;
  containers: Containers;
  pool: WarmPool;
  log: Logger;
  pauses?: PauseListener;
}

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
  /** Sessions whose sandbox is being paused right now: their requests wait for it, then resume it. */
  private readonly pausing = new Map<string, Promise<PauseOutcome>>();
  /**
   * Sandbox ids this process is pausing or has paused (until they are resumed or removed): never
   * reaped. Their rows say `paused` only once the checkpoint is written, so a reaper pass running
   * alongside a pause (a requested one, or the reaper's own) would otherwise take the container,
   * or its mount, for one that is neither live nor paused.
   */
  private readonly pausedHere = new Set<string>();
  /**
   * Checkpoints that failed here, and why the last did. After PAUSE_FAILURES_OFF of them with none
   * that succeeded, idle sandboxes are removed, as where the runtime cannot checkpoint at all (said
   * once in the log); where checkpoints work at all, one that fails (Docker 20.10 loses a large
   * one now and then) removes only its own sandbox.
   */
  private pauseFailures = 0;
  private pausedOnce = false;
  private pauseBroken: string | undefined;
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

  /** Being claimed, paused or resumed here: the reaper leaves its container and mount alone. */
  isClaiming(sandboxId: string): boolean {
    return this.claiming.has(sandboxId) || this.pausedHere.has(sandboxId);
  }

  /** Refuses new claims and waits for those under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.allSettled([...this.acquiring.values()]);
  }

  /** The session's live sandbox, its paused one resumed, or a new one: from the warm pool when its shape fits, else cold. */
  acquire(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    const pausing = this.pausing.get(ctx.sessionId);
    if (pausing) return pausing.then(() => this.acquire(ctx, limits));
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
      // Taken over by another replica, for which this one was gone (takeOverRunning): its
      // runner dropped this connection, and its container is that replica's now.
      const [row] = await db.select({ instance: sandboxes.instance }).from(sandboxes).where(eq(sandboxes.id, live.id));
      if (row && row.instance !== this.opts.instance) {
        live.client.close();
        return;
      }
      await containers.destroy(live);
      await markRemoved(db, [live.id], reason);
    } else {
      const rows = await db
        .select({ id: sandboxes.id, state: sandboxes.state, containerId: sandboxes.containerId })
        .from(sandboxes)
        .where(
          and(
            eq(sandboxes.sessionId, sessionId),
            eq(sandboxes.instance, this.opts.instance),
            ne(sandboxes.state, 'removed'),
          ),
        );
      // A paused one's stopped container goes now, its checkpoint and mount with it.
      for (const r of rows) if (r.state === 'paused') await this.removePaused(r, reason);
      await markRemoved(
        db,
        rows.filter((r) => r.state !== 'paused').map((r) => r.id),
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
    const resumed = (await this.resume(ctx)) ?? (await this.takeOverRunning(ctx));
    if (resumed) return resumed;
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
    if (stale) await this.release(ctx.sessionId, stale.client.alive ? 'network_changed' : stale.client.lostAs);
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
          copyFrom: ctx.workspaceDir ? { dir: ctx.workspaceDir, workspaceId: ctx.workspaceId } : undefined,
          image,
        });
    const booked = this.reserve(id, ctx, limits, image).then(() => this.lostBefore(ctx.sessionId));
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
      const signing = c.value.container.pausable ? c.value.client.signingKey : undefined;
      const runner: RunnerState | null =
        signing || c.value.workspaceDir
          ? {
              ...(signing ? { key: signing.toString('base64') } : {}),
              uid: c.value.container.uid,
              hardExpiresAt: c.value.expiresAt,
              head,
              ...(c.value.workspaceDir ? { mount: c.value.workspaceDir } : {}),
            }
          : null;
      await db
        .update(sandboxes)
        .set({
          containerId,
          state: 'ready',
          runner,
          lastUsedAt: new Date(this.opts.now()),
          expiresAt: this.idleExpiry(ctx),
        })
        .where(eq(sandboxes.id, id));
      // The first request to a warm runner is also the proof that it is still there.
      if (ctx.workspaceDir) await this.copyIn(c.value, ctx.workspaceDir, ctx.workspaceId);
      else if (warm) await c.value.client.ping();
      const live: Live = {
        ...c.value,
        teamId: ctx.teamId,
        sessionId: ctx.sessionId,
        workspaceId: ctx.workspaceId,
        synced: Boolean(ctx.workspaceDir),
        repoDir: ctx.workspaceDir,
        lastUsed: this.opts.now(),
        idleMs: ctx.idleMs ?? this.opts.idleMs,
        busy: false,
        queue: Promise.resolve(),
        replacesLost: lost.value !== null,
        lostReason: lost.value ?? undefined,
        network: ctx.network ?? { mode: 'none' },
        pausedTtlMs: ctx.pausedTtlMs ?? 0,
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
      if (c.status === 'rejected' && !(err instanceof ApiError)) {
        // The engine refused to create or start the container (its runtime failed, it ran out of
        // something): the caller hears that, not "internal error"; the engine's words are the
        // error's cause, which the one who logs it (the request, the agent run) logs with it.
        throw new ApiError(
          'unavailable',
          'the sandbox could not be started: its container engine refused it (the server log has the reason); try again',
          {},
          { 'Retry-After': '5' },
          { cause: err },
        );
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
  private async copyIn(sandbox: Sandbox, workspaceDir: string, workspaceId: string): Promise<void> {
    const { backend } = this.deps;
    if (sandbox.container.treeMount && backend.fillTree) {
      // A mount of the backend's host (a sandbox node): filled there from its copy of the
      // workspace, sent only what changed (tree-sync.ts); a cold start's was filled as it started.
      await sandbox.client.ping();
      if (!sandbox.filled) await backend.fillTree(sandbox.container, workspaceId, workspaceDir);
      await sandbox.client.syncLocal();
      return;
    }
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

  /**
   * Did this session already lose a sandbox? Then its new one must say the state is gone, and
   * why the last one ended (null: it never had one).
   */
  private async lostBefore(sessionId: string): Promise<string | null> {
    const [row] = await this.deps.db
      .select({ reason: sandboxes.removedReason })
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, sessionId), eq(sandboxes.state, 'removed')))
      .orderBy(desc(sandboxes.removedAt))
      .limit(1);
    return row ? (row.reason ?? 'removed') : null;
  }

  /**
   * Pauses the session's sandbox: once what is queued on it is done, its runner is let go and its
   * container checkpointed to its host's disk (its memory leaves the host's RAM); its row keeps
   * what resuming it needs. An idle pause gives up when the sandbox was used meanwhile. A sandbox
   * that cannot be paused (runc, a network, a workspace with paused_ttl_s 0) is left as it is;
   * one whose checkpoint fails is removed, as an idle one always was.
   */
  pause(sessionId: string, cause: PauseCause): Promise<PauseOutcome> {
    const already = this.pausing.get(sessionId);
    if (already) return already;
    const live = this.bySession.get(sessionId);
    if (!live?.client.alive) return Promise.resolve({ paused: false, reason: 'no_sandbox' });
    if (!this.canPause(live)) return Promise.resolve({ paused: false, reason: 'unpausable' });
    const pausing = this.pauseNow(live, cause).finally(() => this.pausing.delete(sessionId));
    this.pausing.set(sessionId, pausing);
    return pausing;
  }

  /** Whether the sandbox can be paused here: its container can, and its workspace keeps paused sandboxes. */
  canPause(live: Live): boolean {
    return !!live.container.pausable && !!this.deps.backend.pause && live.pausedTtlMs > 0 && !this.pauseBroken;
  }

  private async pauseNow(live: Live, cause: PauseCause): Promise<PauseOutcome> {
    const { db, backend, log } = this.deps;
    // Read before what is queued is done: a commit whose files reach the copy after this is sent
    // again at the resume (harmless), never missed.
    const head = live.synced && live.repoDir ? readHead(live.repoDir) : null;
    // What was queued before the pause began (an execution, a file pushed) finishes first.
    for (let q = live.queue; ; q = live.queue) {
      await q;
      if (q === live.queue) break;
    }
    if (live.busy) return { paused: false, reason: 'busy' };
    const now = this.opts.now();
    if (cause === 'idle' && now - live.lastUsed <= live.idleMs) return { paused: false, reason: 'used' };
    const key = live.client.signingKey;
    if (!key || !live.client.alive) return { paused: false, reason: 'unpausable' };
    this.bySession.delete(live.sessionId);
    this.pausedHere.add(live.id);
    const state: PausedState = {
      key: key.toString('base64'),
      uid: live.container.uid,
      hardExpiresAt: live.expiresAt,
      head,
      mount: live.workspaceDir,
    };
    const t0 = performance.now();
    let bytes: number | null;
    try {
      await live.client.detach();
      ({ bytes } = await backend.pause!(live.container));
    } catch (err) {
      const reason = (err as Error).message;
      log.warn({ sandbox: live.id, reason }, 'could not checkpoint a sandbox: it is removed instead');
      if (++this.pauseFailures >= PAUSE_FAILURES_OFF && !this.pausedOnce) {
        this.pauseBroken = reason;
        log.warn(
          { reason, failures: this.pauseFailures },
          'checkpoints keep failing on this host: from now on idle sandboxes are removed, not paused',
        );
      }
      this.pausedHere.delete(live.id);
      await this.deps.containers.destroy(live);
      await markRemoved(db, [live.id], cause === 'idle' ? 'idle' : 'pause_failed');
      return { paused: false, reason: 'failed' };
    }
    const ms = performance.now() - t0;
    this.pausedOnce = true;
    // Its checkpoint goes at its workspace's paused time (time paused does not count against its hard lifetime).
    const until = this.opts.now() + live.pausedTtlMs;
    const [kept] = await db
      .update(sandboxes)
      .set({
        state: 'paused',
        pausedAt: new Date(this.opts.now()),
        checkpointBytes: bytes,
        checkpoint: state,
        runner: null,
        expiresAt: new Date(until),
      })
      .where(and(eq(sandboxes.id, live.id), eq(sandboxes.state, 'ready')))
      .returning({ id: sandboxes.id });
    // Ended meanwhile (its session, workspace or team was deleted): nothing of it stays.
    if (!kept) {
      await this.removePaused({ id: live.id, containerId: live.container.id }, 'removed_while_pausing');
      return { paused: false, reason: 'no_sandbox' };
    }
    this.deps.pauses?.paused(ms);
    log.info({ sandbox: live.id, cause, ms: Math.round(ms), bytes }, 'sandbox paused');
    await this.reclaimCheckpoints(live.teamId, live.container.id);
    return { paused: true, bytes, ms };
  }

  /**
   * Keeps paused sandboxes' checkpoints within the team's disk cap and their host's (that of the
   * container just paused, `containerId`): the oldest paused go first (their sessions are told at
   * their next execution). Counted: this instance's paused sandboxes, and every replica's on
   * sandbox nodes (`<node>/<id>`: any replica reaches those); a host's, those on the same node
   * (or, unprefixed, this instance's own engine).
   */
  private async reclaimCheckpoints(teamId: string, containerId: string): Promise<void> {
    const caps = this.opts.pausedMaxBytes;
    if (!caps) return;
    const { db } = this.deps;
    const rows = await db
      .select({
        id: sandboxes.id,
        teamId: sandboxes.teamId,
        bytes: sandboxes.checkpointBytes,
        containerId: sandboxes.containerId,
      })
      .from(sandboxes)
      .where(
        and(
          or(eq(sandboxes.instance, this.opts.instance), onANode()),
          eq(sandboxes.state, 'paused'),
          isNotNull(sandboxes.checkpointBytes),
        ),
      )
      .orderBy(asc(sandboxes.pausedAt), asc(sandboxes.id));
    const hostOf = (id: string) => containerNode(id).node;
    const host = hostOf(containerId);
    let all = rows.filter((r) => hostOf(r.containerId) === host).reduce((a, r) => a + (r.bytes ?? 0), 0);
    let team = rows.filter((r) => r.teamId === teamId).reduce((a, r) => a + (r.bytes ?? 0), 0);
    const drop: typeof rows = [];
    for (const r of rows) {
      const overTeam = r.teamId === teamId && team > caps.team;
      const overHost = hostOf(r.containerId) === host && all > caps.all;
      if (!overTeam && !overHost) continue;
      drop.push(r);
      if (hostOf(r.containerId) === host) all -= r.bytes ?? 0;
      if (r.teamId === teamId) team -= r.bytes ?? 0;
    }
    for (const r of drop) await this.removePaused(r, 'checkpoint_reclaimed');
  }

  /** Removes a paused sandbox's container (its checkpoint with it) and marks its row. */
  async removePaused(row: { id: string; containerId: string }, reason: string): Promise<void> {
    this.pausedHere.delete(row.id);
    const removed = await this.deps.backend.remove(row.containerId).then(
      () => true,
      () => false,
    );
    await markRemoved(this.deps.db, [row.id], reason);
    // A container that could not be removed keeps its mount: the reaper's sweep takes it with the container.
    if (removed) await this.deps.containers.removeMountOf(row.id);
  }

  /**
   * The session's sandbox another replica paused on its own engine, when that engine is this
   * replica's too (replicas on one machine share it: the container is in this backend's
   * listing): taken over as a node's would be (see `resume`), in one update that only one
   * replica wins, with the workspace mount that replica made on this host (then this one's).
   * Null when there is none, or its engine is not this one's.
   */
  private async takeOverOnThisEngine(sessionId: string): Promise<typeof sandboxes.$inferSelect | null> {
    const { db, backend } = this.deps;
    const [other] = await db
      .select({ id: sandboxes.id, containerId: sandboxes.containerId, instance: sandboxes.instance })
      .from(sandboxes)
      .where(
        and(
          eq(sandboxes.sessionId, sessionId),
          eq(sandboxes.state, 'paused'),
          ne(sandboxes.instance, this.opts.instance),
          not(onANode()),
        ),
      )
      .limit(1);
    if (!other || !(await backend.list()).some((c) => c.id === other.containerId)) return null;
    const [row] = await db
      .update(sandboxes)
      .set({ state: 'resuming', instance: this.opts.instance })
      .where(and(eq(sandboxes.id, other.id), eq(sandboxes.state, 'paused'), eq(sandboxes.instance, other.instance)))
      .returning();
    // Its mount not found here: the resume that follows fails, and the session gets a new sandbox that says so.
    const mount = (row?.checkpoint as PausedState | null)?.mount;
    if (row && mount) await this.deps.containers.adoptMount(row.id, mount);
    return row ?? null;
  }

  /**
   * The session's paused sandbox, resumed: its container started from its checkpoint and its
   * runner spoken to again (it proves itself with the key it was given), with every variable it
   * held. Resuming counts against the team's cap again. Null when the session has none paused
   * here; one that cannot be resumed (its checkpoint is gone or broken, its workspace now wants
   * another runtime or a network) is removed, and the claim that follows says why.
   */
  private async resume(ctx: ExecContext): Promise<Live | null> {
    const { db, backend, log } = this.deps;
    const [mine] = await db
      .update(sandboxes)
      .set({ state: 'resuming', instance: this.opts.instance })
      .where(
        and(
          eq(sandboxes.sessionId, ctx.sessionId),
          eq(sandboxes.state, 'paused'),
          or(
            eq(sandboxes.instance, this.opts.instance),
            // Another replica's, on a sandbox node: any replica reaches it there. A request for it
            // is served here only when that replica is not heard from (a live one is sent it,
            // http/replicas.ts), so this one takes it over rather than leave it paused until its
            // lifetime. One on that replica's own engine: below (takeOverOnThisEngine).
            and(onANode(), sql`(${sandboxes.checkpoint} ->> 'mount') is null`),
          ),
        ),
      )
      .returning();
    const row = mine ?? (await this.takeOverOnThisEngine(ctx.sessionId));
    if (!row) return null;
    const saved = row.checkpoint as PausedState | null;
    const unfit =
      !saved || !backend.resume
        ? 'resume_failed'
        : row.runtime !== ctx.runtime || modeOf(ctx.network) !== 'none'
          ? 'settings_changed'
          : undefined;
    if (unfit) {
      await this.removePaused(row, unfit);
      return null;
    }
    // Within the team's cap, as a new sandbox would be; over it, it stays paused. Counted with
    // itself (its row is `resuming`, which counts): a new claim racing it ranks after it by age
    // (reserve) and is refused, so together they never pass the cap.
    const active = await db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.teamId, ctx.teamId), inArray(sandboxes.state, ACTIVE)));
    if (active.length > this.opts.perTeamMax) {
      await db.update(sandboxes).set({ state: 'paused' }).where(eq(sandboxes.id, row.id));
      throw new ApiError(
        'sandbox_unavailable',
        `this team already has ${this.opts.perTeamMax} live sandboxes; end a session or wait for idle ones ` +
          "to be paused or reclaimed, then this session's paused sandbox resumes",
        {},
        { 'Retry-After': '5' },
      );
    }
    const t0 = performance.now();
    // What was left of its hard lifetime when it was paused, from now: paused time does not count.
    const pausedAt = row.pausedAt?.getTime() ?? this.opts.now();
    const lifetimeEnds = this.opts.now() + Math.max(0, saved!.hardExpiresAt - pausedAt);
    const live = await this.reach(row, ctx, { ...saved!, hardExpiresAt: lifetimeEnds }, t0, (container) =>
      backend.resume!(container, lifetimeEnds),
    );
    if (!live) {
      await this.removePaused(row, 'resume_failed');
      return null;
    }
    this.pausedHere.delete(row.id);
    this.deps.pauses?.resumed(live.resumedMs!);
    log.info({ sandbox: row.id, ms: Math.round(live.resumedMs!) }, 'sandbox resumed');
    return live;
  }

  /**
   * The session's running sandbox of another replica that is gone (not heard from lately; it held
   * the runner's connection), when this replica reaches its container (on a sandbox node, or in
   * this backend's listing: an engine the two shared) and its runner lives apart from that
   * connection (a pausable one: its key is in its row). Taken over in one update that only one
   * replica wins, then spoken to again (the runner drops the gone one's connection for this one
   * once it proves itself with the key), with every variable it held. Null when there is none; a
   * gone replica's sandbox that cannot be taken over is removed (`replica_gone`), so the session's
   * new one says its state is gone.
   */
  private async takeOverRunning(ctx: ExecContext): Promise<Live | null> {
    const { db, backend, log } = this.deps;
    const gone = this.opts.instanceGone;
    if (!gone) return null;
    const rows = await db
      .select()
      .from(sandboxes)
      .where(
        and(
          eq(sandboxes.sessionId, ctx.sessionId),
          eq(sandboxes.state, 'ready'),
          ne(sandboxes.instance, this.opts.instance),
        ),
      );
    const row = rows.find((r) => gone(r.instance));
    if (!row) return null;
    const saved = row.runner as RunnerState | null;
    const listed = await backend.list().catch(() => []);
    const reachable = listed.some((c) => c.id === row.containerId);
    const fits =
      saved?.key && backend.reattach && reachable && row.runtime === ctx.runtime && modeOf(ctx.network) === 'none';
    if (!fits) {
      // Its state cannot be reached from here: it counts as lost, and its container goes where it can.
      await this.dropGone(row, saved, reachable);
      return null;
    }
    const [taken] = await db
      .update(sandboxes)
      .set({ state: 'resuming', instance: this.opts.instance })
      .where(and(eq(sandboxes.id, row.id), eq(sandboxes.state, 'ready'), eq(sandboxes.instance, row.instance)))
      .returning();
    // Another replica took it first: the session's request there is served by it.
    if (!taken) return null;
    // A workspace mount the gone replica made on this host (the two share it) is this one's now.
    const mounted = !saved!.mount || (await this.deps.containers.adoptMount(row.id, saved!.mount));
    const live = mounted
      ? await this.reach(taken, ctx, saved as PausedState, performance.now(), (container) =>
          backend.reattach!(container),
        )
      : null;
    if (!live) {
      await this.dropGone(row, saved, true);
      return null;
    }
    this.deps.pauses?.tookOver('taken');
    log.info(
      { sandbox: row.id, from: row.instance, ms: Math.round(live.resumedMs!) },
      'took over a gone replica’s sandbox',
    );
    return live;
  }

  /**
   * A gone replica's sandbox that cannot be taken over: its container removed where this replica
   * reaches it, with the workspace mount that replica made on this host, and its row removed
   * (`replica_gone`: the session's new sandbox says its state is gone).
   */
  private async dropGone(
    row: typeof sandboxes.$inferSelect,
    saved: RunnerState | null,
    reachable: boolean,
  ): Promise<void> {
    const { db, backend, containers } = this.deps;
    if (reachable) {
      await backend.remove(row.containerId).catch(() => undefined);
      if (saved?.mount && (await containers.adoptMount(row.id, saved.mount))) await containers.removeMountOf(row.id);
    }
    await markRemoved(db, [row.id], 'replica_gone');
    this.deps.pauses?.tookOver('lost');
  }

  /**
   * Speaks to the runner of a `resuming` row's container again (`open` resumes it from its
   * checkpoint, or reattaches to it running), sends its /workspace what was committed since its
   * copy was made, and makes it this replica's live sandbox of the session. Null (the caller
   * removes it) when that fails or the row was removed meanwhile.
   */
  private async reach(
    row: typeof sandboxes.$inferSelect,
    ctx: ExecContext,
    saved: PausedState,
    t0: number,
    open: (container: SandboxContainer) => Promise<RunnerChannel>,
  ): Promise<Live | null> {
    const { db, log } = this.deps;
    const container: SandboxContainer = { id: row.containerId, uid: saved.uid, runtime: row.runtime, pausable: true };
    this.claiming.add(row.id);
    let client: RunnerClient | undefined;
    try {
      client = await RunnerClient.reattach(await open(container), Buffer.from(saved.key, 'base64'));
      // A cell the gone replica started may still run (its output was that replica's, and goes
      // nowhere now): this request waits for its end, as one queued behind it would, within the
      // time the runner gives a cell (it stops one past its limit).
      const limits = row.limits as SandboxLimits;
      const until = Date.now() + limits.timeoutS * 1000 + CELL_END_GRACE_MS;
      for (let { busy } = await client.ping(); busy; { busy } = await client.ping()) {
        if (Date.now() > until) throw new Error('the cell it was running did not end within its time limit');
        await new Promise((r) => setTimeout(r, 100));
      }
      const live: Live = {
        id: row.id,
        container,
        client,
        limits,
        runtime: row.runtime,
        image: row.image,
        expiresAt: saved.hardExpiresAt,
        workspaceDir: saved.mount,
        teamId: ctx.teamId,
        sessionId: ctx.sessionId,
        workspaceId: ctx.workspaceId,
        synced: saved.head !== null && Boolean(ctx.workspaceDir),
        repoDir: ctx.workspaceDir,
        lastUsed: this.opts.now(),
        idleMs: ctx.idleMs ?? this.opts.idleMs,
        busy: false,
        queue: Promise.resolve(),
        replacesLost: false,
        network: { mode: 'none' },
        pausedTtlMs: ctx.pausedTtlMs ?? 0,
      };
      // What was committed since its copy was made reaches it before any code runs.
      const head = live.synced && ctx.workspaceDir ? readHead(ctx.workspaceDir) : null;
      if (live.synced && ctx.workspaceDir) {
        const files = await changesSince(ctx.workspaceDir, saved.head!);
        for (const f of files) {
          if (f.data) await client.putFile(`/workspace/${f.path}`, f.data);
          else await client.deleteFile(`/workspace/${f.path}`);
        }
      }
      live.resumedMs = performance.now() - t0;
      const runner: RunnerState = { ...saved, head };
      const [kept] = await db
        .update(sandboxes)
        .set({
          state: 'ready',
          pausedAt: null,
          checkpointBytes: null,
          checkpoint: null,
          runner,
          lifetimeEndsAt: new Date(saved.hardExpiresAt),
          lastUsedAt: new Date(live.lastUsed),
          expiresAt: this.idleExpiry(ctx),
        })
        .where(and(eq(sandboxes.id, row.id), eq(sandboxes.state, 'resuming')))
        .returning({ id: sandboxes.id });
      if (!kept) throw new Error('it was removed while it was reached');
      this.bySession.set(ctx.sessionId, live);
      return live;
    } catch (err) {
      client?.close();
      log.warn(
        { sandbox: row.id, reason: (err as Error).message },
        'a sandbox could not be reached again: the session gets a new one',
      );
      return null;
    } finally {
      this.claiming.delete(row.id);
    }
  }

  /** Inserts the sandbox row first, then counts: concurrent claims can never exceed the team cap. */
  private async reserve(id: string, ctx: ExecContext, limits: SandboxLimits, image: string): Promise<void> {
    const { db } = this.deps;
    await db.insert(sandboxes).values({
      id,
      teamId: ctx.teamId,
      workspaceId: ctx.workspaceId,
      sessionId: ctx.sessionId,
      instance: this.opts.instance,
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
  async touchElsewhere(
    sessionId: string,
    idleMs: number,
  ): Promise<{ id: string; containerId: string; lifetimeEndsAt: Date | null }[]> {
    const now = this.opts.now();
    return this.deps.db
      .update(sandboxes)
      .set({ lastUsedAt: new Date(now), expiresAt: new Date(now + idleMs) })
      .where(
        and(
          eq(sandboxes.sessionId, sessionId),
          eq(sandboxes.state, 'ready'),
          ne(sandboxes.instance, this.opts.instance),
        ),
      )
      .returning({ id: sandboxes.id, containerId: sandboxes.containerId, lifetimeEndsAt: sandboxes.lifetimeEndsAt });
  }

  /**
   * Sandboxes paused here whose rows were marked removed elsewhere (their sandbox node declared
   * lost, another replica's deletion): no longer this process's to keep from the reaper.
   */
  async forgetRemovedPauses(): Promise<void> {
    if (!this.pausedHere.size) return;
    const rows = await this.deps.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(inArray(sandboxes.id, [...this.pausedHere]), eq(sandboxes.state, 'removed')));
    for (const r of rows) this.pausedHere.delete(r.id);
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
