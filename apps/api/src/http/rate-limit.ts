import { createMiddleware } from 'hono/factory';
import type { AppEnv } from './env.ts';
import { ApiError } from '../lib/errors.ts';

/**
 * Marks a request the server makes to itself on behalf of one it already counted (the MCP
 * server's tools call the /v1 routes in-process): passed as the request's env (`app.fetch(req,
 * env)`), which only code in this process can set, never as a header a client could send.
 */
const INNER_CALL: unique symbol = Symbol('kiln.inner-call');
export const innerCallEnv = () => ({ [INNER_CALL]: true });
export const isInnerCall = (env: unknown) =>
  typeof env === 'object' && env !== null && (env as Record<symbol, unknown>)[INNER_CALL] === true;

interface Bucket {
  tokens: number;
  updated: number;
}

/**
 * Token bucket per team (org-admin keys get one per key): `burst` requests at once, refilled at
 * `perMinute`. Held in process memory, so each API replica enforces its own share.
 */
export function rateLimit(opts: { perMinute: number; burst: number }, now: () => number = Date.now) {
  const buckets = new Map<string, Bucket>();
  const ratePerMs = opts.perMinute / 60_000;
  return createMiddleware<AppEnv>(async (c, next) => {
    // The outer request paid for it: one MCP tool call is one request, however many it makes.
    if (isInnerCall(c.env)) return next();
    const p = c.get('principal');
    const id = p.teamId ?? p.keyId;
    const t = now();
    const b = buckets.get(id) ?? { tokens: opts.burst, updated: t };
    b.tokens = Math.min(opts.burst, b.tokens + (t - b.updated) * ratePerMs);
    b.updated = t;
    buckets.set(id, b);
    if (b.tokens < 1) {
      const retryAfter = Math.max(1, Math.ceil((1 - b.tokens) / ratePerMs / 1000));
      throw new ApiError(
        'rate_limited',
        `rate limit of ${opts.perMinute} requests per minute exceeded`,
        {},
        { 'Retry-After': String(retryAfter) },
      );
    }
    b.tokens -= 1;
    await next();
  });
}
