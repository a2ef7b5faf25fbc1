import { createRoute, z } from '@hono/zod-openapi';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { Run, sse } from '../runs/runs.routes.ts';

const Message = z
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

const security = [{ bearer: [] }];
const SesParams = z.object({ session: IdParam('session', 'ses_0abc') });

export const postMessage = createRoute({
  operationId: 'postMessage',
  method: 'post',
  path: '/v1/sessions/{session}/messages',
  tags: ['Runs'],
  security,
  summary: 'Send a message: starts a run (202). With ?stream=true the answer is the run\u2019s SSE stream.',
  request: {
    params: SesParams,
    query: z.object({ stream: z.enum(['true', 'false']).optional() }),
    body: {
      content: {
        'application/json': { schema: z.object({ content: z.string().trim().min(1).max(200_000) }).strict() },
      },
      required: true,
    },
  },
  responses: {
    202: {
      content: { 'application/json': { schema: z.object({ message: Message, run: Run }) }, ...sse },
      description: 'The run was started',
    },
    409: conflictResponse,
    503: jsonContent(
      z.object({ error: z.object({ code: z.string(), message: z.string() }) }),
      'No model is configured',
    ),
    ...errorResponses,
  },
});

export const listMessages = createRoute({
  operationId: 'listMessages',
  method: 'get',
  path: '/v1/sessions/{session}/messages',
  tags: ['Runs'],
  security,
  summary: 'The session\u2019s transcript, oldest first',
  request: {
    params: SesParams,
    query: z.object({
      limit: z.coerce.number().int().min(1).max(500).default(100),
      after: z.string().max(64).optional(),
    }),
  },
  responses: {
    200: jsonContent(
      z.object({ data: z.array(Message), has_more: z.boolean(), last_id: z.string().nullable() }),
      'Messages',
    ),
    ...errorResponses,
  },
});
