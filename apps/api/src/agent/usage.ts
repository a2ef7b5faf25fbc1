import { eq, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { usage } from '../db/schema/index.ts';

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
