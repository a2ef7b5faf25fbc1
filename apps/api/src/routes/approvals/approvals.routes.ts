import { createRoute, z } from '@hono/zod-openapi';
import { listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

const Approval = z
  .object({
    id: z.string(),
    run_id: z.string(),
    session_id: z.string(),
    workspace_id: z.string(),
    code: z.string(),
    requires_org_admin: z
      .boolean()
      .openapi({ description: 'a platform source update proposed by the agent: only an org admin decides it' }),
    status: z.enum(['pending', 'approved', 'denied', 'expired']),
    decision: z.string().nullable(),
    reason: z.string().nullable(),
    created_at: z.string(),
    expires_at: z.string(),
  })
  .openapi('Approval');

const security = [{ bearer: [] }];

export const listApprovals = createRoute({
  operationId: 'listApprovals',
  method: 'get',
  path: '/v1/approvals',
  tags: ['Approvals'],
  security,
  summary: 'Approvals of the team (filter by status and workspace)',
  request: {
    query: z.object({
      status: z.enum(['pending', 'approved', 'denied', 'expired']).optional(),
      workspace: z.string().max(64).optional(),
      limit: z.coerce.number().int().min(1).max(200).default(200).openapi({ description: '1–200, default 200' }),
      after: z.string().min(1).max(64).optional().openapi({ description: 'last_id of the previous page' }),
    }),
  },
  responses: { 200: jsonContent(listOf(Approval), 'Approvals, oldest first'), ...errorResponses },
});

export const decideApproval = createRoute({
  operationId: 'decideApproval',
  method: 'post',
  path: '/v1/approvals/{approval}',
  tags: ['Approvals'],
  security,
  summary: 'Decide: approve, deny, or approve_session (stop asking in this session)',
  request: {
    params: z.object({ approval: IdParam('approval', 'apr_0abc') }),
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              decision: z.enum(['approve', 'deny', 'approve_session']),
              reason: z.string().max(2000).optional(),
            })
            .strict(),
        },
      },
      required: true,
    },
  },
  responses: { 200: jsonContent(Approval, 'The decided approval'), 409: conflictResponse, ...errorResponses },
});
