import { createHash } from 'node:crypto';
import { and, eq, lt } from 'drizzle-orm';
import { createMiddleware } from 'hono/factory';
import type { Db } from '../db/client.ts';
import { idempotencyKeys } from '../db/schema/index.ts';
import type { AppEnv } from './env.ts';
import { ApiError } from '../lib/errors.ts';
import type { Sealer } from '../secrets/sealing.ts';

const TTL_MS = 24 * 60 * 60 * 1000;
const KEY = /^[\x21-\x7e]{1,255}$/;

/** How a stored answer is kept: sealed, so the database never holds a created key's or webhook's secret in the clear. */
const SEALED = 'kiln_sealed_v1';
const aad = (scope: string, key: string) => `idempotency:${scope}:${key}`;

/**
 * `Idempotency-Key` on POST: the first answer (any status below 500) is stored and replayed for
 * 24 h to the same caller with the same body; the same key with another body is 400, and a
 * retry while the first is still running is 409. The stored answer is sealed with the secrets
 * key (bound to its caller and key): some answers carry a secret shown only once (a new API
 * key, a webhook's signing secret), which a replay must return and the table must not reveal.
 */
export const idempotency = (db: Db, sealer: Sealer) =>
  createMiddleware<AppEnv>(async (c, next) => {
    const key = c.req.header('idempotency-key');
    if (c.req.method !== 'POST' || key === undefined) return next();
    if (!KEY.test(key))
      throw new ApiError('invalid_request', 'Idempotency-Key must be 1–255 printable ASCII characters');
    const scope = c.get('principal').keyId;
    const body = await c.req.text();
    const requestHash = createHash('sha256').update(`${c.req.method} ${c.req.path}\n${body}`).digest('hex');
    const where = and(eq(idempotencyKeys.scope, scope), eq(idempotencyKeys.key, key));

    await db.delete(idempotencyKeys).where(and(where, lt(idempotencyKeys.createdAt, new Date(Date.now() - TTL_MS))));
    const inserted = await db
      .insert(idempotencyKeys)
      .values({ scope, key, requestHash })
      .onConflictDoNothing()
      .returning();
    if (inserted.length === 0) {
      const [prior] = await db.select().from(idempotencyKeys).where(where);
      if (!prior) throw new ApiError('conflict', 'Idempotency-Key was released while this request arrived; retry');
      if (prior.requestHash !== requestHash)
        throw new ApiError('invalid_request', 'this Idempotency-Key was used with a different request');
      if (prior.statusCode === null)
        throw new ApiError('conflict', 'a request with this Idempotency-Key is still being processed');
      c.header('Idempotent-Replayed', 'true');
      const stored = prior.responseBody as Record<string, unknown> | null;
      const sealed = stored?.[SEALED];
      // Rows stored before answers were sealed (they expire within the TTL) replay as they are.
      const answer = typeof sealed === 'string' ? JSON.parse(sealer.open(aad(scope, key), sealed)) : stored;
      return c.json(answer as object, prior.statusCode as 200);
    }

    try {
      await next();
    } finally {
      const res = c.res;
      const storable = res.status < 500 && (res.headers.get('content-type') ?? '').includes('application/json');
      if (storable) {
        const responseBody = { [SEALED]: sealer.seal(aad(scope, key), await res.clone().text()) };
        await db.update(idempotencyKeys).set({ statusCode: res.status, responseBody }).where(where);
      } else {
        await db.delete(idempotencyKeys).where(where);
      }
    }
  });
