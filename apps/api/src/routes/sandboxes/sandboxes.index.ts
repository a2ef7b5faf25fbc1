import { teamOf, writableTeamOf } from '../../http/guards.ts';
import { createRouter } from '../../http/router.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';
import * as r from './sandboxes.routes.ts';

export function sandboxesRouter(engine: SandboxEngine) {
  return createRouter()
    .openapi(r.list, async (c) => {
      const rows = await engine.listForTeam(teamOf(c));
      return c.json(
        {
          data: rows.map(({ row, state, runtime, memoryBytes, cpuPercent, reclaimAt }) => ({
            id: row.id,
            session_id: row.sessionId,
            workspace_id: row.workspaceId,
            image: row.image,
            state,
            paused_at: row.pausedAt?.toISOString() ?? null,
            checkpoint_bytes: row.checkpointBytes,
            runtime,
            memory_bytes: memoryBytes,
            cpu_percent: cpuPercent,
            limits: row.limits as { memoryMb: number; cpus: number; pids: number; timeoutS: number; diskMb: number },
            created_at: row.createdAt.toISOString(),
            last_used_at: row.lastUsedAt.toISOString(),
            expires_at: row.expiresAt.toISOString(),
            reclaim_at: reclaimAt.toISOString(),
          })),
        },
        200,
      );
    })
    .openapi(r.remove, async (c) => {
      const { sandbox: id } = c.req.valid('param');
      await engine.removeForTeam(writableTeamOf(c), id);
      c.set('audit', { action: 'sandbox.delete', resourceType: 'sandbox', resourceId: id });
      return c.json({ id, deleted: true as const }, 200);
    });
}
