import { EventEmitter } from 'node:events';
import { and, asc, eq, gt, max, sql, type SQL } from 'drizzle-orm';
import { combine } from '../db/batch.ts';
import type { Db } from '../db/client.ts';
import { runEvents } from '../db/schema/index.ts';

export interface RunEvent {
  seq: number;
  event: string;
  data: unknown;
  createdAt: Date;
}

export const TERMINAL_EVENTS = new Set(['run.completed', 'run.failed', 'run.cancelled']);

/**
 * Run events are written to Postgres with their per-run sequence number first and only then
 * handed to live listeners, so a client that resumes from `Last-Event-ID` never misses or
 * repeats one. Appends for one run are serialised in this process.
 */
export class RunEventLog {
  private readonly bus = new EventEmitter();
  private readonly next = new Map<string, number>();
  private readonly tails = new Map<string, Promise<unknown>>();

  constructor(private readonly db: Db) {
    this.bus.setMaxListeners(0);
  }

  async append(runId: string, event: string, data: unknown = {}): Promise<RunEvent> {
    return (await this.appendMany(runId, [[event, data]]))[0]!;
  }

  /**
   * Several events in one statement, numbered consecutively — together with `writes`, the
   * changes they describe (messages, usage), so both land in one round trip and one commit.
   */
  appendMany(runId: string, items: [event: string, data: unknown][], writes: SQL[] = []): Promise<RunEvent[]> {
    const prev = this.tails.get(runId) ?? Promise.resolve();
    const done = prev.then(async () => {
      let seq = this.next.get(runId);
      if (seq === undefined) {
        const [row] = await this.db.select({ m: max(runEvents.seq) }).from(runEvents).where(eq(runEvents.runId, runId));
        seq = (row?.m ?? 0) + 1;
      }
      const createdAt = new Date();
      const evs = items.map(([event, data], i) => ({ seq: seq! + i, event, data, createdAt }));
      const insert = evs.length
        ? sql`insert into run_events (run_id, seq, event, data, created_at) values ${sql.join(
            evs.map((e) => sql`(${runId}, ${e.seq}, ${e.event}, ${JSON.stringify(e.data ?? {})}::jsonb, ${createdAt.toISOString()}::timestamptz)`),
            sql`, `,
          )}`
        : undefined;
      await this.db.execute(combine(writes, insert));
      this.next.set(runId, seq + evs.length);
      for (const ev of evs) this.bus.emit(runId, ev);
      if (evs.some((e) => TERMINAL_EVENTS.has(e.event))) this.next.delete(runId);
      return evs;
    });
    this.tails.set(runId, done.catch(() => undefined));
    return done;
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
