import { eq, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { runs, usage } from '../db/schema/index.ts';

/** One group of a team's token usage: a workspace id or a model name, with its sums. */
export interface UsageTotal {
  key: string;
  promptTokens: number;
  completionTokens: number;
  calls: number;
}

/** The team's token usage (what its runs' model calls reported), summed per workspace or per model. */
export async function usageOfTeam(db: Db, teamId: string, groupBy: 'workspace' | 'model'): Promise<UsageTotal[]> {
  const col = groupBy === 'workspace' ? usage.workspaceId : usage.model;
  const rows = await db
    .select({
      key: col,
      promptTokens: sql<number>`sum(${usage.promptTokens})::int`,
      completionTokens: sql<number>`sum(${usage.completionTokens})::int`,
      calls: sql<number>`count(*)::int`,
    })
    .from(usage)
    .where(eq(usage.teamId, teamId))
    .groupBy(col);
  // The drivers may answer the sums as strings.
  return rows.map((x) => ({
    key: x.key,
    promptTokens: Number(x.promptTokens),
    completionTokens: Number(x.completionTokens),
    calls: Number(x.calls),
  }));
}

/** One workspace's model calls, tokens and runs on one UTC day. */
export interface DailyUsage {
  workspaceId: string;
  /** YYYY-MM-DD (UTC). */
  day: string;
  promptTokens: number;
  completionTokens: number;
  calls: number;
  runs: number;
}

/**
 * The team's usage per workspace and UTC day over the last `days` days (today included): model
 * calls and tokens from `usage`, runs started from `runs`. Days without either are left out.
 */
export async function dailyUsageOfTeam(
  db: Db,
  teamId: string,
  opts: { days: number; workspaceId?: string; now?: Date },
): Promise<{ from: string; to: string; rows: DailyUsage[] }> {
  const today = new Date(opts.now ?? Date.now());
  today.setUTCHours(0, 0, 0, 0);
  const from = new Date(today.getTime() - (opts.days - 1) * 86_400_000);
  const ws = opts.workspaceId ? sql`and workspace_id = ${opts.workspaceId}` : sql``;
  const result = await db.execute(sql`
    with calls as (
      select workspace_id, to_char(created_at at time zone 'UTC', 'YYYY-MM-DD') as day,
             sum(prompt_tokens)::int as prompt_tokens, sum(completion_tokens)::int as completion_tokens,
             count(*)::int as calls
      from ${usage} where team_id = ${teamId} and created_at >= ${from.toISOString()}::timestamptz ${ws}
      group by 1, 2
    ), started as (
      select workspace_id, to_char(created_at at time zone 'UTC', 'YYYY-MM-DD') as day, count(*)::int as runs
      from ${runs} where team_id = ${teamId} and created_at >= ${from.toISOString()}::timestamptz ${ws}
      group by 1, 2
    )
    select coalesce(c.workspace_id, s.workspace_id) as workspace_id, coalesce(c.day, s.day) as day,
           coalesce(c.prompt_tokens, 0) as prompt_tokens, coalesce(c.completion_tokens, 0) as completion_tokens,
           coalesce(c.calls, 0) as calls, coalesce(s.runs, 0) as runs
    from calls c full outer join started s on c.workspace_id = s.workspace_id and c.day = s.day
    order by 1, 2`);
  const rows = rowsOf<Record<string, string | number>>(result).map((r) => ({
    workspaceId: String(r.workspace_id),
    day: String(r.day),
    promptTokens: Number(r.prompt_tokens),
    completionTokens: Number(r.completion_tokens),
    calls: Number(r.calls),
    runs: Number(r.runs),
  }));
  const iso = (d: Date) => d.toISOString().slice(0, 10);
  return { from: iso(from), to: iso(today), rows };
}
