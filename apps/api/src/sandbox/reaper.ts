import { and, eq, inArray, isNotNull, lt, ne, or } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { sandboxes, sessions, workspaces } from '../db/schema/index.ts';
import type { SandboxBackend } from './backend.ts';
import type { Containers } from './containers.ts';
import type { LiveSandboxes } from './live.ts';
import type { WarmPool } from './pool.ts';
import { markRemoved } from './rows.ts';

export interface ReaperDeps {
  db: Db;
  backend: SandboxBackend;
  containers: Containers;
  pool: WarmPool;
  live: LiveSandboxes;
  log: Logger;
}

export interface ReaperOptions {
  /** This API instance. */
  instance: string;
  intervalMs: number;
  now: () => number;
}

/**
 * Reconciles the container runtime with the database. Any replica of this installation removes its
 * containers past their hard lifetime and those whose row says removed (never another
 * installation's, whatever their age);
 * this instance also removes its own containers that are neither pooled nor live
 * (all of them at start-up: their runner streams died with the previous process), sandboxes
 * idle longer than their workspace's idle time (paused instead, where they can be: live.ts), and
 * those whose session has ended; and its paused sandboxes past their paused time or whose
 * session has ended (a paused sandbox's stopped container survives restarts).
 */
export class Reaper {
  private timer: NodeJS.Timeout | undefined;

  /** The pass running or last run. */
  private last: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly deps: ReaperDeps,
    private readonly opts: ReaperOptions,
  ) {}

  /** Reaps every interval from now on. */
  start(): void {
    this.timer = setInterval(() => {
      this.reap().catch((err) => this.deps.log.error({ err }, 'sandbox reaper failed'));
    }, this.opts.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /**
   * One pass over the sandboxes, after any pass already running (the timer's and a caller's
   * never overlap): a pass that began while another was pausing a sandbox would find it in no
   * list (neither live nor paused yet) and end before that pause did.
   */
  reap(opts: { startup?: boolean } = {}): Promise<{ removed: number }> {
    const pass = this.last.catch(() => undefined).then(() => this.pass(opts));
    this.last = pass;
    return pass;
  }

  private async pass(opts: { startup?: boolean }): Promise<{ removed: number }> {
    const { db, live, pool, log } = this.deps;
    const now = this.opts.now();
    let removed = 0;
    await live.adoptDeadlines();
    await live.forgetRemovedPauses();
    for (const l of live.values()) {
      // Each sandbox has its workspace's idle time (live.ts). An idle one that can be paused is.
      if (!l.client.alive || (!l.busy && now - l.lastUsed > l.idleMs)) {
        if (l.client.alive && live.canPause(l)) {
          const outcome = await live.pause(l.sessionId, 'idle');
          // Used or busy meanwhile (or gone): it stays as it is, and says why.
          if (!outcome.paused && outcome.reason !== 'failed')
            log.info({ sandbox: l.id, reason: outcome.reason }, 'idle sandbox not paused');
          if (outcome.paused || outcome.reason !== 'failed') continue;
        } else await live.release(l.sessionId, l.client.alive ? 'idle' : l.client.lostAs);
        removed++;
      }
    }
    removed += await this.reapPaused(now);
    const liveIds = [...live.values()].map((l) => l.sessionId);
    if (liveIds.length) {
      const ended = await db
        .select({ id: sessions.id })
        .from(sessions)
        .where(and(inArray(sessions.id, liveIds), ne(sessions.status, 'active')));
      for (const s of ended) {
        await live.release(s.id, 'session_ended');
        removed++;
      }
    }
    // A resume a previous life left half done: its runner's relay died with it.
    if (opts.startup) await this.endResuming();
    const paused = await this.pausedIds();
    removed += await this.reapContainers(now, opts.startup ?? false, paused);
    await this.sweepMounts(paused);
    const liveSandboxIds = [...live.values()].map((l) => l.id);
    const orphanRows = await db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.instance, this.opts.instance), eq(sandboxes.state, 'ready')));
    await markRemoved(
      db,
      // One being paused is neither live nor paused yet: its row says ready until the checkpoint is written.
      orphanRows.map((r) => r.id).filter((id) => !liveSandboxIds.includes(id) && !live.isClaiming(id)),
      opts.startup ? 'server_restarted' : 'orphaned',
    );
    if (removed) log.info({ removed }, 'reaped sandboxes');
    // Egress networks whose sandbox container is gone (removed behind this server's back).
    if (!opts.startup) await this.deps.backend.sweepEgress?.(this.opts.instance);
    if (!opts.startup) pool.fill();
    return { removed };
  }

  /**
   * This instance's paused sandboxes whose time is up (their workspace's paused time), whose
   * session has ended or whose workspace was deleted: removed, their checkpoint (the sandbox's
   * memory, secret values included) with their container.
   */
  private async reapPaused(now: number): Promise<number> {
    const { db, live } = this.deps;
    const rows = await db
      .select({
        id: sandboxes.id,
        containerId: sandboxes.containerId,
        status: sessions.status,
        deletedAt: workspaces.deletedAt,
      })
      .from(sandboxes)
      .leftJoin(sessions, eq(sessions.id, sandboxes.sessionId))
      .leftJoin(workspaces, eq(workspaces.id, sandboxes.workspaceId))
      .where(
        and(
          eq(sandboxes.instance, this.opts.instance),
          eq(sandboxes.state, 'paused'),
          or(lt(sandboxes.expiresAt, new Date(now)), ne(sessions.status, 'active'), isNotNull(workspaces.deletedAt)),
        ),
      );
    for (const r of rows) {
      const why = r.deletedAt ? 'workspace_deleted' : r.status !== 'active' ? 'session_ended' : 'paused_expired';
      await live.removePaused(r, why);
    }
    return rows.length;
  }

  /** The sandbox ids of this instance's paused (or resuming) sandboxes: their containers and mounts stay. */
  private async pausedIds(): Promise<Set<string>> {
    const rows = await this.deps.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.instance, this.opts.instance), inArray(sandboxes.state, ['paused', 'resuming'])));
    return new Set(rows.map((r) => r.id));
  }

  /**
   * Unmounts the workspace directories of this instance's sandboxes that are neither pooled,
   * live nor being claimed or created: those of containers just removed, and at start-up every
   * one a previous life of this instance left behind.
   */
  private async sweepMounts(paused: Set<string>): Promise<void> {
    const { db, containers, live, pool, log } = this.deps;
    const liveIds = () => new Set([...live.values()].map((l) => l.id));
    const swept = await containers.sweepMounts(
      (id) => live.isClaiming(id) || pool.holds(id) || paused.has(id) || liveIds().has(id),
      // Mounts this instance made for sandboxes another replica took over (live.ts): that one's now.
      async (ids) =>
        new Set(
          (
            await db
              .select({ id: sandboxes.id })
              .from(sandboxes)
              .where(
                and(
                  inArray(sandboxes.id, ids),
                  ne(sandboxes.state, 'removed'),
                  ne(sandboxes.instance, this.opts.instance),
                ),
              )
          ).map((r) => r.id),
        ),
    );
    if (swept) log.info({ swept }, 'removed sandbox workspace mounts');
  }

  /** The moved hard lifetimes (epoch ms) of the sandboxes listed that were ever paused, by sandbox id. */
  private async movedLifetimes(ids: string[]): Promise<Map<string, number>> {
    if (!ids.length) return new Map();
    const rows = await this.deps.db
      .select({ id: sandboxes.id, ends: sandboxes.lifetimeEndsAt })
      .from(sandboxes)
      .where(and(inArray(sandboxes.id, ids), isNotNull(sandboxes.lifetimeEndsAt)));
    return new Map(rows.map((r) => [r.id, r.ends!.getTime()]));
  }

  /** Rows of this instance left `resuming` by a previous life: their containers go (reapContainers) with them. */
  private async endResuming(): Promise<void> {
    const rows = await this.deps.db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.instance, this.opts.instance), eq(sandboxes.state, 'resuming')));
    await markRemoved(
      this.deps.db,
      rows.map((r) => r.id),
      'server_restarted',
    );
  }

  /**
   * Removes the containers the runtime lists that are past their lifetime, this instance's that
   * are unused, and another replica's whose row says removed.
   */
  private async reapContainers(now: number, startup: boolean, paused: Set<string>): Promise<number> {
    const { db, backend, containers, live, pool } = this.deps;
    let removed = 0;
    const listed = await backend.list();
    // A container is this installation's when it is this instance's or names a row of this
    // database (another replica's); any other is another installation's and never touched.
    const ids = listed.map((c) => c.sandboxId).filter(Boolean);
    const rows = ids.length
      ? await db
          .select({ id: sandboxes.id, state: sandboxes.state, instance: sandboxes.instance })
          .from(sandboxes)
          .where(inArray(sandboxes.id, ids))
      : [];
    const known = new Set(rows.map((r) => r.id));
    // A container this instance made that another replica took over while it was paused (live.ts,
    // resume) is that replica's now, whatever its label says.
    const takenOver = new Set(rows.filter((r) => r.instance !== this.opts.instance).map((r) => r.id));
    // A sandbox that was paused has its hard lifetime moved on by its time paused (its row says to when).
    const moved = await this.movedLifetimes(ids);
    // Another replica's containers whose rows say removed (a sandbox node declared lost, say, whose
    // replica died too) are left over wherever they still run: any replica removes them.
    const removedRows = new Set(rows.filter((r) => r.state === 'removed').map((r) => r.id));
    const liveOn = (containerId: string) => [...live.values()].find((l) => l.container.id === containerId);
    for (const info of listed) {
      const sbx = info.sandboxId;
      if (containers.isCreating(sbx) || live.isClaiming(sbx)) continue;
      // Asked now, not before the listing: a warm container that finished starting (or was
      // claimed) while the list was being fetched is pooled or live by the time we get here.
      const kept = pool.has(info.id) || liveOn(info.id) !== undefined;
      const mine = info.instance === this.opts.instance && !takenOver.has(sbx);
      if (!mine && !known.has(sbx)) continue;
      const ends = moved.get(sbx) ?? info.expiresAt;
      const expired = ends !== undefined && ends < now;
      if (kept && !expired && !startup) continue;
      // A paused sandbox's container is stopped, its checkpoint beside it: it stays, restarts
      // included, until its paused time is up (reapPaused; its hard lifetime waits meanwhile).
      if (paused.has(sbx)) continue;
      if (!expired && !mine && !removedRows.has(sbx)) continue;
      await backend.remove(info.id).catch(() => undefined);
      if (kept) {
        pool.drop(info.id);
        const l = liveOn(info.id);
        if (l) await live.release(l.sessionId, 'expired');
      }
      removed++;
    }
    return removed;
  }
}
