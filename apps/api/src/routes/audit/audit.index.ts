import { createRoute, z } from '@hono/zod-openapi';
import { listAudit } from '../../audit/audit.ts';
import type { Db } from '../../db/client.ts';
import { ListQuery, listOf, toPage } from '../../http/pagination.ts';
import { createRouter, errorResponses, jsonContent } from '../../http/router.ts';

const AuditEvent = z
  .object({
    id: z.string(),
    team_id: z.string().nullable(),
    actor: z.string().nullable().openapi({ description: 'id of the key that acted (null = the system)' }),
    actor_role: z.string().nullable(),
    action: z.string(),
    resource_type: z.string().nullable(),
    resource_id: z.string().nullable(),
    before: z.unknown(),
    after: z.unknown(),
    request_id: z.string().nullable(),
    created_at: z.string(),
  })
  .openapi('AuditEvent');

const list = createRoute({
  method: 'get',
  path: '/v1/audit',
  tags: ['Ops'],
  security: [{ bearer: [] }],
  summary: 'Audit log: the team\u2019s events (org admin: every team\u2019s)',
  request: {
    query: ListQuery.extend({ action: z.string().max(100).optional(), actor: z.string().max(64).optional() }),
  },
  responses: { 200: jsonContent(listOf(AuditEvent), 'Audit events'), ...errorResponses },
});

export function auditRouter(db: Db) {
  return createRouter().openapi(list, async (c) => {
    const q = c.req.valid('query');
    const p = c.get('principal');
    const rows = await listAudit(db, p.role === 'org_admin' ? null : p.teamId, q, q);
    return c.json(
      toPage(rows, q, (e) => ({
        id: e.id,
        team_id: e.teamId,
        actor: e.actorKeyId,
        actor_role: e.actorRole,
        action: e.action,
        resource_type: e.resourceType,
        resource_id: e.resourceId,
        before: e.before,
        after: e.after,
        request_id: e.requestId,
        created_at: e.createdAt.toISOString(),
      })),
      200,
    );
  });
}
