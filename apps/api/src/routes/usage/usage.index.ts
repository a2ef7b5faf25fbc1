import { usageOfTeam, type UsageTotal } from '../../agent/usage.ts';
import type { Db } from '../../db/client.ts';
import { teamOf } from '../../http/guards.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './usage.routes.ts';

const view = (u: UsageTotal) => ({
  key: u.key,
  prompt_tokens: u.promptTokens,
  completion_tokens: u.completionTokens,
  calls: u.calls,
});

export function usageRouter(db: Db) {
  return createRouter().openapi(r.getUsage, async (c) => {
    const rows = await usageOfTeam(db, teamOf(c), c.req.valid('query').group_by);
    return c.json({ data: rows.map(view) }, 200);
  });
}
