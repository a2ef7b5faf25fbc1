import { createMiddleware } from 'hono/factory';
import type { Logger } from 'pino';
import { newId } from '../lib/ids.ts';
import type { AppEnv } from './env.ts';

const CLIENT_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** Assigns the request id (a sane client-sent X-Request-Id is kept) and logs one line per request. */
export const requestLog = (logger: Logger) =>
  createMiddleware<AppEnv>(async (c, next) => {
    const sent = c.req.header('x-request-id');
    const requestId = sent && CLIENT_ID.test(sent) ? sent : newId('req');
    const started = performance.now();
    c.set('requestId', requestId);
    c.set('log', logger.child({ request_id: requestId }));
    c.header('X-Request-Id', requestId);
    await next();
    const principal = c.get('principal');
    c.get('log').info(
      {
        method: c.req.method,
        path: c.req.path,
        status: c.res.status,
        duration_ms: Math.round((performance.now() - started) * 10) / 10,
        team_id: principal?.teamId ?? undefined,
        key_id: principal?.keyId,
      },
      'request',
    );
  });
