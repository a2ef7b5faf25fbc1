import { createRoute, z } from '@hono/zod-openapi';
import { isDay } from '../../memory/query.ts';
import { isPathPrefix } from '../../memory/search.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

const KINDS = ['memory', 'skill', 'knowledge', 'prompt', 'source', 'user', 'system'] as const;

const Commit = z
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
const CommitOutcome = z
  .object({
    // A union, not Commit.nullable(): that would register the nullable copy as the Commit component.
    commit: z.union([Commit, z.null()]).openapi({ description: 'null when nothing changed' }),
    redactions: z.array(Redaction).openapi({ description: 'secrets replaced by [REDACTED:type] before the commit' }),
    refused: z.array(z.object({ path: z.string(), reason: z.string() })),
  })
  .openapi('CommitOutcome');

const WsParams = z.object({ workspace: IdParam('workspace', 'ws_0abc') });
const ShaParams = WsParams.extend({
  sha: z
    .string()
    .regex(/^[0-9a-f]{4,40}$/, 'must be 4 to 40 hex digits')
    .openapi({ param: { name: 'sha', in: 'path' } }),
});
const PathQuery = z.object({ path: z.string().min(1).max(1024) });
const security = [{ bearer: [] }];
const tags = ['Workspace files and history'];

export const getFiles = createRoute({
  operationId: 'getWorkspaceFiles',
  method: 'get',
  path: '/v1/workspaces/{workspace}/files',
  tags,
  security,
  summary: 'A directory listing or a file\u2019s content (`raw=true`: the bytes)',
  request: {
    params: WsParams,
    query: z.object({ path: z.string().max(1024).default(''), raw: z.enum(['true', 'false']).optional() }),
  },
  responses: {
    200: jsonContent(
      z.union([
        z.object({
          path: z.string(),
          type: z.literal('dir'),
          entries: z.array(
            z.object({ name: z.string(), path: z.string(), type: z.enum(['file', 'dir']), size: z.number() }),
          ),
        }),
        z.object({
          path: z.string(),
          type: z.literal('file'),
          size: z.number(),
          encoding: z.enum(['utf-8', 'base64']),
          content: z.string(),
        }),
      ]),
      'Listing or content',
    ),
    ...errorResponses,
  },
});

export const putFile = createRoute({
  operationId: 'putWorkspaceFile',
  method: 'put',
  path: '/v1/workspaces/{workspace}/files',
  tags,
  security,
  summary: 'Write a file (body = its bytes, or JSON {content, encoding}); commits it as Kiln-Author: user',
  description:
    "The body is the file's bytes, with any content type but `application/json`. Sent as `application/json`, " +
    'the body is the file as GET answers it: `{"content": "…", "encoding": "utf-8" | "base64"}` (encoding ' +
    "defaults to utf-8); a JSON body of another shape is `400`, never committed as the file's text.",
  request: {
    params: WsParams,
    query: PathQuery,
    // Documented for clients (the SDK's types); not validated here: the route reads the body itself.
    body: {
      content: { 'application/octet-stream': { schema: z.string().openapi({ format: 'binary' }) } },
      required: true,
    },
  },
  responses: { 200: jsonContent(CommitOutcome, 'The commit (null if the content was unchanged)'), ...errorResponses },
});

export const deleteFile = createRoute({
  operationId: 'deleteWorkspaceFile',
  method: 'delete',
  path: '/v1/workspaces/{workspace}/files',
  tags,
  security,
  summary: 'Delete a file; commits the deletion',
  request: { params: WsParams, query: PathQuery },
  responses: { 200: jsonContent(CommitOutcome, 'The commit'), ...errorResponses },
});

export const listCommits = createRoute({
  operationId: 'listCommits',
  method: 'get',
  path: '/v1/workspaces/{workspace}/commits',
  tags,
  security,
  summary: 'The workspace\u2019s history, newest first',
  request: {
    params: WsParams,
    query: z.object({
      kind: z.enum(KINDS).optional(),
      session: z.string().max(64).optional(),
      limit: z.coerce.number().int().min(1).max(100).default(20),
      after: z
        .string()
        .regex(/^[0-9a-f]{40}$/, 'must be a full commit sha')
        .optional(),
    }),
  },
  responses: {
    200: jsonContent(
      z.object({ data: z.array(Commit), has_more: z.boolean(), last_id: z.string().nullable() }),
      'Commits',
    ),
    ...errorResponses,
  },
});

export const getCommit = createRoute({
  operationId: 'getCommit',
  method: 'get',
  path: '/v1/workspaces/{workspace}/commits/{sha}',
  tags,
  security,
  summary: 'One commit with its diff',
  request: { params: ShaParams },
  responses: {
    200: jsonContent(Commit.extend({ diff: z.string(), diff_truncated: z.boolean() }), 'The commit'),
    ...errorResponses,
  },
});

export const revert = createRoute({
  operationId: 'revertCommit',
  method: 'post',
  path: '/v1/workspaces/{workspace}/commits/{sha}/revert',
  tags,
  security,
  summary: 'Revert a commit with a new commit; 409 when it cannot apply cleanly (nothing changes)',
  request: { params: ShaParams },
  responses: { 201: jsonContent(CommitOutcome, 'The revert commit'), 409: conflictResponse, ...errorResponses },
});

const Day = z.string().refine(isDay, 'must be a real calendar date, YYYY-MM-DD');

export const SearchQuery = z
  .object({
    q: z
      .string()
      .trim()
      .min(1)
      .max(500)
      .openapi({ description: 'What to find: words, identifiers, Chinese or Japanese text' }),
    k: z.coerce.number().int().min(1).max(50).default(8).openapi({ description: 'Hits per page, 1–50 (default 8)' }),
    path: z
      .string()
      .min(1)
      .max(200)
      .refine(isPathPrefix, 'must be a relative path prefix inside the workspace, such as memory/')
      .optional()
      .openapi({
        description: 'Only files whose path starts with this: `memory/`, `knowledge/`, `skills/`, `MEMORY.md`',
      }),
    since: Day.optional().openapi({ description: 'Only dated logs of this day or later' }),
    until: Day.optional().openapi({ description: 'Only dated logs of this day or earlier' }),
    cursor: z
      .string()
      .min(1)
      .max(200)
      .optional()
      .openapi({ description: 'next_cursor of the previous page (same query and filters)' }),
    debug: z.enum(['true', 'false']).optional().openapi({ description: 'true: each hit carries its score parts' }),
  })
  .refine((v) => !v.since || !v.until || v.since <= v.until, {
    message: 'since must not be after until',
    path: ['since'],
  });

const SearchHit = z
  .object({
    path: z.string(),
    start_line: z.number().openapi({ description: 'First line of the snippet (1-based)' }),
    end_line: z.number().openapi({ description: 'Last line of the snippet' }),
    snippet: z.string().openapi({ description: 'The best-matching lines and their neighbours' }),
    score: z.number(),
    date: z.string().nullable().openapi({ description: 'The date of a dated log, else null' }),
    heading: z.string().nullable().openapi({ description: 'The heading the lines are under' }),
    debug: z
      .object({
        bm25: z.number(),
        lexical_rank: z.number().nullable(),
        vector_similarity: z.number().nullable(),
        vector_rank: z.number().nullable(),
        recency: z.number(),
        builtin: z.number(),
        terms: z.array(
          z.object({
            term: z.string(),
            kind: z.enum(['word', 'variant', 'cjk', 'substring']),
            df: z.number(),
            idf: z.number(),
          }),
        ),
        chunk: z.object({ start_line: z.number(), end_line: z.number() }),
      })
      .optional()
      .openapi({ description: 'With debug=true: why the hit ranks where it does' }),
  })
  .openapi('MemoryHit');

export const searchMemory = createRoute({
  operationId: 'searchMemory',
  method: 'get',
  path: '/v1/workspaces/{workspace}/memory/search',
  tags: ['Memory'],
  security,
  summary: 'Search core memory, daily logs, knowledge and skills (BM25, best-matching lines as snippets)',
  request: { params: WsParams, query: SearchQuery },
  responses: {
    200: jsonContent(
      z.object({ data: z.array(SearchHit), has_more: z.boolean(), next_cursor: z.string().nullable() }),
      'Best matches first',
    ),
    ...errorResponses,
  },
});

export const getMemoryUsage = createRoute({
  operationId: 'getMemoryUsage',
  method: 'get',
  path: '/v1/workspaces/{workspace}/memory',
  tags,
  security,
  summary: 'How much of its core-memory budget MEMORY.md uses (a write over it is refused)',
  request: { params: WsParams },
  responses: {
    200: jsonContent(
      z.object({
        path: z.literal('MEMORY.md'),
        entries: z.number().int().openapi({ description: '"- " bullets in MEMORY.md now' }),
        bytes: z.number().int(),
        max_entries: z.number().int().openapi({ description: 'evolution.memory_max_entries' }),
        max_bytes: z.number().int().openapi({ description: 'evolution.memory_max_bytes' }),
      }),
      'The budget and its use',
    ),
    ...errorResponses,
  },
});

export const listSkills = createRoute({
  operationId: 'listSkills',
  method: 'get',
  path: '/v1/workspaces/{workspace}/skills',
  tags,
  security,
  summary: 'The workspace\u2019s skills (every skills/**/SKILL.md) with their front matter\u2019s name and description',
  request: { params: WsParams },
  responses: {
    200: jsonContent(
      z.object({
        data: z.array(
          z.object({
            name: z.string(),
            description: z.string(),
            path: z.string().openapi({ description: 'the SKILL.md, relative to the workspace' }),
            builtin: z.boolean().openapi({ description: 'under skills/builtin/: read-only for people and agents' }),
          }),
        ),
      }),
      'Skills',
    ),
    ...errorResponses,
  },
});
