import { and, eq, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { jobs } from '../db/schema/index.ts';
import { newId } from '../lib/ids.ts';
import { rowsOf } from '../db/rows.ts';

export type JobRow = typeof jobs.$inferSelect;

/** Thrown by a handler that was stopped from outside (shutdown): the job goes back to the queue as it was, no attempt used. */
export class ReleaseJob extends Error {}
/** Thrown by a handler whose job should be tried again after `delayMs` (its own schedule), if it has attempts left. */
export class RetryJob extends Error {
  constructor(
    message: string,
    readonly delayMs: number,
  ) {
    super(message);
  }
}
/** Thrown by a handler whose job must not be tried again, whatever attempts are left. */
export class FailJob extends Error {}
type JobHandler = (payload: unknown, job: JobRow) => Promise<void>;

export interface JobRunnerOptions {
  /** This process; a lease names it. */
  owner: string;
  /** How long a claimed job is ours without a heartbeat; after that any runner may take it. */
  leaseMs: number;
  /** How often to look for due jobs when nothing woke us. */
  pollMs: number;
  /** Injectable clock (tests); leases and due times are compared with it, not the database's. */
  now?: () => number;
}

/**
 * Durable jobs in Postgres. A runner claims one due job at a time with
 * `FOR UPDATE SKIP LOCKED` and a lease, so several runners (API replicas) on one database
 * never run a job twice; a job whose runner died (its lease ran out) is claimed again, so a
 * restart loses no job. Failures are retried with exponential backoff up to `max_attempts` (or
 * after the delay a handler names with RetryJob; FailJob ends a job at once).
 */
export class JobRunner {
  private readonly handlers = new Map<string, JobHandler>();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = true;
  private wakeRequested = false;

  constructor(
    private readonly db: Db,
    private readonly opts: JobRunnerOptions,
    private readonly log: Logger,
  ) {}

  /** The runner's clock (injectable in tests): due times and leases are compared with it. */
  now(): number {
    return this.opts.now ? this.opts.now() : Date.now();
  }

  /** Runs jobs of `kind` with `handler`; `P` is the payload this kind's callers enqueue (stored as JSON). */
  handle<P>(kind: string, handler: (payload: P, job: JobRow) => Promise<void>): void {
    this.handlers.set(kind, handler as JobHandler);
  }

  /** Queues a job; with a `dedupeKey` that exists already, nothing is added. Returns the job id, or null for a duplicate. */
  async enqueue(
    kind: string,
    payload: unknown,
    opts: { runAt?: Date; dedupeKey?: string; maxAttempts?: number } = {},
  ): Promise<string | null> {
    const [row] = await this.db
      .insert(jobs)
      .values({
        id: newId('job'),
        kind,
        payload: payload as object,
        dedupeKey: opts.dedupeKey ?? null,
        runAt: opts.runAt ?? new Date(this.now()),
        maxAttempts: opts.maxAttempts ?? 3,
      })
      .onConflictDoNothing()
      .returning({ id: jobs.id });
    if (row && !this.stopped) this.wake();
    return row?.id ?? null;
  }

  /** Starts working; jobs this owner held in a previous life are released at once. */
  async start(): Promise<void> {
    this.stopped = false;
    await this.db
      .update(jobs)
      .set({ lockedUntil: new Date(0) })
      .where(and(eq(jobs.status, 'running'), eq(jobs.lockedBy, this.opts.owner)));
    this.timer = setInterval(() => this.wake(), this.opts.pollMs);
    this.timer.unref();
    this.wake();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  /** Runs due jobs until none is left (one drain at a time). */
  wake(): void {
    if (this.stopped) return;
    if (this.running) {
      this.wakeRequested = true;
      return;
    }
    this.running = this.drain()
      .then(() => undefined)
      .catch((err) => this.log.error({ err }, 'job runner failed'))
      .finally(() => {
        this.running = undefined;
        if (this.wakeRequested && !this.stopped) {
          this.wakeRequested = false;
          this.wake();
        }
      });
  }

  /**
   * Claims and runs due jobs until none is due; returns how many ran (tests call it directly).
   * A job its handler released (ReleaseJob: this process is stopping) ends the drain, which
   * would otherwise claim it again at once.
   */
  async drain(): Promise<number> {
    let ran = 0;
    for (let job = await this.claim(); job; job = await this.claim()) {
      const released = await this.execute(job);
      ran++;
      if (released) break;
    }
    return ran;
  }

  /**
   * One due job of a kind this runner handles, leased to it: queued and due, or running with
   * an expired lease. (Kinds it does not know are left for runners that do.)
   */
  async claim(): Promise<JobRow | null> {
    const kinds = [...this.handlers.keys()];
    if (kinds.length === 0) return null;
    const now = new Date(this.now()).toISOString();
    const until = new Date(this.now() + this.opts.leaseMs).toISOString();
    const result = await this.db.execute(sql`
      update jobs set status = 'running', locked_by = ${this.opts.owner}, locked_until = ${until}::timestamptz, attempts = attempts + 1
      where id = (
        select id from jobs
        where kind in (${sql.join(
          kinds.map((k) => sql`${k}`),
          sql`, `,
        )})
          and ((status = 'queued' and run_at <= ${now}::timestamptz) or (status = 'running' and locked_until < ${now}::timestamptz))
        order by run_at, id
        limit 1
        for update skip locked)
      returning id`);
    const id = rowsOf<{ id: string }>(result)[0]?.id;
    if (!id) return null;
    const [job] = await this.db.select().from(jobs).where(eq(jobs.id, id));
    return job ?? null;
  }

  /** Runs one claimed job; true when its handler released it (ReleaseJob). */
  private async execute(job: JobRow): Promise<boolean> {
    const handler = this.handlers.get(job.kind)!;
    const mine = and(eq(jobs.id, job.id), eq(jobs.lockedBy, this.opts.owner));
    const heartbeat = setInterval(
      () => {
        void this.db
          .update(jobs)
          .set({ lockedUntil: new Date(this.now() + this.opts.leaseMs) })
          .where(and(mine, eq(jobs.status, 'running')));
      },
      Math.max(50, this.opts.leaseMs / 3),
    );
    heartbeat.unref();
    try {
      await handler(job.payload, job);
      await this.db
        .update(jobs)
        .set({ status: 'succeeded', finishedAt: new Date(this.now()), lockedUntil: null })
        .where(mine);
    } catch (err) {
      if (err instanceof ReleaseJob) {
        await this.db
          .update(jobs)
          .set({
            status: 'queued',
            attempts: sql`greatest(${jobs.attempts} - 1, 0)`,
            lockedBy: null,
            lockedUntil: null,
          })
          .where(mine);
        return true;
      }
      const message = (err as Error).message ?? String(err);
      const retry = !(err instanceof FailJob) && job.attempts < job.maxAttempts;
      const delayMs = err instanceof RetryJob ? err.delayMs : 1000 * 2 ** job.attempts;
      this.log.warn({ job: job.id, kind: job.kind, attempt: job.attempts, retry, err }, 'job failed');
      await this.db
        .update(jobs)
        .set(
          retry
            ? {
                status: 'queued',
                lastError: message,
                lockedBy: null,
                lockedUntil: null,
                runAt: new Date(this.now() + delayMs),
              }
            : { status: 'failed', lastError: message, finishedAt: new Date(this.now()), lockedUntil: null },
        )
        .where(mine);
    } finally {
      clearInterval(heartbeat);
    }
    return false;
  }
}
