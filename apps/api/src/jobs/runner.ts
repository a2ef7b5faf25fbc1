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

/**
 * Jobs of some kinds run in a lane of their own, so that they never wait behind another lane's
 * long jobs (a template build takes minutes; a webhook delivery must not wait for it), with
 * `concurrency` jobs at once in this process, and at most `groupLimit` running at once per group
 * across every runner on the database (a job's group is its payload's `group`, e.g. its team:
 * one tenant's slow receivers then hold at most that many of the lane's workers).
 */
export interface Lane {
  name: string;
  concurrency: number;
  groupLimit?: number;
  /**
   * How often this lane looks for due jobs nobody woke it for (default: the runner's pollMs):
   * jobs owed by a statement elsewhere (a webhook event written with the run's end) are found this soon.
   */
  pollMs?: number;
}

const DEFAULT_LANE: Lane = { name: 'default', concurrency: 1 };

interface LaneState {
  lane: Lane;
  kinds: Set<string>;
  /** The lane's workers running now (at most `lane.concurrency`). */
  workers: Set<Promise<void>>;
  timer?: NodeJS.Timeout;
}

export interface JobRunnerOptions {
  /** This process; a lease names it. */
  instance: string;
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
  private readonly lanes = new Map<string, LaneState>();
  private stopped = true;

  constructor(
    private readonly db: Db,
    private readonly opts: JobRunnerOptions,
    private readonly log: Logger,
  ) {}

  /** The runner's clock (injectable in tests): due times and leases are compared with it. */
  now(): number {
    return this.opts.now ? this.opts.now() : Date.now();
  }

  /**
   * Runs jobs of `kind` with `handler`, in `lane` (default: the one-at-a-time lane of reviews,
   * dreams and template builds); `P` is the payload this kind's callers enqueue (stored as JSON).
   */
  handle<P>(kind: string, handler: (payload: P, job: JobRow) => Promise<void>, lane: Lane = DEFAULT_LANE): void {
    this.handlers.set(kind, handler as JobHandler);
    let state = this.lanes.get(lane.name);
    if (!state) {
      state = { lane, kinds: new Set(), workers: new Set() };
      this.lanes.set(lane.name, state);
      if (!this.stopped) this.poll(state);
    }
    state.kinds.add(kind);
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

  /** Starts working; jobs this instance held in a previous life are released at once. */
  async start(): Promise<void> {
    this.stopped = false;
    await this.db
      .update(jobs)
      .set({ lockedUntil: new Date(0) })
      .where(and(eq(jobs.status, 'running'), eq(jobs.instance, this.opts.instance)));
    for (const state of this.lanes.values()) this.poll(state);
    this.wake();
  }

  private poll(state: LaneState): void {
    const s = state;
    s.timer = setInterval(() => this.wakeLane(s), s.lane.pollMs ?? this.opts.pollMs);
    s.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const state of this.lanes.values()) clearInterval(state.timer);
    await Promise.all([...this.lanes.values()].flatMap((l) => [...l.workers]));
  }

  /** Runs due jobs until none is left, in every lane (one drain at a time per lane). */
  wake(): void {
    if (this.stopped) return;
    for (const state of this.lanes.values()) this.wakeLane(state);
  }

  /**
   * Starts one more worker in the lane, when it has a free slot: it claims and runs due jobs until
   * none is due, and each job it claims starts the next worker, so a lane with due jobs fills its
   * slots at once and an idle lane asks the database once a poll, not once per slot (eight
   * webhook slots polled every 500 ms were 16 claims a second, ~10 % of a core, on a server doing
   * nothing). A worker busy with a long job (a template build) never keeps a free slot from a job
   * that is due now: the worker it started, or the next poll's, takes it.
   */
  private wakeLane(state: LaneState): void {
    if (this.stopped || state.workers.size >= state.lane.concurrency) return;
    const worker: Promise<void> = this.work(state, true)
      .then(() => undefined)
      .catch((err) => this.log.error({ err, lane: state.lane.name }, 'job runner failed'))
      .finally(() => state.workers.delete(worker));
    state.workers.add(worker);
  }

  /**
   * One worker of a lane: claims and runs its due jobs until none is left (or a job is released).
   * With `spread`, a claimed job first wakes another worker for the jobs that may be due after it.
   */
  private async work(state: LaneState, spread = false): Promise<number> {
    let ran = 0;
    for (let job = await this.claim(state); job; job = await this.claim(state)) {
      if (spread) this.wakeLane(state);
      const released = await this.execute(job);
      ran++;
      if (released) break;
    }
    return ran;
  }

  /**
   * Claims and runs due jobs of every lane until none is due; returns how many ran (tests call
   * it directly).
   */
  async drain(): Promise<number> {
    const ran = await Promise.all([...this.lanes.values()].map((l) => this.drainLane(l)));
    return ran.reduce((a, b) => a + b, 0);
  }

  /**
   * The lane's workers (`concurrency` of them) claim and run its due jobs until none is due. A
   * job its handler released (ReleaseJob: this process is stopping) ends that worker, which
   * would otherwise claim it again at once.
   */
  private async drainLane(state: LaneState): Promise<number> {
    const ran = await Promise.all(Array.from({ length: state.lane.concurrency }, () => this.work(state)));
    return ran.reduce((a, b) => a + b, 0);
  }

  /**
   * One due job of a kind of the lane (default: any kind this runner handles), leased to it:
   * queued and due, or running with an expired lease — and, in a lane with a group limit, of a
   * group with fewer than that many running. (Kinds it does not know are left for runners that do.)
   */
  async claim(state?: LaneState): Promise<JobRow | null> {
    const kinds = [...(state?.kinds ?? this.handlers.keys())];
    if (kinds.length === 0) return null;
    const now = new Date(this.now()).toISOString();
    const until = new Date(this.now() + this.opts.leaseMs).toISOString();
    const inKinds = sql.join(
      kinds.map((k) => sql`${k}`),
      sql`, `,
    );
    const limit = state?.lane.groupLimit;
    const groupFree =
      limit === undefined
        ? sql``
        : sql`and (j.payload->>'group' is null or (
            select count(*) from jobs r
            where r.kind in (${inKinds}) and r.status = 'running' and r.locked_until >= ${now}::timestamptz
              and r.payload->>'group' = j.payload->>'group') < ${limit})`;
    const statement = sql`
      update jobs set status = 'running', locked_by = ${this.opts.instance}, locked_until = ${until}::timestamptz, attempts = attempts + 1
      where id = (
        select j.id from jobs j
        where j.kind in (${inKinds})
          and ((j.status = 'queued' and j.run_at <= ${now}::timestamptz) or (j.status = 'running' and j.locked_until < ${now}::timestamptz))
          ${groupFree}
        order by j.run_at, j.id
        limit 1
        for update skip locked)
      returning id`;
    // A group limit is exact: claims of the lane take turns (a transaction-scoped advisory lock),
    // so two workers never both see a group one short of its limit and both take a job of it.
    const result =
      limit === undefined
        ? await this.db.execute(statement)
        : await this.db.transaction(async (tx) => {
            await tx.execute(sql`select pg_advisory_xact_lock(hashtext(${`kiln.jobs.lane:${state!.lane.name}`}))`);
            return tx.execute(statement);
          });
    const id = rowsOf<{ id: string }>(result)[0]?.id;
    if (!id) return null;
    const [job] = await this.db.select().from(jobs).where(eq(jobs.id, id));
    return job ?? null;
  }

  /** Runs one claimed job; true when its handler released it (ReleaseJob). */
  private async execute(job: JobRow): Promise<boolean> {
    const handler = this.handlers.get(job.kind)!;
    const mine = and(eq(jobs.id, job.id), eq(jobs.instance, this.opts.instance));
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
            instance: null,
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
                instance: null,
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
