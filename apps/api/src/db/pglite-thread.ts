import { Worker } from 'node:worker_threads';
import type { PGlite, QueryOptions, Results, Transaction } from '@electric-sql/pglite';
import type { StatementTimings } from './statements.ts';

type Request =
  | { op: 'query'; sql: string; params?: unknown[]; rowMode?: string; parsers?: number[]; tx?: number }
  | { op: 'exec'; sql: string; rowMode?: string; parsers?: number[]; tx?: number }
  | { op: 'begin' }
  | { op: 'commit' | 'rollback'; tx: number }
  | { op: 'dump'; path: string }
  | { op: 'close' };

/** An error from the database thread, with the Postgres fields (code, constraint, …) it carried. */
class PgliteThreadError extends Error {
  code?: string;
  constructor(fields: Record<string, unknown> & { message: string }) {
    super(fields.message);
    Object.assign(this, fields);
  }
}

/**
 * The embedded PGlite database in its own worker thread, behind the part of PGlite's interface
 * that drizzle uses (`query`, `exec`, `transaction`, `close`).
 *
 * Why: PGlite executes each statement synchronously in the thread that owns it. In the API's
 * thread, every statement — the write-behind of an agent step included — stopped the event loop
 * that is streaming other runs, answering HTTP and driving sandboxes. In a worker, statements run
 * alongside it, and the main thread only posts and receives messages.
 *
 * Parser functions cannot be sent to another thread: the type OIDs named in `parsers` come back
 * unparsed, which is exactly what drizzle asks for (timestamps, dates and intervals as text).
 */
export class PgliteThread {
  private readonly worker: Worker;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private nextId = 1;
  private failure?: Error;
  readonly ready: Promise<void>;

  constructor(
    dataDir?: string,
    /** Told how long each statement took, from the post to the answer (the metrics' statement latency). */
    private readonly timings?: StatementTimings,
    /** A data directory dumped by `dump`, to start from (an in-memory database only). */
    template?: string,
  ) {
    this.worker = new Worker(new URL('./pglite-thread.worker.mjs', import.meta.url), {
      workerData: { dataDir, template },
    });
    this.ready = new Promise((resolve, reject) => this.pending.set(0, { resolve: () => resolve(), reject }));
    this.worker.on(
      'message',
      (msg: { id: number; ok?: unknown; error?: Record<string, unknown> & { message: string } }) => {
        const waiting = this.pending.get(msg.id);
        if (!waiting) return;
        this.pending.delete(msg.id);
        if (msg.error) waiting.reject(new PgliteThreadError(msg.error));
        else waiting.resolve(msg.ok);
      },
    );
    const fail = (err: Error) => {
      this.failure = err;
      for (const waiting of this.pending.values()) waiting.reject(err);
      this.pending.clear();
    };
    this.worker.on('error', fail);
    this.worker.on('exit', (code) => fail(new Error(`the database thread exited (code ${code})`)));
  }

  static async open(dataDir?: string, timings?: StatementTimings, template?: string): Promise<PgliteThread> {
    const thread = new PgliteThread(dataDir, timings, template);
    try {
      await thread.ready;
    } catch (err) {
      await thread.worker.terminate();
      throw err;
    }
    return thread;
  }

  private send<T>(request: Request): Promise<T> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.worker.postMessage({ id, ...request });
    });
  }

  query<T>(sql: string, params?: unknown[], options?: QueryOptions, tx?: number): Promise<Results<T>> {
    const answer = this.send<Results<T>>({ op: 'query', sql, params, ...portable(options), tx });
    return this.timings ? this.timings.track(answer, sql) : answer;
  }

  exec(sql: string, options?: QueryOptions, tx?: number): Promise<Results[]> {
    const answer = this.send<Results[]>({ op: 'exec', sql, ...portable(options), tx });
    return this.timings ? this.timings.track(answer, sql) : answer;
  }

  /**
   * Runs `fn` in one transaction: commit when it resolves, rollback when it throws. Statements
   * from outside the transaction wait in PGlite until it ends, as they do in-thread.
   */
  async transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    const id = await this.send<number>({ op: 'begin' });
    let closed = false;
    const tx: Transaction = {
      query: (sql: string, params?: unknown[], options?: QueryOptions) => this.query(sql, params, options, id),
      exec: (sql: string, options?: QueryOptions) => this.exec(sql, options, id),
      sql: () => Promise.reject(new Error('tagged templates are not supported across threads')),
      rollback: async () => {
        closed = true;
        await this.send({ op: 'rollback', tx: id });
      },
      listen: () => Promise.reject(new Error('LISTEN is not supported in a transaction')),
      get closed() {
        return closed;
      },
    } as unknown as Transaction;
    let result: T;
    try {
      result = await fn(tx);
    } catch (err) {
      if (!closed) {
        closed = true;
        await this.send({ op: 'rollback', tx: id }).catch(() => {});
      }
      throw err;
    }
    if (!closed) {
      closed = true;
      await this.send({ op: 'commit', tx: id });
    }
    return result;
  }

  /** Writes the whole data directory as it is now to `path` (a tar, written aside and renamed into place). */
  dump(path: string): Promise<void> {
    return this.send({ op: 'dump', path });
  }

  async close(): Promise<void> {
    if (!this.failure) await this.send({ op: 'close' }).catch(() => {});
    await this.worker.terminate();
  }

  /** Typed as PGlite for drizzle, which only calls the methods above. */
  asPglite(): PGlite {
    return this as unknown as PGlite;
  }
}

function portable(options?: QueryOptions): { rowMode?: string; parsers?: number[] } {
  if (!options) return {};
  return { rowMode: options.rowMode, parsers: options.parsers ? Object.keys(options.parsers).map(Number) : undefined };
}
