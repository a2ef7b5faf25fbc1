import { createRoute, z } from '@hono/zod-openapi';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import { createRouter, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';

const Sandbox = z
  .object({
    id: z.string(),
    session_id: z.string().nullable(),
    workspace_id: z.string().nullable(),
    state: z.enum(['starting', 'idle', 'busy']),
    memory_bytes: z.number().nullable(),
    cpu_percent: z.number().nullable(),
    limits: z.object({ memoryMb: z.number(), cpus: z.number(), pids: z.number(), timeoutS: z.number(), diskMb: z.number() }),
    created_at: z.string(),
    last_used_at: z.string(),
    expires_at: z.string(),
  })
  .openapi('Sandbox');

const list = createRoute({
  method: 'get',
  path: '/v1/sandboxes',
  tags: ['Sandboxes'],
  security: [{ bearer: [] }],
  summary: 'The team\u2019s live sandboxes with their memory and CPU use',
  responses: { 200: jsonContent(z.object({ data: z.array(Sandbox) }), 'Sandboxes'), ...errorResponses },
});

const remove = createRoute({
  method: 'delete',
  path: '/v1/sandboxes/{id}',
  tags: ['Sandboxes'],
  security: [{ bearer: [] }],
  summary: 'Remove a sandbox now; its session gets a fresh one on its next execution',
  request: { params: z.object({ id: IdParam('id', 'sbx_0abc') }) },
  responses: { 200: jsonContent(z.object({ id: z.string(), deleted: z.literal(true) }), 'Removed'), ...errorResponses },
});

export function sandboxesRouter(engine: SandboxEngine) {
  return createRouter()
    .openapi(list, async (c) => {
      const rows = await engine.listForTeam(teamOf(c));
      return c.json(
        {
          data: rows.map(({ row, state, memoryBytes, cpuPercent }) => ({
            id: row.id,
            session_id: row.sessionId,
            workspace_id: row.workspaceId,
            state: state as 'starting' | 'idle' | 'busy',
            memory_bytes: memoryBytes,
            cpu_percent: cpuPercent,
            limits: row.limits as { memoryMb: number; cpus: number; pids: number; timeoutS: number; diskMb: number },
            created_at: row.createdAt.toISOString(),
            last_used_at: row.lastUsedAt.toISOString(),
            expires_at: row.expiresAt.toISOString(),
          })),
        },
        200,
      );
    })
    .openapi(remove, async (c) => {
      const { id } = c.req.valid('param');
      await engine.removeForTeam(writableTeamOf(c), id);
      c.set('audit', { action: 'sandbox.delete', resourceType: 'sandbox', resourceId: id });
      return c.json({ id, deleted: true as const }, 200);
    });
}
