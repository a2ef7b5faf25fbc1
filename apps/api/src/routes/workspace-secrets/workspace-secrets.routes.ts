import { createRoute, z } from '@hono/zod-openapi';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { SecretName, SecretValue } from '../../secrets/names.ts';

const Secret = z
  .object({
    name: z.string(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('WorkspaceSecret', { description: 'A secret\u2019s name and times; its value is never returned' });

const WorkspaceParams = z.object({ workspace: IdParam('workspace', 'ws_0abc') });
const Params = WorkspaceParams.extend({
  name: SecretName.openapi({ param: { name: 'name', in: 'path' }, example: 'OPENAI_API_KEY' }),
});
const security = [{ bearer: [] }];
const tags = ['Workspace secrets'];

export const put = createRoute({
  operationId: 'putWorkspaceSecret',
  method: 'put',
  path: '/v1/workspaces/{workspace}/secrets/{name}',
  tags,
  security,
  summary: 'Set a secret: an environment variable of the code the workspace runs, masked in its output',
  request: {
    params: Params,
    body: {
      content: { 'application/json': { schema: z.object({ value: SecretValue }).strict() } },
      required: true,
    },
  },
  responses: {
    200: jsonContent(Secret, 'The secret was replaced'),
    201: jsonContent(Secret, 'The secret was created'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const list = createRoute({
  operationId: 'listWorkspaceSecrets',
  method: 'get',
  path: '/v1/workspaces/{workspace}/secrets',
  tags,
  security,
  summary: 'List the workspace\u2019s secrets (names and times, never values)',
  request: { params: WorkspaceParams },
  responses: { 200: jsonContent(z.object({ data: z.array(Secret) }), 'Secrets, by name'), ...errorResponses },
});

export const remove = createRoute({
  operationId: 'deleteWorkspaceSecret',
  method: 'delete',
  path: '/v1/workspaces/{workspace}/secrets/{name}',
  tags,
  security,
  summary: 'Delete a secret; the next execution no longer has it',
  request: { params: Params },
  responses: {
    200: jsonContent(z.object({ name: z.string(), deleted: z.literal(true) }), 'Deleted'),
    ...errorResponses,
  },
});
