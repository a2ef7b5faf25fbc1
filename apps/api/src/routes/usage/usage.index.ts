import { dailyUsageOfTeam, usageOfTeam, type UsageTotal } from '../../agent/usage.ts';
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
  return createRouter()
    .openapi(r.getUsage, async (c) => {
      const rows = await usageOfTeam(db, teamOf(c), c.req.valid('query').group_by);
      return c.json({ data: rows.map(view) }, 200);
    })
    .openapi(r.getDailyUsage, async (c) => {
      const q = c.req.valid('query');
      const { from, to, rows } = await dailyUsageOfTeam(db, teamOf(c), { days: q.days, workspaceId: q.workspace });
      const data = rows.map((d) => ({
        workspace_id: d.workspaceId,
        day: d.day,
        prompt_tokens: d.promptTokens,
        completion_tokens: d.completionTokens,
        calls: d.calls,
        runs: d.runs,
      }));
      return c.json({ from, to, data }, 200);
    });
}
