import { createRoute, z } from '@hono/zod-openapi';
import { jsonContent } from '../../http/router.ts';

const Check = z.object({ ok: z.boolean(), error: z.string().optional() });
const Ready = z.object({ status: z.enum(['ok', 'unavailable']), checks: z.object({ database: Check, docker: Check }) });

export const healthz = createRoute({
  method: 'get',
  path: '/healthz',
  tags: ['Ops'],
  summary: 'The process is up',
  responses: { 200: jsonContent(z.object({ status: z.literal('ok') }), 'Up') },
});

export const readyz = createRoute({
  method: 'get',
  path: '/readyz',
  tags: ['Ops'],
  summary: 'The database and the Docker Engine are reachable',
  responses: { 200: jsonContent(Ready, 'Ready'), 503: jsonContent(Ready, 'Not ready; `checks` says what failed') },
});
