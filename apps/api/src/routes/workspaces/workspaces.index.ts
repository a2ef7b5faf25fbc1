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
      engine.checkIdleS(input.settings?.sandbox?.idle_s);
      engine.checkRuntime(input.settings?.sandbox?.runtime);
      engine.checkNetwork(input.settings?.sandbox);
      await templates.checkUsable(team, input.settings?.sandbox?.template);
      // The server's default runtime is written into the new workspace: it never changes under it
      // later. A workspace that asks for a network and no runtime gets one whose sandboxes can have it.
      const runtime = input.settings?.sandbox?.runtime ?? engine.defaultRuntimeFor(input.settings?.sandbox?.network);
      engine.checkRuntimeNetwork({ runtime, network: input.settings?.sandbox?.network ?? 'none' });
      const settings = { ...input.settings, sandbox: { ...input.settings?.sandbox, runtime } };
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
      engine.checkIdleS(c.req.valid('json').settings?.sandbox?.idle_s);
      engine.checkRuntime(c.req.valid('json').settings?.sandbox?.runtime);
      engine.checkNetwork(c.req.valid('json').settings?.sandbox);
      const team = writableTeamOf(c);
      await templates.checkUsable(team, c.req.valid('json').settings?.sandbox?.template);
      const patch = c.req.valid('json').settings?.sandbox;
      if (patch?.runtime || patch?.network) {
        const current = (await ws.getWorkspace(db, team, id)).settings.sandbox;
        engine.checkRuntimeNetwork({
          runtime: patch.runtime ?? current.runtime,
          network: patch.network ?? current.network,
        });
      }
      const { before, after } = await ws.updateWorkspace(db, team, id, c.req.valid('json'));
      // Every replica's executions use the new settings from their next request.
      await news.announce('workspace', id);
      if (before.settings.sandbox.template !== after.settings.sandbox.template) void templates.refreshPool();
      // Running sandboxes take a new idle time at once, not only from their next execution.
      if (engine.idleMsFor(after.settings.sandbox) !== engine.idleMsFor(before.settings.sandbox))
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
      engine.forgetWorkspace(id);
      await news.announce('workspace', id);
      c.set('audit', { action: 'workspace.delete', resourceType: 'workspace', resourceId: id, before: view(before) });
      return c.json({ id, deleted: true as const }, 200);
    });
}
