import { createHash, timingSafeEqual } from 'node:crypto';
import { createRoute, z } from '@hono/zod-openapi';
import { createMiddleware } from 'hono/factory';
import type { KeyCache } from '../../auth/key-cache.ts';
import type { AppEnv } from '../../http/env.ts';
import { createRouter, errorResponses } from '../../http/router.ts';
import { ApiError } from '../../lib/errors.ts';
import type { KilnMetrics } from '../../metrics/metrics.ts';

const digest = (s: string) => createHash('sha256').update(s).digest();

/** Compares two secrets in constant time, whatever their lengths (their digests are compared). */
function sameSecret(sent: string, expected: string): boolean {
  return timingSafeEqual(digest(sent), digest(expected));
}

/**
 * Who may scrape: the bearer of KILN_METRICS_TOKEN (when it is set) or of an org-admin key. No
 * header or an unknown key: 401; any other key (a team's): 403.
 */
const scrapeGuard = (keys: KeyCache, token: string | undefined) =>
  createMiddleware<AppEnv>(async (c, next) => {
    const match = /^Bearer\s+(\S+)$/i.exec(c.req.header('authorization') ?? '');
    const either = token ? 'KILN_METRICS_TOKEN or an org-admin key' : 'an org-admin key';
    if (!match) throw new ApiError('unauthorized', `send Authorization: Bearer <${either}>`);
    const sent = match[1]!;
    if (token && sameSecret(sent, token)) return next();
    const principal = await keys.authenticate(sent);
    if (!principal) throw new ApiError('unauthorized', `unknown or revoked key: send ${either}`);
    c.set('principal', principal);
    if (principal.role !== 'org_admin') throw new ApiError('forbidden', `metrics are for ${either}`);
    await next();
  });

const { 401: unauthorized, 403: forbidden } = errorResponses;

const getMetrics = createRoute({
  operationId: 'getMetrics',
  method: 'get',
  path: '/metrics',
  tags: ['Ops'],
  security: [{ bearer: [] }],
  summary: 'Prometheus metrics',
  description:
    'The Prometheus text exposition format (version 0.0.4). The bearer is the server’s `KILN_METRICS_TOKEN` ' +
    'or an org-admin key; every metric is described in docs/metrics.md.',
  responses: {
    200: {
      content: { 'text/plain': { schema: z.string().openapi({ example: 'kiln_run_steps_total 42\n' }) } },
      description: 'Every metric of this server',
    },
    401: unauthorized,
    403: forbidden,
  },
});

/** `GET /metrics`, outside /v1 (Prometheus's default path), with its own guard. */
export function metricsRouter(metrics: KilnMetrics, keys: KeyCache, token: string | undefined) {
  const guard = scrapeGuard(keys, token);
  return createRouter().openapi({ ...getMetrics, middleware: [guard] as const }, async (c) =>
    c.text(await metrics.scrape(), 200, { 'content-type': metrics.contentType }),
  );
}
