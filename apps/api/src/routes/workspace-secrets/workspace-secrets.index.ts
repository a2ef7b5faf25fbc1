import type { Db } from '../../db/client.ts';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import { createRouter } from '../../http/router.ts';
import type { SecretInfo, SecretStore } from '../../secrets/store.ts';
import { getWorkspace } from '../../workspace/records.ts';
import * as r from './workspace-secrets.routes.ts';

/** Names and times only: no route ever returns a value, and no audit row holds one. */
const view = (s: SecretInfo) => ({
  name: s.name,
  created_at: s.createdAt.toISOString(),
  updated_at: s.updatedAt.toISOString(),
});

export function workspaceSecretsRouter(db: Db, secrets: SecretStore) {
  return createRouter()
    .openapi(r.put, async (c) => {
      const team = writableTeamOf(c);
      const { workspace, name } = c.req.valid('param');
      await getWorkspace(db, team, workspace);
      const row = await secrets.put(team, workspace, name, c.req.valid('json').value);
      c.set('audit', {
        action: row.created ? 'workspace.secret.create' : 'workspace.secret.update',
        resourceType: 'workspace',
        resourceId: workspace,
        after: view(row),
      });
      return c.json(view(row), row.created ? 201 : 200);
    })
    .openapi(r.list, async (c) => {
      const team = teamOf(c);
      const { workspace } = c.req.valid('param');
      await getWorkspace(db, team, workspace);
      return c.json({ data: (await secrets.list(team, workspace)).map(view) }, 200);
    })
    .openapi(r.remove, async (c) => {
      const team = writableTeamOf(c);
      const { workspace, name } = c.req.valid('param');
      await getWorkspace(db, team, workspace);
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
