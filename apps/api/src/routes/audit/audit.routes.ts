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
    query: ListQuery.extend({
      action: z.string().max(100).optional().openapi({ description: 'exactly this action, e.g. workspace.update' }),
      actor: z.string().max(64).optional().openapi({ description: 'the id of the key that acted' }),
      resource_type: z.string().max(64).optional().openapi({ description: 'e.g. workspace, session, commit' }),
      resource: z.string().max(128).optional().openapi({ description: 'the id of the resource acted on' }),
      since: z.iso
        .datetime({ offset: true })
        .optional()
        .openapi({ description: 'only events at or after this time (ISO 8601)' }),
      until: z.iso.datetime({ offset: true }).optional().openapi({ description: 'only events before this time' }),
    }),
  },
  responses: { 200: jsonContent(listOf(AuditEvent), 'Audit events'), ...errorResponses },
});
