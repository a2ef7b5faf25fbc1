import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { errorResponses, jsonContent } from '../../http/router.ts';

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

export const list = createRoute({
  operationId: 'listAuditEvents',
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
