import { eq, sql } from 'drizzle-orm';
import type { Db } from '../../db/client.ts';
import { usage } from '../../db/schema/index.ts';
import { teamOf } from '../../http/guards.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './usage.routes.ts';

export function usageRouter(db: Db) {
  return createRouter().openapi(r.getUsage, async (c) => {
    const team = teamOf(c);
    const col = c.req.valid('query').group_by === 'workspace' ? usage.workspaceId : usage.model;
    const rows = await db
      .select({
        key: col,
        prompt_tokens: sql<number>`sum(${usage.promptTokens})::int`,
        completion_tokens: sql<number>`sum(${usage.completionTokens})::int`,
        calls: sql<number>`count(*)::int`,
      })
      .from(usage)
      .where(eq(usage.teamId, team))
      .groupBy(col);
    return c.json({ data: rows.map((x) => ({ ...x, prompt_tokens: Number(x.prompt_tokens), completion_tokens: Number(x.completion_tokens), calls: Number(x.calls) })) }, 200);
  });
}
