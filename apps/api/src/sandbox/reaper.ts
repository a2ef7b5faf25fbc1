import { and, eq, inArray, ne } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { sandboxes, sessions } from '../db/schema/index.ts';
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
  owner: string;
  intervalMs: number;
  now: () => number;
}

/**
 * Reconciles the container runtime with the database. Any replica of this installation removes its
 * containers past their hard lifetime and those whose row says removed (never another
 * installation's, whatever their age);
 * this instance also removes its own containers that are neither pooled nor live
 * (all of them at start-up: their runner streams died with the previous process), sandboxes
 * idle longer than their workspace's idle time, and those whose session has ended.
 */
export class Reaper {
  private timer: NodeJS.Timeout | undefined;

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

  async reap(opts: { startup?: boolean } = {}): Promise<{ removed: number }> {
    const { db, live, pool, log } = this.deps;
    const now = this.opts.now();
    let removed = 0;
    await live.adoptDeadlines();
    for (const l of live.values()) {
      // Each sandbox has its workspace's idle time (live.ts).
      if (!l.client.alive || (!l.busy && now - l.lastUsed > l.idleMs)) {
        await live.release(l.sessionId, l.client.alive ? 'idle' : 'runner_lost');
        removed++;
      }
    }
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
    removed += await this.reapContainers(now, opts.startup ?? false);
    await this.sweepMounts();
    const liveSandboxIds = [...live.values()].map((l) => l.id);
    const orphanRows = await db
      .select({ id: sandboxes.id })
      .from(sandboxes)
      .where(and(eq(sandboxes.owner, this.opts.owner), eq(sandboxes.state, 'ready')));
    await markRemoved(
      db,
      orphanRows.map((r) => r.id).filter((id) => !liveSandboxIds.includes(id)),
      opts.startup ? 'server_restarted' : 'orphaned',
    );
    if (removed) log.info({ removed }, 'reaped sandboxes');
    // Egress networks whose sandbox container is gone (removed behind this server's back).
    if (!opts.startup) await this.deps.backend.sweepEgress?.(this.opts.owner);
    if (!opts.startup) pool.fill();
    return { removed };
  }

  /**
   * Unmounts the workspace directories of this instance's sandboxes that are neither pooled,
   * live nor being claimed or created: those of containers just removed, and at start-up every
   * one a previous life of this instance left behind.
   */
  private async sweepMounts(): Promise<void> {
    const { containers, live, pool, log } = this.deps;
    const liveIds = () => new Set([...live.values()].map((l) => l.id));
    const swept = await containers.sweepMounts((id) => live.isClaiming(id) || pool.holds(id) || liveIds().has(id));
    if (swept) log.info({ swept }, 'removed sandbox workspace mounts');
  }

  /**
   * Removes the containers the runtime lists that are past their lifetime, this instance's that
   * are unused, and another replica's whose row says removed.
   */
  private async reapContainers(now: number, startup: boolean): Promise<number> {
    const { db, backend, containers, live, pool } = this.deps;
    let removed = 0;
    const listed = await backend.list();
    // A container is this installation's when it is this instance's or names a row of this
    // database (another replica's); any other is another installation's and never touched.
    const foreign = listed.filter((c) => c.owner !== this.opts.owner).map((c) => c.sandboxId);
    const rows = foreign.length
      ? await db
          .select({ id: sandboxes.id, state: sandboxes.state })
          .from(sandboxes)
          .where(inArray(sandboxes.id, foreign))
      : [];
    const known = new Set(rows.map((r) => r.id));
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
      const mine = info.owner === this.opts.owner;
      if (!mine && !known.has(sbx)) continue;
      const expired = info.expiresAt !== undefined && info.expiresAt < now;
      if (kept && !expired && !startup) continue;
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
