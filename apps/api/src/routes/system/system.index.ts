import { requireOrgAdmin } from '../../http/guards.ts';
import { setSourceUpdates, updateView, type SelfUpdates } from '../../platform/self-update.ts';
import type { Db } from '../../db/client.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './system.routes.ts';

/** Platform self-update: every route is org-admin only; the service writes its own audit rows. */
export function systemRouter(db: Db, updates: SelfUpdates) {
  return createRouter()
    .openapi(r.submit, async (c) => {
      const body = c.req.valid('json');
      const row = await updates.submit({ ...body, author: 'user' }, requireOrgAdmin(c), c.get('requestId'));
      c.set('audit', { action: 'system.update.submit', recorded: true });
      return c.json(updateView(row), 202);
    })
    .openapi(r.list, async (c) => {
      requireOrgAdmin(c);
      const q = c.req.valid('query');
      return c.json(toPage(await updates.list(q, q.status ? [q.status] : undefined), q, updateView), 200);
    })
    .openapi(r.get, async (c) => {
      requireOrgAdmin(c);
      return c.json(updateView(await updates.get(c.req.valid('param').update)), 200);
    })
    .openapi(r.apply, async (c) => {
      const row = await updates.apply(c.req.valid('param').update, requireOrgAdmin(c), c.get('requestId'));
      c.set('audit', { action: 'system.update.apply', recorded: true });
      return c.json(updateView(row), 202);
    })
    .openapi(r.revert, async (c) => {
      const row = await updates.revert(c.req.valid('param').update, requireOrgAdmin(c), c.get('requestId'));
      c.set('audit', { action: 'system.update.submit', recorded: true });
      return c.json(updateView(row), 202);
    })
    .openapi(r.version, (c) => {
      requireOrgAdmin(c);
      return c.json(updates.currentVersion(), 200);
    })
    .openapi(r.sourceUpdates, async (c) => {
      requireOrgAdmin(c);
      const { workspace: ws } = c.req.valid('param');
      const { enabled } = c.req.valid('json');
      const { teamId, before } = await setSourceUpdates(db, ws, enabled);
      c.set('audit', {
        action: 'workspace.source_updates',
        resourceType: 'workspace',
        resourceId: ws,
        teamId,
        before: { source_updates: before },
        after: { source_updates: enabled },
      });
      return c.json({ workspace_id: ws, enabled }, 200);
    });
}
