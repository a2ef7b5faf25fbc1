import { createRoute, z } from '@hono/zod-openapi';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

const KINDS = ['memory', 'skill', 'knowledge', 'prompt', 'source', 'user', 'system'] as const;

export const Commit = z
  .object({
    sha: z.string(),
    kind: z.enum(KINDS),
    author: z.enum(['agent', 'user', 'system']),
    summary: z.string(),
    paths: z.array(z.string()),
    session_id: z.string().nullable(),
    run_id: z.string().nullable(),
    evolution_id: z.string().nullable(),
    created_at: z.string(),
  })
  .openapi('Commit');

const Redaction = z.object({ path: z.string(), line: z.number().int(), type: z.string() });
export const CommitOutcome = z
  .object({
    commit: Commit.nullable().openapi({ description: 'null when nothing changed' }),
    redactions: z.array(Redaction).openapi({ description: 'secrets replaced by [REDACTED:type] before the commit' }),
    refused: z.array(z.object({ path: z.string(), reason: z.string() })),
  })
  .openapi('CommitOutcome');

const WsParams = z.object({ ws: IdParam('ws', 'ws_0abc') });
const ShaParams = WsParams.extend({ sha: z.string().regex(/^[0-9a-f]{4,40}$/, 'must be 4 to 40 hex digits').openapi({ param: { name: 'sha', in: 'path' } }) });
const PathQuery = z.object({ path: z.string().min(1).max(1024) });
const security = [{ bearer: [] }];
const tags = ['Workspace files and history'];

export const getFiles = createRoute({
  method: 'get',
  path: '/v1/workspaces/{ws}/files',
  tags,
  security,
  summary: 'A directory listing or a file\u2019s content (`raw=true`: the bytes)',
  request: { params: WsParams, query: z.object({ path: z.string().max(1024).default(''), raw: z.enum(['true', 'false']).optional() }) },
  responses: {
    200: jsonContent(
      z.union([
        z.object({ path: z.string(), type: z.literal('dir'), entries: z.array(z.object({ name: z.string(), path: z.string(), type: z.enum(['file', 'dir']), size: z.number() })) }),
        z.object({ path: z.string(), type: z.literal('file'), size: z.number(), encoding: z.enum(['utf-8', 'base64']), content: z.string() }),
      ]),
      'Listing or content',
    ),
    ...errorResponses,
  },
});

export const putFile = createRoute({
  method: 'put',
  path: '/v1/workspaces/{ws}/files',
  tags,
  security,
  summary: 'Write a file (body = its bytes); commits it as Kiln-Author: user',
  request: { params: WsParams, query: PathQuery },
  responses: { 200: jsonContent(CommitOutcome, 'The commit (null if the content was unchanged)'), ...errorResponses },
});

export const deleteFile = createRoute({
  method: 'delete',
  path: '/v1/workspaces/{ws}/files',
  tags,
  security,
  summary: 'Delete a file; commits the deletion',
  request: { params: WsParams, query: PathQuery },
  responses: { 200: jsonContent(CommitOutcome, 'The commit'), ...errorResponses },
});

export const listCommits = createRoute({
  method: 'get',
  path: '/v1/workspaces/{ws}/commits',
  tags,
  security,
  summary: 'The workspace\u2019s history, newest first',
  request: {
    params: WsParams,
    query: z.object({
      kind: z.enum(KINDS).optional(),
      session: z.string().max(64).optional(),
      limit: z.coerce.number().int().min(1).max(100).default(20),
      after: z.string().regex(/^[0-9a-f]{40}$/, 'must be a full commit sha').optional(),
    }),
  },
  responses: { 200: jsonContent(z.object({ data: z.array(Commit), has_more: z.boolean(), last_id: z.string().nullable() }), 'Commits'), ...errorResponses },
});

export const getCommit = createRoute({
  method: 'get',
  path: '/v1/workspaces/{ws}/commits/{sha}',
  tags,
  security,
  summary: 'One commit with its diff',
  request: { params: ShaParams },
  responses: { 200: jsonContent(Commit.extend({ diff: z.string(), diff_truncated: z.boolean() }), 'The commit'), ...errorResponses },
});

export const revert = createRoute({
  method: 'post',
  path: '/v1/workspaces/{ws}/commits/{sha}/revert',
  tags,
  security,
  summary: 'Revert a commit with a new commit; 409 when it cannot apply cleanly (nothing changes)',
  request: { params: ShaParams },
  responses: { 201: jsonContent(CommitOutcome, 'The revert commit'), 409: conflictResponse, ...errorResponses },
});

export const searchMemory = createRoute({
  method: 'get',
  path: '/v1/workspaces/{ws}/memory/search',
  tags: ['Memory'],
  security,
  summary: 'Search core memory, daily logs, knowledge and skills',
  request: { params: WsParams, query: z.object({ q: z.string().trim().min(1).max(500), k: z.coerce.number().int().min(1).max(50).default(8) }) },
  responses: {
    200: jsonContent(
      z.object({ data: z.array(z.object({ path: z.string(), start_line: z.number(), end_line: z.number(), snippet: z.string(), score: z.number() })) }),
      'Best matches first',
    ),
    ...errorResponses,
  },
});
