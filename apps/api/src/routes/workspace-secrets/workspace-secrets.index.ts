import type { Db } from '../../db/client.ts';
import { createRouter } from '../../http/router.ts';
import { workspaceOf, workspaceScope } from '../../http/workspace-scope.ts';
import type { SecretInfo, SecretStore } from '../../secrets/store.ts';
import * as r from './workspace-secrets.routes.ts';

/** Names and times only: no route ever returns a value, and no audit row holds one. */
const view = (s: SecretInfo) => ({
  name: s.name,
  created_at: s.createdAt.toISOString(),
  updated_at: s.updatedAt.toISOString(),
});

export function workspaceSecretsRouter(db: Db, secrets: SecretStore) {
  const scoped = workspaceScope(db);
  return createRouter()
    .openapi(scoped(r.put), async (c) => {
      const { id: workspace, teamId: team } = workspaceOf(c);
      const { name } = c.req.valid('param');
      const row = await secrets.put(team, workspace, name, c.req.valid('json').value);
      c.set('audit', {
        action: row.created ? 'workspace.secret.create' : 'workspace.secret.update',
        resourceType: 'workspace',
        resourceId: workspace,
        after: view(row),
      });
      return c.json(view(row), row.created ? 201 : 200);
    })
    .openapi(scoped(r.list), async (c) => {
      const { id: workspace, teamId: team } = workspaceOf(c);
      return c.json({ data: (await secrets.list(team, workspace)).map(view) }, 200);
    })
    .openapi(scoped(r.remove), async (c) => {
      const { id: workspace, teamId: team } = workspaceOf(c);
      const { name } = c.req.valid('param');
      const before = await secrets.remove(team, workspace, name);
      c.set('audit', {
        action: 'workspace.secret.delete',
        resourceType: 'workspace',
        resourceId: workspace,
        before: view(before),
      });
      return c.json({ name, deleted: true as const }, 200);
    });
}
