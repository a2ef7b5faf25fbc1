import { createMiddleware } from 'hono/factory';
import type { KeyCache } from '../auth/key-cache.ts';
import type { AppEnv } from './env.ts';
import { ApiError } from '../lib/errors.ts';

/** Resolves `Authorization: Bearer <key>` to a principal; anything else is 401. */
export const authn = (keys: KeyCache) =>
  createMiddleware<AppEnv>(async (c, next) => {
    const header = c.req.header('authorization') ?? '';
    const match = /^Bearer\s+(\S+)$/i.exec(header);
    if (!match) throw new ApiError('unauthorized', 'send Authorization: Bearer <api key>');
    const principal = await keys.authenticate(match[1]!);
    if (!principal) throw new ApiError('unauthorized', 'unknown or revoked API key');
    c.set('principal', principal);
    await next();
  });
