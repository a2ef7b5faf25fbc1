import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

const Evolution = z
  .object({
    id: z.string(),
    kind: z.enum(['review', 'dream']),
    status: z
      .string()
      .openapi({ description: 'queued | running | committed | no_change | skipped | failed | reverted' }),
    session_id: z.string().nullable(),
    commit_sha: z.string().nullable(),
    changed_paths: z.array(z.string()),
    summary: z.string().nullable(),
    diary: z.string().nullable(),
    error: z.string().nullable(),
    created_at: z.string(),
    finished_at: z.string().nullable(),
  })
  .openapi('Evolution');

const security = [{ bearer: [] }];
const tags = ['Evolution'];
const WsParams = z.object({ workspace: IdParam('workspace', 'ws_0abc') });
const EvoParams = z.object({ workspace: IdParam('workspace', 'ws_0abc'), evolution: IdParam('evolution', 'evo_0abc') });
const body = <T extends z.ZodType>(schema: T) => ({ content: { 'application/json': { schema } }, required: false });

export const review = createRoute({
  operationId: 'reviewWorkspace',
  method: 'post',
  path: '/v1/workspaces/{workspace}/review',
  tags,
  security,
  summary: 'Run the post-session review now (a durable job; 202 with its evolution record)',
  description:
    'Without `session_id`, the workspace\u2019s most recently active session. A session with a run in progress is 409 `session_busy`.',
  request: {
    params: WsParams,
    body: body(z.object({ session_id: IdParam('session_id', 'ses_0abc').optional() }).strict()),
  },
  responses: { 202: jsonContent(Evolution, 'Queued'), 409: conflictResponse, ...errorResponses },
});

export const dream = createRoute({
  operationId: 'dreamWorkspace',
  method: 'post',
  path: '/v1/workspaces/{workspace}/dream',
  tags,
  security,
  summary: 'Run the memory consolidation (deep dream) now for the last `days` days (default 1)',
  request: { params: WsParams, body: body(z.object({ days: z.number().int().min(1).max(30).default(1) }).strict()) },
  responses: { 202: jsonContent(Evolution, 'Queued'), ...errorResponses },
});

export const list = createRoute({
  operationId: 'listEvolutions',
  method: 'get',
  path: '/v1/workspaces/{workspace}/evolutions',
  tags,
  security,
  summary: 'Reviews and dreams of a workspace, newest first: the evolution log',
  request: { params: WsParams, query: ListQuery.extend({ kind: z.enum(['review', 'dream']).optional() }) },
  responses: { 200: jsonContent(listOf(Evolution), 'Evolutions'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getEvolution',
  method: 'get',
  path: '/v1/workspaces/{workspace}/evolutions/{evolution}',
  tags,
  security,
  summary: 'One evolution',
  request: { params: EvoParams },
  responses: { 200: jsonContent(Evolution, 'The evolution'), ...errorResponses },
});

export const undo = createRoute({
  operationId: 'undoEvolution',
  method: 'post',
  path: '/v1/workspaces/{workspace}/evolutions/{evolution}/undo',
  tags,
  security,
  summary: 'Undo what an evolution committed (a revert commit); it is then `reverted`',
  request: { params: EvoParams },
  responses: {
    201: jsonContent(z.object({ evolution: Evolution, commit_sha: z.string() }), 'Undone'),
    409: conflictResponse,
    ...errorResponses,
  },
});
