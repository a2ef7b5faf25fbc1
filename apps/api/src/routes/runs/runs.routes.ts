import { createRoute, z } from '@hono/zod-openapi';
import { RUN_STATUSES } from '../../db/schema/runs.ts';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { errorResponses, IdParam, jsonContent } from '../../http/router.ts';

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

const security = [{ bearer: [] }];
const RunParams = z.object({ run: IdParam('run', 'run_0abc') });
/** The run's events as a Server-Sent Events stream, an answer of the run routes and of a posted message. */
export const sse = { 'text/event-stream': { schema: z.string() } };

/** A comma-separated list of run statuses, checked by splitting (no pattern built at run time). */
const isStatusList = (v: string) => v.split(',').every((x) => (RUN_STATUSES as readonly string[]).includes(x));

export const listRuns = createRoute({
  operationId: 'listRuns',
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
        .openapi({
          description: 'one status or several, comma-separated',
          example: 'queued,in_progress,requires_action',
        }),
      workspace: z.string().max(64).optional(),
      session: z.string().max(64).optional(),
    }),
  },
  responses: { 200: jsonContent(listOf(Run), 'Runs'), ...errorResponses },
});

export const getRun = createRoute({
  operationId: 'getRun',
  method: 'get',
  path: '/v1/runs/{run}',
  tags: ['Runs'],
  security,
  summary: 'A run',
  request: { params: RunParams },
  responses: { 200: jsonContent(Run, 'The run'), ...errorResponses },
});

export const cancelRun = createRoute({
  operationId: 'cancelRun',
  method: 'post',
  path: '/v1/runs/{run}/cancel',
  tags: ['Runs'],
  security,
  summary: 'Cancel: stops the model call and kills the running code',
  request: { params: RunParams },
  responses: { 200: jsonContent(Run, 'The run'), ...errorResponses },
});

export const runEvents = createRoute({
  operationId: 'streamRunEvents',
  method: 'get',
  path: '/v1/runs/{run}/events',
  tags: ['Runs'],
  security,
  summary:
    'The run\u2019s events: SSE (resume with Last-Event-ID or ?after=), or a JSON list with Accept: application/json',
  request: { params: RunParams, query: z.object({ after: z.coerce.number().int().min(0).optional() }) },
  responses: {
    200: {
      content: {
        'application/json': {
          schema: z.object({
            data: z.array(z.object({ id: z.number(), event: z.string(), data: z.unknown(), created_at: z.string() })),
          }),
        },
        ...sse,
      },
      description: 'Events',
    },
    ...errorResponses,
  },
});
