import { createRoute, z } from '@hono/zod-openapi';
import { sql } from 'drizzle-orm';
import type { Db } from '../../db/client.ts';
import { createRouter, jsonContent } from '../../http/router.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';

const Check = z.object({ ok: z.boolean(), error: z.string().optional() });
const Ready = z.object({ status: z.enum(['ok', 'unavailable']), checks: z.object({ database: Check, docker: Check }) });

const healthz = createRoute({
  method: 'get',
  path: '/healthz',
  tags: ['Ops'],
  summary: 'The process is up',
  responses: { 200: jsonContent(z.object({ status: z.literal('ok') }), 'Up') },
});

const readyz = createRoute({
  method: 'get',
  path: '/readyz',
  tags: ['Ops'],
  summary: 'The database and the Docker Engine are reachable',
  responses: { 200: jsonContent(Ready, 'Ready'), 503: jsonContent(Ready, 'Not ready; `checks` says what failed') },
});

async function check(fn: () => Promise<unknown>) {
  try {
    await fn();
    return { ok: true };
  } catch (err) {
    return { ok: false, error: (err as Error).message };
  }
}

export function healthRouter(db: Db, sandboxes: Pick<SandboxEngine, 'ping'>) {
  return createRouter()
    .openapi(healthz, (c) => c.json({ status: 'ok' as const }, 200))
    .openapi(readyz, async (c) => {
      const [database, engine] = await Promise.all([check(() => db.execute(sql`select 1`)), check(() => sandboxes.ping())]);
      const ok = database.ok && engine.ok;
      return c.json({ status: ok ? ('ok' as const) : ('unavailable' as const), checks: { database, docker: engine } }, ok ? 200 : 503);
    });
}
