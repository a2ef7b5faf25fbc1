import { createRoute, z } from '@hono/zod-openapi';
import { RUN_STATUSES } from '../../db/schema/runs.ts';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

export const Run = z
  .object({
    id: z.string(),
    session_id: z.string(),
    workspace_id: z.string(),
    status: z.enum(['queued', 'in_progress', 'requires_action', 'completed', 'failed', 'cancelled']),
    model: z.string().nullable(),
    steps: z.number().int(),
    usage: z.object({ prompt_tokens: z.number().int(), completion_tokens: z.number().int() }),
    error: z.object({ code: z.string(), message: z.string() }).nullable().optional(),
    created_at: z.string(),
    finished_at: z.string().nullable(),
  })
  .openapi('Run');

export const Message = z
  .object({
    id: z.string(),
    session_id: z.string(),
    run_id: z.string().nullable(),
    role: z.enum(['system', 'user', 'assistant', 'tool']),
    content: z.string(),
    tool_calls: z.array(z.object({ id: z.string(), name: z.string(), arguments: z.string() })).nullable(),
    tool_call_id: z.string().nullable(),
    created_at: z.string(),
  })
  .openapi('Message');

export const Approval = z
  .object({
    id: z.string(),
    run_id: z.string(),
    session_id: z.string(),
    workspace_id: z.string(),
    code: z.string(),
    requires_org_admin: z.boolean().openapi({ description: 'a platform source update proposed by the agent: only an org admin decides it' }),
    status: z.enum(['pending', 'approved', 'denied', 'expired']),
    decision: z.string().nullable(),
    reason: z.string().nullable(),
    created_at: z.string(),
    expires_at: z.string(),
  })
  .openapi('Approval');

const security = [{ bearer: [] }];
const SesParams = z.object({ s: IdParam('s', 'ses_0abc') });
const RunParams = z.object({ r: IdParam('r', 'run_0abc') });
const sse = { 'text/event-stream': { schema: z.string() } };

export const postMessage = createRoute({
  method: 'post',
  path: '/v1/sessions/{s}/messages',
  tags: ['Runs'],
  security,
  summary: 'Send a message: starts a run (202). With ?stream=true the answer is the run\u2019s SSE stream.',
  request: {
    params: SesParams,
    query: z.object({ stream: z.enum(['true', 'false']).optional() }),
    body: { content: { 'application/json': { schema: z.object({ content: z.string().trim().min(1).max(200_000) }).strict() } }, required: true },
  },
  responses: {
    202: { content: { 'application/json': { schema: z.object({ message: Message, run: Run }) }, ...sse }, description: 'The run was started' },
    409: conflictResponse,
    503: jsonContent(z.object({ error: z.object({ code: z.string(), message: z.string() }) }), 'No model is configured'),
    ...errorResponses,
  },
});

export const listMessages = createRoute({
  method: 'get',
  path: '/v1/sessions/{s}/messages',
  tags: ['Runs'],
  security,
  summary: 'The session\u2019s transcript, oldest first',
  request: {
    params: SesParams,
    query: z.object({ limit: z.coerce.number().int().min(1).max(500).default(100), after: z.string().max(64).optional() }),
  },
  responses: { 200: jsonContent(z.object({ data: z.array(Message), has_more: z.boolean(), last_id: z.string().nullable() }), 'Messages'), ...errorResponses },
});

/** A comma-separated list of run statuses, checked by splitting (no pattern built at run time). */
const isStatusList = (v: string) => v.split(',').every((x) => (RUN_STATUSES as readonly string[]).includes(x));

export const listRuns = createRoute({
  method: 'get',
  path: '/v1/runs',
  tags: ['Runs'],
  security,
  summary: 'The team\u2019s runs, newest first (filter by status, workspace, session)',
  request: {
    query: ListQuery.extend({
      status: z
        .string()
        .max(200)
        .refine(isStatusList, `a comma-separated list of ${RUN_STATUSES.join(', ')}`)
        .optional()
        .openapi({ description: 'one status or several, comma-separated', example: 'queued,in_progress,requires_action' }),
      workspace: z.string().max(64).optional(),
      session: z.string().max(64).optional(),
    }),
  },
  responses: { 200: jsonContent(listOf(Run), 'Runs'), ...errorResponses },
});

export const getRun = createRoute({
  method: 'get',
  path: '/v1/runs/{r}',
  tags: ['Runs'],
  security,
  summary: 'A run',
  request: { params: RunParams },
  responses: { 200: jsonContent(Run, 'The run'), ...errorResponses },
});

export const cancelRun = createRoute({
  method: 'post',
  path: '/v1/runs/{r}/cancel',
  tags: ['Runs'],
  security,
  summary: 'Cancel: stops the model call and kills the running code',
  request: { params: RunParams },
  responses: { 200: jsonContent(Run, 'The run'), ...errorResponses },
});

export const runEvents = createRoute({
  method: 'get',
  path: '/v1/runs/{r}/events',
  tags: ['Runs'],
  security,
  summary: 'The run\u2019s events: SSE (resume with Last-Event-ID or ?after=), or a JSON list with Accept: application/json',
  request: { params: RunParams, query: z.object({ after: z.coerce.number().int().min(0).optional() }) },
  responses: {
    200: {
      content: { 'application/json': { schema: z.object({ data: z.array(z.object({ id: z.number(), event: z.string(), data: z.unknown(), created_at: z.string() })) }) }, ...sse },
      description: 'Events',
    },
    ...errorResponses,
  },
});

export const listApprovals = createRoute({
  method: 'get',
  path: '/v1/approvals',
  tags: ['Approvals'],
  security,
  summary: 'Approvals of the team (filter by status and workspace)',
  request: {
    query: z.object({ status: z.enum(['pending', 'approved', 'denied', 'expired']).optional(), workspace: z.string().max(64).optional() }),
  },
  responses: { 200: jsonContent(z.object({ data: z.array(Approval) }), 'Approvals'), ...errorResponses },
});

export const decideApproval = createRoute({
  method: 'post',
  path: '/v1/approvals/{a}',
  tags: ['Approvals'],
  security,
  summary: 'Decide: approve, deny, or approve_session (stop asking in this session)',
  request: {
    params: z.object({ a: IdParam('a', 'apr_0abc') }),
    body: {
      content: { 'application/json': { schema: z.object({ decision: z.enum(['approve', 'deny', 'approve_session']), reason: z.string().max(2000).optional() }).strict() } },
      required: true,
    },
  },
  responses: { 200: jsonContent(Approval, 'The decided approval'), 409: conflictResponse, ...errorResponses },
});

export const getUsage = createRoute({
  method: 'get',
  path: '/v1/usage',
  tags: ['Ops'],
  security,
  summary: 'Token usage of the team, grouped by workspace or model',
  request: { query: z.object({ group_by: z.enum(['workspace', 'model']).default('model') }) },
  responses: {
    200: jsonContent(z.object({ data: z.array(z.object({ key: z.string(), prompt_tokens: z.number(), completion_tokens: z.number(), calls: z.number() })) }), 'Usage'),
    ...errorResponses,
  },
});
