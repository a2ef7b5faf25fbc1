import { EventEmitter } from 'node:events';
import { and, asc, eq, gt, max, sql, type SQL } from 'drizzle-orm';
import { combine } from '../db/batch.ts';
import { rowsOf } from '../db/rows.ts';
import type { Database, Db } from '../db/client.ts';
import { isUniqueViolation } from '../db/errors.ts';
import { runEvents } from '../db/schema/index.ts';

export interface RunEvent {
  seq: number;
  event: string;
  data: unknown;
  createdAt: Date;
}

export const TERMINAL_EVENTS = new Set(['run.completed', 'run.failed', 'run.cancelled']);

/**
 * Events that are stored only if a write takes effect: `write` is a data-modifying statement
 * that returns at most one row with a jsonb column `data`, merged into each event's data.
 * (A run's terminal event is written only by the update that actually ends the run.)
 */
export interface GuardedEvents {
  write: SQL;
  events: [event: string, data: unknown][];
  /**
   * More writes of the same statement that take effect only with the guard: given the guard's
   * CTE name, each selects from it (e.g. the webhook delivery a run's end owes).
   */
  also?: (guard: SQL) => SQL[];
}

/**
 * Run events are written to Postgres with their per-run sequence number first and only then
 * handed to live listeners, so a client that resumes from `Last-Event-ID` never misses or
 * repeats one. Appends for one run are serialised in this process.
 */
const CHANNEL = 'kiln_run_events';

export class RunEventLog {
  private readonly bus = new EventEmitter();
  private readonly next = new Map<string, number>();
  private readonly tails = new Map<string, Promise<unknown>>();
  /** Per run, the queued plain append that has not started yet: later plain appends join it. */
  private readonly joinable = new Map<string, { items: [string, unknown][]; done: Promise<RunEvent[]> }>();
  /** The last seq handed to live listeners, per run (to fetch only what another replica added). */
  private readonly delivered = new Map<string, number>();
  private unlisten: (() => Promise<void>) | undefined;
  private remote = false;

  constructor(private readonly db: Db) {
    this.bus.setMaxListeners(0);
  }

  /**
   * With several replicas on one Postgres database: every append also sends a NOTIFY, and
   * events another replica appended are read back and handed to this process's followers.
   */
  async connect(listen: NonNullable<Database['listen']>): Promise<void> {
    this.unlisten = await listen(CHANNEL, (payload) => {
      const at = payload.lastIndexOf(':');
      const runId = payload.slice(0, at);
      const seq = Number(payload.slice(at + 1));
      if (this.bus.listenerCount(runId) === 0 || seq <= (this.delivered.get(runId) ?? 0)) return;
      this.catchUp(runId).catch(() => undefined);
    });
    this.remote = true;
  }

  async disconnect(): Promise<void> {
    await this.unlisten?.();
  }

  private async catchUp(runId: string): Promise<void> {
    for (const ev of await this.list(runId, this.delivered.get(runId) ?? 0)) {
      if (ev.seq <= (this.delivered.get(runId) ?? 0)) continue;
      this.delivered.set(runId, ev.seq);
      this.bus.emit(runId, ev);
    }
  }

  /** A run written together with its first events: they are numbered from 1 without asking the database. */
  begin(runId: string): void {
    this.next.set(runId, 1);
  }

  /** A run that was never written (its first write failed). */
  forget(runId: string): void {
    this.next.delete(runId);
  }

  async append(runId: string, event: string, data: unknown = {}): Promise<RunEvent> {
    return (await this.appendMany(runId, [[event, data]]))[0]!;
  }

  /**
   * Several events in one statement, numbered consecutively — together with `writes`, the
   * changes they describe (messages, usage), so both land in one round trip and one commit.
   *
   * Plain appends (events only) that arrive while an earlier write of the run is still in
   * flight join into one statement: a burst of output chunks costs one round trip per write
   * the database can do, not one per chunk. Each caller still gets its own events.
   */
  appendMany(
    runId: string,
    items: [event: string, data: unknown][],
    writes: SQL[] = [],
    guarded?: GuardedEvents,
  ): Promise<RunEvent[]> {
    const open = this.joinable.get(runId);
    if (open && !writes.length && !guarded && items.length) {
      const from = open.items.length;
      open.items.push(...items);
      return open.done.then((evs) => evs.slice(from, from + items.length));
    }
    const prev = this.tails.get(runId);
    const batch = { items: [...items], done: undefined as unknown as Promise<RunEvent[]> };
    const start = () => {
      // From here on, the statement is being made: later appends go into the next one.
      if (this.joinable.get(runId) === batch) this.joinable.delete(runId);
      // Another replica may have appended to this run since (an approval decided there): on a
      // sequence clash, re-read the last sequence number and try once more.
      return this.write(runId, batch.items, writes, guarded).catch((err) => {
        if (!isUniqueViolation(err)) throw err;
        this.next.delete(runId);
        return this.write(runId, batch.items, writes, guarded);
      });
    };
    const done = prev ? prev.then(start) : start();
    batch.done = done;
    if (prev && !writes.length && !guarded) this.joinable.set(runId, batch);
    else this.joinable.delete(runId);
    const tail = done.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(runId, tail);
    // The chain is only needed while appends are pending: drop it once the last one settled.
    void tail.then(() => {
      if (this.tails.get(runId) === tail) this.tails.delete(runId);
    });
    return done;
  }

  private write(
    runId: string,
    items: [event: string, data: unknown][],
    writes: SQL[],
    guarded?: GuardedEvents,
  ): Promise<RunEvent[]> {
    return (async () => {
      let seq = this.next.get(runId);
      if (seq === undefined) {
        const [row] = await this.db
          .select({ m: max(runEvents.seq) })
          .from(runEvents)
          .where(eq(runEvents.runId, runId));
        seq = (row?.m ?? 0) + 1;
      }
      const createdAt = new Date();
      const at = createdAt.toISOString();
      const evs = items.map(([event, data], i) => ({ seq: seq! + i, event, data, createdAt }));
      // Typed, so that the rows can also be a VALUES list in a UNION.
      const row = (e: { seq: number; event: string; data: unknown }) =>
        sql`(${runId}::text, ${e.seq}::int, ${e.event}::text, ${JSON.stringify(e.data ?? {})}::jsonb, ${at}::timestamptz)`;
      let statement: SQL;
      let ifWritten: RunEvent[] = [];
      if (!guarded) {
        const insert = evs.length
          ? sql`insert into run_events (run_id, seq, event, data, created_at) values ${sql.join(evs.map(row), sql`, `)}`
          : undefined;
        const notify =
          this.remote && insert ? sql`select pg_notify(${CHANNEL}, ${`${runId}:${evs.at(-1)!.seq}`})` : undefined;
        statement = notify ? combine([...writes, insert!], notify) : combine(writes, insert);
      } else {
        // The guard is the CTE after the writes; its events are selected from it, so they exist
        // only if it returned a row. The top statement says how many events went in.
        ifWritten = guarded.events.map(([event, data], i) => ({ seq: seq! + evs.length + i, event, data, createdAt }));
        const guard = sql.raw(`w${writes.length}`);
        const conditional = ifWritten.map(
          (e) =>
            sql`select ${runId}::text, ${e.seq}::int, ${e.event}::text, ${JSON.stringify(e.data ?? {})}::jsonb || ${guard}.data, ${at}::timestamptz from ${guard}`,
        );
        const selects = evs.length
          ? [sql`select * from (values ${sql.join(evs.map(row), sql`, `)}) v`, ...conditional]
          : conditional;
        const insert = sql`insert into run_events (run_id, seq, event, data, created_at) ${sql.join(selects, sql` union all `)} returning seq, data`;
        const inserted = sql.raw(`w${writes.length + 1}`);
        const last = ifWritten.at(-1)?.seq ?? seq + evs.length - 1;
        const notify = this.remote ? sql`, pg_notify(${CHANNEL}, ${`${runId}:${last}`})` : sql``;
        statement = combine(
          [...writes, guarded.write, insert, ...(guarded.also?.(guard) ?? [])],
          sql`select (select json_agg(json_build_object('seq', seq, 'data', data)) from ${inserted}) as inserted${notify}`,
        );
      }
      const result = await this.db.execute(statement);
      if (guarded) {
        const inserted = rowsOf<{ inserted: { seq: number; data: unknown }[] | null }>(result)[0]?.inserted ?? [];
        // What the guard returned is part of the stored data: hand out exactly what was stored.
        for (const e of ifWritten) {
          const stored = inserted.find((r) => r.seq === e.seq);
          if (stored) evs.push({ ...e, data: stored.data });
        }
      }
      this.next.set(runId, seq + evs.length);
      // Events another replica added before ours go out first, so followers never see a gap.
      if (this.remote && evs.length && evs[0]!.seq > (this.delivered.get(runId) ?? 0) + 1) await this.catchUp(runId);
      for (const ev of evs) {
        if (ev.seq <= (this.delivered.get(runId) ?? 0)) continue;
        this.delivered.set(runId, ev.seq);
        this.bus.emit(runId, ev);
      }
      if (evs.some((e) => TERMINAL_EVENTS.has(e.event))) this.next.delete(runId);
      return evs;
    })();
  }

  async list(runId: string, after = 0): Promise<RunEvent[]> {
    const rows = await this.db
      .select()
      .from(runEvents)
      .where(and(eq(runEvents.runId, runId), gt(runEvents.seq, after)))
      .orderBy(asc(runEvents.seq));
    return rows.map((r) => ({ seq: r.seq, event: r.event, data: r.data, createdAt: r.createdAt }));
  }

  /**
   * Replays stored events after `after`, then follows live ones, in order and without gaps:
   * the live listener is attached before the replay is read, and anything it sees twice is dropped.
   */
  async follow(runId: string, after: number, onEvent: (ev: RunEvent) => void, signal: AbortSignal): Promise<void> {
    let last = after;
    const buffered: RunEvent[] = [];
    let replaying = true;
    const deliver = (ev: RunEvent) => {
      if (ev.seq <= last) return;
      last = ev.seq;
      onEvent(ev);
    };
    const live = (ev: RunEvent) => (replaying ? buffered.push(ev) : deliver(ev));
    this.bus.on(runId, live);
    signal.addEventListener('abort', () => this.bus.off(runId, live), { once: true });
    for (const ev of await this.list(runId, after)) deliver(ev);
    replaying = false;
    for (const ev of buffered) deliver(ev);
  }
}
