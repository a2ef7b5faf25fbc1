import { listAudit } from '../../audit/audit.ts';
import type { Db } from '../../db/client.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './audit.routes.ts';

export function auditRouter(db: Db) {
  return createRouter().openapi(r.list, async (c) => {
    const q = c.req.valid('query');
    const p = c.get('principal');
    const rows = await listAudit(db, p.role === 'org_admin' ? null : p.teamId, q, q);
    return c.json(
      toPage(rows, q, (e) => ({
        id: e.id,
        team_id: e.teamId,
        actor: e.actorKeyId,
        actor_role: e.actorRole,
        action: e.action,
        resource_type: e.resourceType,
        resource_id: e.resourceId,
        before: e.before,
        after: e.after,
        request_id: e.requestId,
        created_at: e.createdAt.toISOString(),
      })),
      200,
    );
  });
}
