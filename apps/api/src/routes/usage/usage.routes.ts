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

export const getDailyUsage = createRoute({
  operationId: 'getDailyUsage',
  method: 'get',
  path: '/v1/usage/daily',
  tags: ['Ops'],
  security,
  summary: 'Model calls, tokens and runs of the team per workspace and UTC day',
  request: {
    query: z.object({
      days: z.coerce
        .number()
        .int()
        .min(1)
        .max(366)
        .default(14)
        .openapi({ description: 'the last N days, today included' }),
      workspace: z.string().max(64).optional().openapi({ description: 'only this workspace' }),
    }),
  },
  responses: {
    200: jsonContent(
      z.object({
        from: z.string().openapi({ description: 'first day covered (YYYY-MM-DD, UTC)' }),
        to: z.string().openapi({ description: 'last day covered: today (UTC)' }),
        data: z
          .array(
            z.object({
              workspace_id: z.string(),
              day: z.string(),
              prompt_tokens: z.number(),
              completion_tokens: z.number(),
              calls: z.number(),
              runs: z.number(),
            }),
          )
          .openapi({ description: 'one entry per workspace and day that had a model call or a run' }),
      }),
      'Daily usage',
    ),
    ...errorResponses,
  },
});
