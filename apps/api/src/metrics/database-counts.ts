import { sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';

/** Rows of the three tables whose states the scrape reports, by state (cluster-wide: every replica writes them). */
export interface DatabaseCounts {
  runs: Record<string, number>;
  sandboxes: Record<string, number>;
  jobs: Record<string, number>;
  /** Live workspaces: of every team (`all`) and of the team that has the most (`largest_team`). */
  workspaces: Record<string, number>;
  /** Their working trees' bytes (as recorded at their last checked write), the same two ways. */
  workspace_bytes: Record<string, number>;
  /** Paused sandboxes' checkpoint bytes, the same two ways. */
  checkpoint_bytes: Record<string, number>;
}

export const WORKSPACE_SCOPES = ['all', 'largest_team'] as const;

export const SANDBOX_STATES = ['starting', 'ready', 'paused', 'resuming'] as const;
export const JOB_STATES = ['queued', 'running', 'failed'] as const;

/**
 * One statement for all of them, each a count grouped by an indexed column: runs by status
 * (runs_status_idx), jobs in three states (jobs_due_idx), sandboxes not removed (a scan of the
 * sandboxes table, which holds one row per sandbox ever started), live workspaces and their bytes,
 * of all teams and of the largest team (against the per-team caps; one figure, not a series a team).
 */
async function count(db: Db): Promise<DatabaseCounts> {
  const result = await db.execute(sql`
    select 'runs' as t, status as k, count(*)::int as n from runs group by status
    union all
    select 'sandboxes', state, count(*)::int from sandboxes where state in ('starting', 'ready', 'paused', 'resuming') group by state
    union all
    select 'jobs', status, count(*)::int from jobs where status in ('queued', 'running', 'failed') group by status
    union all
    select 'workspaces', 'all', count(*)::bigint from workspaces where deleted_at is null
    union all
    select 'workspace_bytes', 'all', coalesce(sum(size_bytes), 0)::bigint from workspaces where deleted_at is null
    union all
    select 'workspaces', 'largest_team', coalesce(max(n), 0)::bigint
      from (select count(*) as n from workspaces where deleted_at is null group by team_id) per_team
    union all
    select 'workspace_bytes', 'largest_team', coalesce(max(b), 0)::bigint
      from (select sum(size_bytes) as b from workspaces where deleted_at is null group by team_id) per_team
    union all
    select 'checkpoint_bytes', 'all', coalesce(sum(checkpoint_bytes), 0)::bigint from sandboxes where state = 'paused'
    union all
    select 'checkpoint_bytes', 'largest_team', coalesce(max(b), 0)::bigint
      from (select sum(checkpoint_bytes) as b from sandboxes where state = 'paused' group by team_id) per_team`);
  const counts: DatabaseCounts = {
    runs: {},
    sandboxes: {},
    jobs: {},
    workspaces: {},
    workspace_bytes: {},
    checkpoint_bytes: {},
  };
  for (const r of rowsOf<{ t: keyof DatabaseCounts; k: string; n: number | string }>(result)) {
    counts[r.t][r.k] = Number(r.n);
  }
  return counts;
}

/**
 * The counts for one scrape: the gauges that read them share one statement (a scrape that starts
 * while one is being read waits for it), and a database that does not answer within `timeoutMs`
 * fails the read (the scrape then answers without these gauges) instead of holding the scrape.
 */
export class CountsReader {
  private reading: Promise<DatabaseCounts | null> | undefined;

  constructor(
    private readonly db: Db,
    private readonly timeoutMs: number,
    /** Told once per failed read (null: the gauges are left out of this scrape). */
    private readonly onError: (err: Error) => void,
  ) {}

  read(): Promise<DatabaseCounts | null> {
    this.reading ??= this.readOnce()
      .catch((err: Error) => {
        this.onError(err);
        return null;
      })
      .finally(() => {
        this.reading = undefined;
      });
    return this.reading;
  }

  private async readOnce(): Promise<DatabaseCounts> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`the database did not answer within ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
    });
    const reading = count(this.db);
    // A late answer (or failure) after the deadline is dropped, not left unhandled.
    reading.catch(() => undefined);
    try {
      return await Promise.race([reading, late]);
    } finally {
      clearTimeout(timer);
    }
  }
}
