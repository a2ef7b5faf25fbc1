import { createRoute, z } from '@hono/zod-openapi';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { ListQuery, listOf } from '../../http/pagination.ts';

const Name = z.string().trim().min(1).max(100);

const Team = z.object({ id: z.string(), name: z.string(), created_at: z.string() }).openapi('Team');

const Key = z
  .object({
    id: z.string(),
    name: z.string(),
    role: z.enum(['owner', 'admin', 'member', 'viewer']),
    can_approve: z.boolean(),
    prefix: z.string(),
    created_at: z.string(),
    last_used_at: z.string().nullable(),
    revoked_at: z.string().nullable(),
  })
  .openapi('ApiKey');

const CreatedKey = Key.extend({
  key: z.string().openapi({ description: 'The secret; shown only in this response' }),
}).openapi('CreatedApiKey');

const TeamParams = z.object({ team: IdParam('team', 'team_0abc') });
const KeyParams = TeamParams.extend({ key: IdParam('key', 'key_0abc') });
const security = [{ bearer: [] }];

export const createTeam = createRoute({
  operationId: 'createTeam',
  method: 'post',
  path: '/v1/teams',
  tags: ['Teams'],
  summary: 'Create a team (org admin)',
  security,
  request: { body: { content: { 'application/json': { schema: z.object({ name: Name }).strict() } }, required: true } },
  responses: { 201: jsonContent(Team, 'The team'), 409: conflictResponse, ...errorResponses },
});

export const listTeams = createRoute({
  operationId: 'listTeams',
  method: 'get',
  path: '/v1/teams',
  tags: ['Teams'],
  summary: 'List teams (org admin: all; team key: its own)',
  security,
  request: { query: ListQuery },
  responses: { 200: jsonContent(listOf(Team), 'Teams'), ...errorResponses },
});

export const getTeam = createRoute({
  operationId: 'getTeam',
  method: 'get',
  path: '/v1/teams/{team}',
  tags: ['Teams'],
  summary: 'Get a team',
  security,
  request: { params: TeamParams },
  responses: { 200: jsonContent(Team, 'The team'), ...errorResponses },
});

export const createKey = createRoute({
  operationId: 'createKey',
  method: 'post',
  path: '/v1/teams/{team}/keys',
  tags: ['Teams'],
  summary: 'Create a team key (org admin or team owner); the secret is shown once',
  security,
  request: {
    params: TeamParams,
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              name: Name,
              role: z.enum(['owner', 'admin', 'member', 'viewer']),
              can_approve: z.boolean().default(false),
            })
            .strict(),
        },
      },
      required: true,
    },
  },
  responses: { 201: jsonContent(CreatedKey, 'The key, with its secret'), ...errorResponses },
});

export const listKeys = createRoute({
  operationId: 'listKeys',
  method: 'get',
  path: '/v1/teams/{team}/keys',
  tags: ['Teams'],
  summary: 'List a team\u2019s keys (never their secrets)',
  security,
  request: { params: TeamParams, query: ListQuery },
  responses: { 200: jsonContent(listOf(Key), 'Keys'), ...errorResponses },
});

export const revokeKey = createRoute({
  operationId: 'revokeKey',
  method: 'delete',
  path: '/v1/teams/{team}/keys/{key}',
  tags: ['Teams'],
  summary: 'Revoke a key',
  security,
  request: { params: KeyParams },
  responses: { 200: jsonContent(Key, 'The revoked key'), ...errorResponses },
});
