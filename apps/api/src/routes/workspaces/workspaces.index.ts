import { teamOf, writableTeamOf } from '../../http/guards.ts';
import type { CacheNews } from '../../db/cache-news.ts';
import type { Db } from '../../db/client.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';
import type { TemplateService } from '../../templates/service.ts';
import type { WorkspaceService } from '../../workspace/service.ts';
import * as ws from '../../workspace/records.ts';
import * as r from './workspaces.routes.ts';

const view = (w: ws.WorkspaceRow) => ({
  id: w.id,
  name: w.name,
  head: w.head,
  settings: w.settings,
  repair_error: w.repairError,
  repair_failed_at: w.repairFailedAt?.toISOString() ?? null,
  created_at: w.createdAt.toISOString(),
  updated_at: w.updatedAt.toISOString(),
});

export function workspacesRouter(
  db: Db,
  service: WorkspaceService,
  engine: SandboxEngine,
  templates: TemplateService,
  news: CacheNews,
) {
  return createRouter()
    .openapi(r.create, async (c) => {
      const team = writableTeamOf(c);
      const input = c.req.valid('json');
      // Validated, with its runtime decided (and written: it never changes under the workspace later).
      const sandbox = engine.settings.forCreate(input.settings?.sandbox);
      await templates.checkUsable(team, sandbox.template);
      const settings = { ...input.settings, sandbox };
      const row = await service.create(team, { ...input, settings });
      if (row.settings.sandbox.template) void templates.refreshPool();
      c.set('audit', { action: 'workspace.create', resourceType: 'workspace', resourceId: row.id, after: view(row) });
      return c.json(view(row), 201);
    })
    .openapi(r.list, async (c) => {
      const q = c.req.valid('query');
      return c.json(toPage(await ws.listWorkspaces(db, teamOf(c), q), q, view), 200);
    })
    .openapi(r.get, async (c) =>
      c.json(view(await ws.getWorkspace(db, teamOf(c), c.req.valid('param').workspace)), 200),
    )
    .openapi(r.update, async (c) => {
      const id = c.req.valid('param').workspace;
      const patch = c.req.valid('json').settings?.sandbox;
      // The fields first (a 400 whoever asks), then the caller's role, then what depends on the current settings.
      await engine.settings.checkPatch(
        patch,
        async () => (await ws.getWorkspace(db, writableTeamOf(c), id)).settings.sandbox,
      );
      const team = writableTeamOf(c);
      await templates.checkUsable(team, patch?.template);
      const { before, after } = await ws.updateWorkspace(db, team, id, c.req.valid('json'));
      // Every replica's executions use the new settings from their next request.
      await news.announce('workspace', id);
      if (before.settings.sandbox.template !== after.settings.sandbox.template) void templates.refreshPool();
      // Running sandboxes take a new idle time at once, not only from their next execution.
      if (engine.settings.idleMsFor(after.settings.sandbox) !== engine.settings.idleMsFor(before.settings.sandbox))
        await engine.idleChanged(id, after.settings.sandbox);
      c.set('audit', {
        action: 'workspace.update',
        resourceType: 'workspace',
        resourceId: id,
        before: view(before),
        after: view(after),
      });
      return c.json(view(after), 200);
    })
    .openapi(r.remove, async (c) => {
      const id = c.req.valid('param').workspace;
      const before = await ws.deleteWorkspace(db, writableTeamOf(c), id);
      if (before.settings.sandbox.template) void templates.refreshPool();
      await engine.forgetWorkspace(id);
      await news.announce('workspace', id);
      c.set('audit', { action: 'workspace.delete', resourceType: 'workspace', resourceId: id, before: view(before) });
      return c.json({ id, deleted: true as const }, 200);
    });
}
