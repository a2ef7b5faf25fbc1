import { createMiddleware } from 'hono/factory';
import { recordAudit } from '../audit/audit.ts';
import type { Db } from '../db/client.ts';
import type { AppEnv } from './env.ts';

const READS = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * Every successful state-changing request leaves an audit row: the handler's own description
 * (with before/after) when it gave one, otherwise the method and path.
 */
export const auditTrail = (db: Db) =>
  createMiddleware<AppEnv>(async (c, next) => {
    await next();
    if (READS.has(c.req.method) || c.res.status >= 400) return;
    const draft = c.get('audit') ?? { action: `${c.req.method} ${c.req.routePath}` };
    if (draft.recorded) return;
    await recordAudit(db, draft, c.get('principal'), c.get('requestId'));
  });
