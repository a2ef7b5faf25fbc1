/**
 * Which server runs a run's loop, and the cancel channel between servers. A run in flight is
 * leased to the server running its loop (`runner`, `lease_until`, renewed every third of the
 * lease); runs no live loop runs are ended as interrupted. A cancel for a run another replica is
 * running reaches it through a NOTIFY.
 *
 * May touch: the `runner` and `lease_until` of runs, the status of a paused run it claims, the
 * end of runs whose loop is gone (through `finishRun`), and the cancel channel. It stops a loop
 * only by aborting the controller this process registered for it; never a run's messages or
 * approvals.
 */
import { and, eq, inArray, isNull, lt, or, sql, type SQL } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Database } from '../db/client.ts';
import { runs, type RunRow } from '../db/schema/index.ts';
import { TERMINAL_EVENTS } from './events.ts';
import { finishRun, INTERRUPTED, isActive, type WriteDeps } from './run-writes.ts';

/**
 * Which server runs a run's loop: its instance id, and how long its claim lasts unless renewed.
 * A server that dies stops renewing; any other then marks its runs interrupted.
 */
export interface RunLeases {
  instance: string;
  leaseMs: number;
}

/** Runs whose loop runs on some server (paused ones wait for a person, on none). */
const LOOPING = ['queued', 'in_progress'] as const;
const CANCEL_CHANNEL = 'kiln_run_cancel';
/** How long a cancel waits for the replica running the run before ending it itself. */
const CANCEL_WAIT_MS = 2000;

export class Leases {
  private timer: NodeJS.Timeout | undefined;
  private unlistenCancels: (() => Promise<void>) | undefined;

  /** `active`: the runs looping in this process, by id, with the controller that stops each. */
  constructor(
    private readonly deps: WriteDeps & { log: Logger },
    readonly lease: RunLeases,
    private readonly active: ReadonlyMap<string, AbortController>,
  ) {}

  /** The lease a run gets when this server starts or resumes its loop (database time, so clocks need not agree). */
  until(): SQL {
    return sql`now() + ${this.lease.leaseMs} * interval '1 millisecond'`;
  }

  /** Renews this server's leases, and interrupts orphaned runs, every third of the lease. */
  startTending(): void {
    this.timer = setInterval(
      () => {
        this.tend().catch((err) => this.deps.log.warn({ err }, 'run lease upkeep failed'));
      },
      Math.max(50, Math.floor(this.lease.leaseMs / 3)),
    );
    this.timer.unref();
  }

  stopTending(): void {
    clearInterval(this.timer);
  }

  /** Renews this server's runs, and interrupts runs whose server stopped renewing theirs. */
  private async tend(): Promise<void> {
    if (this.active.size) {
      await this.deps.db.execute(sql`update runs set lease_until = ${this.until()}
        where runner = ${this.lease.instance} and status in (${sql.join(
          LOOPING.map((st) => sql`${st}`),
          sql`, `,
        )})`);
    }
    await this.interruptOrphans(false);
  }

  /**
   * Fails runs in flight that no live loop runs: unclaimed ones, those whose lease has run out,
   * and (at start-up) this server's own. Their server, should it still be alive, is told to stop
   * them (the cancel channel); its own end then finds the run ended and writes nothing.
   */
  async interruptOrphans(atStartup: boolean): Promise<void> {
    const { db } = this.deps;
    const own = atStartup ? eq(runs.instance, this.lease.instance) : undefined;
    const orphaned = or(isNull(runs.instance), lt(runs.leaseUntil, sql`now()`), own);
    const inFlight = await db
      .select()
      .from(runs)
      .where(and(inArray(runs.status, [...LOOPING]), orphaned));
    for (const run of inFlight) {
      if (this.active.has(run.id)) continue;
      await finishRun(this.deps, run, 'failed', INTERRUPTED);
      if (this.unlistenCancels && run.instance && run.instance !== this.lease.instance) {
        await db.execute(sql`select pg_notify(${CANCEL_CHANNEL}, ${run.id})`);
      }
    }
  }

  /** A paused run whose approval was decided, now in progress and leased to this server; none if it no longer waits. */
  async claimPaused(runId: string): Promise<RunRow | undefined> {
    const [run] = await this.deps.db
      .update(runs)
      .set({ status: 'in_progress', instance: this.lease.instance, leaseUntil: this.until() })
      .where(and(eq(runs.id, runId), eq(runs.status, 'requires_action')))
      .returning();
    return run;
  }

  /**
   * With several replicas on one Postgres: a cancel for a run that another replica is running
   * reaches that replica through a NOTIFY, and stops it there.
   */
  async connectCancels(listen: NonNullable<Database['listen']>): Promise<void> {
    const stop = (runId: string) => this.active.get(runId)?.abort(new Error('cancelled'));
    this.unlistenCancels = await listen(CANCEL_CHANNEL, stop);
  }

  async disconnectCancels(): Promise<void> {
    await this.unlistenCancels?.();
  }

  /** Whether cancels reach the other replicas (`connectCancels` was called). */
  get crossReplica(): boolean {
    return this.unlistenCancels !== undefined;
  }

  /** Asks the other replicas to stop a run; true once it ended (within 2 s), false when nobody did. */
  async cancelElsewhere(runId: string): Promise<boolean> {
    const { db, events } = this.deps;
    const ended = new AbortController();
    const timer = setTimeout(() => ended.abort(), CANCEL_WAIT_MS);
    try {
      const terminal = new Promise<void>((resolve) => {
        void events.follow(runId, 0, (ev) => TERMINAL_EVENTS.has(ev.event) && resolve(), ended.signal);
        ended.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      await db.execute(sql`select pg_notify(${CANCEL_CHANNEL}, ${runId})`);
      await terminal;
      const [now] = await db.select({ status: runs.status }).from(runs).where(eq(runs.id, runId));
      return !now || !isActive(now);
    } finally {
      clearTimeout(timer);
      ended.abort();
    }
  }
}
