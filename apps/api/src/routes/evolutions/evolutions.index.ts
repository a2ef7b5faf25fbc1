import type { Db } from '../../db/client.ts';
import { evolutionView, getEvolution, listEvolutions } from '../../evolution-log/evolutions.ts';
import type { EvolutionService } from '../../evolution/service.ts';
import { toPage } from '../../http/pagination.ts';
import { ApiError } from '../../lib/errors.ts';
import { createRouter } from '../../http/router.ts';
import { workspaceOf, workspaceScope } from '../../http/workspace-scope.ts';
import * as r from './evolutions.routes.ts';

export function evolutionsRouter(db: Db, evolution: EvolutionService) {
  const scoped = workspaceScope(db);
  return createRouter()
    .openapi(scoped(r.review), async (c) => {
      const ws = workspaceOf(c);
      const body = c.req.valid('json') ?? {};
      const evo = await evolution.requestReview(ws, body.session_id);
      c.set('audit', {
        action: 'evolution.review.request',
        resourceType: 'evolution',
        resourceId: evo.id,
        after: { workspace: ws.id, session: evo.sessionId },
      });
      return c.json(evolutionView(evo), 202);
    })
    .openapi(scoped(r.dream), async (c) => {
      const ws = workspaceOf(c);
      const days = c.req.valid('json')?.days ?? 1;
      const evo = await evolution.requestDream(ws, days);
      c.set('audit', {
        action: 'evolution.dream.request',
        resourceType: 'evolution',
        resourceId: evo.id,
        after: { workspace: ws.id, days },
      });
      return c.json(evolutionView(evo), 202);
    })
    .openapi(scoped(r.list), async (c) => {
      const ws = workspaceOf(c);
      const q = c.req.valid('query');
      return c.json(toPage(await listEvolutions(db, ws.id, q), q, evolutionView), 200);
    })
    .openapi(scoped(r.get), async (c) => {
      const ws = workspaceOf(c);
      const evo = await getEvolution(db, ws.teamId, c.req.valid('param').evolution);
      if (evo.workspaceId !== ws.id) throw ApiError.notFound('evolution');
      return c.json(evolutionView(evo), 200);
    })
    .openapi(scoped(r.undo), async (c) => {
      const by = { author: 'user' as const, actor: c.get('principal').keyId };
      const { evolution: evo, sha } = await evolution.undo(workspaceOf(c), c.req.valid('param').evolution, by);
      c.set('audit', {
        action: 'evolution.undo',
        resourceType: 'evolution',
        resourceId: evo.id,
        before: { status: 'committed' },
        after: { status: evo.status, commit: sha },
      });
      return c.json({ evolution: evolutionView(evo), commit_sha: sha }, 201);
    });
}
