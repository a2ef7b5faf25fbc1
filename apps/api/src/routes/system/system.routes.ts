import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';

const STATUSES = ['checking', 'ready', 'failed', 'applying', 'applied', 'rolled_back'] as const;

const Check = z.object({
  name: z.enum(['install', 'typecheck', 'dashboard', 'smoke', 'boot', 'readyz', 'restart']),
  ok: z.boolean(),
  duration_ms: z.number().int(),
  log: z.string().openapi({ description: 'head and tail of the output, keys redacted' }),
});

const Update = z
  .object({
    id: z.string(),
    status: z
      .enum(STATUSES)
      .openapi({ description: 'checking → ready | failed → applying → applied | rolled_back (| failed)' }),
    reason: z.string(),
    commit_sha: z
      .string()
      .nullable()
      .openapi({ description: 'the commit that carries the patch (trailers Kiln-Kind: source, Kiln-Update: <id>)' }),
    changed_paths: z.array(z.string()),
    checks: z.array(Check),
    error: z.string().nullable(),
    created_at: z.string(),
    finished_at: z.string().nullable(),
  })
  .openapi('PlatformUpdate');

const Version = z
  .object({
    commit: z.string().nullable().openapi({ description: 'the commit this server process runs' }),
    tree: z.string().nullable(),
    branch: z.string().nullable(),
    source_dir: z.string(),
    pid: z.number().int(),
    started_at: z.string(),
  })
  .openapi('PlatformVersion');

const Params = z.object({ update: IdParam('update', 'evo_0abc') });
const security = [{ bearer: [] }];
const tags = ['Platform self-update'];

export const submit = createRoute({
  operationId: 'submitUpdate',
  method: 'post',
  path: '/v1/system/updates',
  tags,
  security,
  summary: 'Submit a patch to the platform source (org admin); the self-check runs in the background',
  request: {
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              patch: z
                .string()
                .min(1)
                .max(4 * 1024 * 1024)
                .openapi({ description: 'a unified diff (git diff) against the source HEAD' }),
              reason: z.string().trim().min(1).max(4000),
            })
            .strict(),
        },
      },
      required: true,
    },
  },
  responses: { 202: jsonContent(Update, 'Accepted; status `checking`'), 409: conflictResponse, ...errorResponses },
});

export const list = createRoute({
  operationId: 'listUpdates',
  method: 'get',
  path: '/v1/system/updates',
  tags,
  security,
  summary: 'List platform updates (org admin)',
  request: { query: ListQuery.extend({ status: z.enum(STATUSES).optional() }) },
  responses: { 200: jsonContent(listOf(Update), 'Updates'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getUpdate',
  method: 'get',
  path: '/v1/system/updates/{update}',
  tags,
  security,
  summary: 'One platform update with its checks (org admin)',
  request: { params: Params },
  responses: { 200: jsonContent(Update, 'The update'), ...errorResponses },
});

export const apply = createRoute({
  operationId: 'applyUpdate',
  method: 'post',
  path: '/v1/system/updates/{update}/apply',
  tags,
  security,
  summary: 'Commit a ready update on the source branch and restart into it through the relay (org admin)',
  request: { params: Params },
  responses: {
    202: jsonContent(Update, 'Accepted; status `applying`; this server stops shortly'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const revert = createRoute({
  operationId: 'revertUpdate',
  method: 'post',
  path: '/v1/system/updates/{update}/revert',
  tags,
  security,
  summary: 'Submit the reverse of an applied update, as a new update that passes the self-check (org admin)',
  request: { params: Params },
  responses: {
    202: jsonContent(Update, 'The new update; status `checking`'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const version = createRoute({
  operationId: 'getVersion',
  method: 'get',
  path: '/v1/system/version',
  tags,
  security,
  summary: 'The commit this server runs (org admin)',
  responses: { 200: jsonContent(Version, 'The running version'), ...errorResponses },
});

export const sourceUpdates = createRoute({
  operationId: 'putSourceUpdates',
  method: 'put',
  path: '/v1/system/workspaces/{workspace}/source-updates',
  tags,
  security,
  summary: 'Let a workspace\u2019s agent propose platform source updates, each approved by an org admin (org admin)',
  request: {
    params: z.object({ workspace: IdParam('workspace', 'ws_0abc') }),
    body: { content: { 'application/json': { schema: z.object({ enabled: z.boolean() }).strict() } }, required: true },
  },
  responses: {
    200: jsonContent(z.object({ workspace_id: z.string(), enabled: z.boolean() }), 'The setting'),
    ...errorResponses,
  },
});
