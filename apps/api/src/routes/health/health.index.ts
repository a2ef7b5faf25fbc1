import type { Db } from '../../db/client.ts';
import { pingDatabase } from '../../db/health.ts';
import { createRouter } from '../../http/router.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';
import { healthz, readyz } from './health.routes.ts';

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
      const [database, engine] = await Promise.all([check(() => pingDatabase(db)), check(() => sandboxes.ping())]);
      const ok = database.ok && engine.ok;
      return c.json(
        {
          status: ok ? ('ok' as const) : ('unavailable' as const),
          checks: { database, sandboxes: engine, docker: engine },
        },
        ok ? 200 : 503,
      );
    });
}
