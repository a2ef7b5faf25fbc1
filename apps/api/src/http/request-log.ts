import { createMiddleware } from 'hono/factory';
import type { Logger } from 'pino';
import { newId } from '../lib/ids.ts';
import { methodLabel, routeLabel } from '../metrics/labels.ts';
import type { KilnMetrics } from '../metrics/metrics.ts';
import type { AppEnv } from './env.ts';
import { isInnerCall } from './rate-limit.ts';

const CLIENT_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * Assigns the request id (a sane client-sent X-Request-Id is kept), logs one line per request and
 * observes its duration in the request histogram (labelled by route pattern, never by path).
 */
export const requestLog = (logger: Logger, metrics?: Pick<KilnMetrics, 'httpRequest'>) =>
  createMiddleware<AppEnv>(async (c, next) => {
    const sent = c.req.header('x-request-id');
    const requestId = sent && CLIENT_ID.test(sent) ? sent : newId('req');
    const started = performance.now();
    c.set('requestId', requestId);
    c.set('log', logger.child({ request_id: requestId }));
    c.header('X-Request-Id', requestId);
    await next();
    const ms = performance.now() - started;
    // A call the server makes to itself for an MCP tool is part of the /mcp request already observed.
    if (!isInnerCall(c.env)) metrics?.httpRequest(methodLabel(c.req.method), routeLabel(c), c.res.status, ms);
    const principal = c.get('principal');
    c.get('log').info(
      {
        method: c.req.method,
        path: c.req.path,
        status: c.res.status,
        duration_ms: Math.round(ms * 10) / 10,
        team_id: principal?.teamId ?? undefined,
        key_id: principal?.keyId,
      },
      'request',
    );
  });
