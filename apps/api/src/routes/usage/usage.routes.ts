import { createRoute, z } from '@hono/zod-openapi';
import { errorResponses, jsonContent } from '../../http/router.ts';

const security = [{ bearer: [] }];

export const getUsage = createRoute({
  operationId: 'getUsage',
  method: 'get',
  path: '/v1/usage',
  tags: ['Ops'],
  security,
  summary: 'Token usage of the team, grouped by workspace or model',
  request: { query: z.object({ group_by: z.enum(['workspace', 'model']).default('model') }) },
  responses: {
    200: jsonContent(
      z.object({
        data: z.array(
          z.object({ key: z.string(), prompt_tokens: z.number(), completion_tokens: z.number(), calls: z.number() }),
        ),
      }),
      'Usage',
    ),
    ...errorResponses,
  },
});
