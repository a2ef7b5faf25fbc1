import { createRoute, z } from '@hono/zod-openapi';
import { jsonContent } from '../../http/router.ts';

const Check = z.object({ ok: z.boolean(), error: z.string().optional() });
const Ready = z.object({
  status: z.enum(['ok', 'unavailable']),
  checks: z.object({
    database: Check,
    sandboxes: Check.describe("Where sandboxes run: this host's container runtime, or the fleet of sandbox nodes"),
    docker: Check.describe('Deprecated: the same as `sandboxes` (its name before sandboxes could run on nodes)'),
  }),
});

export const healthz = createRoute({
  operationId: 'getHealth',
  method: 'get',
  path: '/healthz',
  tags: ['Ops'],
  // Probes are public: no key, on purpose (load balancers and orchestrators call them).
  security: [],
  summary: 'The process is up',
  responses: { 200: jsonContent(z.object({ status: z.literal('ok') }), 'Up') },
});

export const readyz = createRoute({
  operationId: 'getReadiness',
  method: 'get',
  path: '/readyz',
  tags: ['Ops'],
  security: [],
  summary: 'The database and where sandboxes run are reachable',
  responses: { 200: jsonContent(Ready, 'Ready'), 503: jsonContent(Ready, 'Not ready; `checks` says what failed') },
});
