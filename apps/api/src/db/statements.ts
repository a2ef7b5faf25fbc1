/** What a statement does, by its leading keyword: the label of the statement-latency histogram. */
export type StatementKind = 'select' | 'insert' | 'update' | 'delete' | 'other';

/** Told of every statement once it has answered (or failed): its driver, kind and seconds taken. */
export type StatementListener = (driver: 'postgres' | 'pglite', kind: StatementKind, seconds: number) => void;

const LEADING = /^[\s(]*([a-z]+)/i;
/** A write inside a CTE (`with w0 as (insert …)`, see db/batch.ts), looked for near the start only. */
const CTE_WRITE = /\b(insert|update|delete)\b/i;

/** Reads at most the first keyword (and, for `with`, the first 2 KB): a few string operations per statement. */
export function statementKind(sql: string): StatementKind {
  const word = LEADING.exec(sql.slice(0, 32))?.[1]?.toLowerCase();
  switch (word) {
    case 'select':
    case 'insert':
    case 'update':
    case 'delete':
      return word;
    case 'with': {
      const write = CTE_WRITE.exec(sql.slice(0, 2048))?.[1]?.toLowerCase();
      return (write as StatementKind | undefined) ?? 'select';
    }
    default:
      return 'other';
  }
}

/**
 * The statement timings of one database handle: the drivers' wrappers (db/client.ts, pglite-thread.ts)
 * time a statement only while someone listens, so an app without metrics pays one Set size check.
 */
export class StatementTimings {
  private readonly listeners = new Set<StatementListener>();

  constructor(readonly driver: 'postgres' | 'pglite') {}

  get active(): boolean {
    return this.listeners.size > 0;
  }

  /** Listens until the returned function is called. */
  on(listener: StatementListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** A statement that began at `started` (performance.now()) has answered. */
  done(sql: string, started: number): void {
    const seconds = (performance.now() - started) / 1000;
    const kind = statementKind(sql);
    for (const l of this.listeners) l(this.driver, kind, seconds);
  }

  /** `p`, telling the listeners when it settles. */
  track<T>(p: Promise<T>, sql: string): Promise<T> {
    if (!this.active) return p;
    const started = performance.now();
    return p.then(
      (v) => {
        this.done(sql, started);
        return v;
      },
      (err) => {
        this.done(sql, started);
        throw err;
      },
    );
  }
}
