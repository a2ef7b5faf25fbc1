import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { SettingsPatch, WorkspaceSettings } from '../../workspace/settings.ts';

const Name = z.string().trim().min(1).max(100);

const Workspace = z
  .object({
    id: z.string(),
    name: z.string(),
    head: z.string().nullable().openapi({ description: 'sha of the workspace repository HEAD' }),
    settings: WorkspaceSettings,
    repair_error: z.string().nullable().openapi({
      description:
        'Why the last start-up repair of the workspace repository failed (a commit of what a crash left in its working tree, for instance); the server skipped it and left its working tree as it was. Null when the last repair succeeded.',
    }),
    repair_failed_at: z.string().nullable().openapi({ description: 'When that repair failed (null when it did not)' }),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Workspace');

const Params = z.object({ workspace: IdParam('workspace', 'ws_0abc') });
const security = [{ bearer: [] }];
const tags = ['Workspaces'];
const body = <T extends z.ZodType>(schema: T) => ({ content: { 'application/json': { schema } }, required: true });

export const create = createRoute({
  operationId: 'createWorkspace',
  method: 'post',
  path: '/v1/workspaces',
  tags,
  security,
  summary: 'Create a workspace; omitted settings take their defaults',
  request: { body: body(z.object({ name: Name, settings: SettingsPatch.optional() }).strict()) },
  responses: { 201: jsonContent(Workspace, 'The workspace'), 409: conflictResponse, ...errorResponses },
});

export const list = createRoute({
  operationId: 'listWorkspaces',
  method: 'get',
  path: '/v1/workspaces',
  tags,
  security,
  summary: 'List the team\u2019s workspaces',
  request: { query: ListQuery },
  responses: { 200: jsonContent(listOf(Workspace), 'Workspaces'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getWorkspace',
  method: 'get',
  path: '/v1/workspaces/{workspace}',
  tags,
  security,
  summary: 'Get a workspace',
  request: { params: Params },
  responses: { 200: jsonContent(Workspace, 'The workspace'), ...errorResponses },
});

export const update = createRoute({
  operationId: 'updateWorkspace',
  method: 'patch',
  path: '/v1/workspaces/{workspace}',
  tags,
  security,
  summary: 'Rename a workspace or change some of its settings',
  request: {
    params: Params,
    body: body(z.object({ name: Name.optional(), settings: SettingsPatch.optional() }).strict()),
  },
  responses: { 200: jsonContent(Workspace, 'The updated workspace'), 409: conflictResponse, ...errorResponses },
});

export const remove = createRoute({
  operationId: 'deleteWorkspace',
  method: 'delete',
  path: '/v1/workspaces/{workspace}',
  tags,
  security,
  summary: 'Delete a workspace',
  request: { params: Params },
  responses: { 200: jsonContent(z.object({ id: z.string(), deleted: z.literal(true) }), 'Deleted'), ...errorResponses },
});
