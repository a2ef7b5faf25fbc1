import { requireOrgAdmin, requireTeamManager } from '../../http/guards.ts';
import * as teams from '../../auth/teams.ts';
import type { CacheNews } from '../../db/cache-news.ts';
import type { Db } from '../../db/client.ts';
import type { apiKeys } from '../../db/schema/index.ts';
import { ApiError } from '../../lib/errors.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './teams.routes.ts';

type KeyRow = typeof apiKeys.$inferSelect;

const teamView = (t: { id: string; name: string; createdAt: Date }) => ({
  id: t.id,
  name: t.name,
  created_at: t.createdAt.toISOString(),
});

const keyView = (k: KeyRow) => ({
  id: k.id,
  name: k.name,
  role: k.role as 'owner' | 'admin' | 'member' | 'viewer',
  can_approve: k.canApprove,
  prefix: k.keyPrefix,
  created_at: k.createdAt.toISOString(),
  last_used_at: k.lastUsedAt?.toISOString() ?? null,
  revoked_at: k.revokedAt?.toISOString() ?? null,
});

export function teamsRouter(db: Db, news: CacheNews) {
  return createRouter()
    .openapi(r.createTeam, async (c) => {
      requireOrgAdmin(c);
      const team = await teams.createTeam(db, c.req.valid('json').name);
      c.set('audit', {
        action: 'team.create',
        resourceType: 'team',
        resourceId: team.id,
        teamId: team.id,
        after: teamView(team),
      });
      return c.json(teamView(team), 201);
    })
    .openapi(r.listTeams, async (c) => {
      const p = c.get('principal');
      const q = c.req.valid('query');
      const rows = await teams.listTeams(db, q, p.role === 'org_admin' ? undefined : p.teamId!);
      return c.json(toPage(rows, q, teamView), 200);
    })
    .openapi(r.getTeam, async (c) => {
      const { team } = c.req.valid('param');
      const p = c.get('principal');
      if (p.role !== 'org_admin' && p.teamId !== team) throw ApiError.notFound('team');
      return c.json(teamView(await teams.getTeam(db, team)), 200);
    })
    .openapi(r.createKey, async (c) => {
      const { team } = c.req.valid('param');
      requireTeamManager(c, team);
      await teams.getTeam(db, team);
      const body = c.req.valid('json');
      const { row, key } = await teams.createTeamKey(db, team, {
        name: body.name,
        role: body.role,
        canApprove: body.can_approve,
      });
      c.set('audit', {
        action: 'key.create',
        resourceType: 'key',
        resourceId: row.id,
        teamId: team,
        after: keyView(row),
      });
      return c.json({ ...keyView(row), key }, 201);
    })
    .openapi(r.listKeys, async (c) => {
      const { team } = c.req.valid('param');
      requireTeamManager(c, team);
      const q = c.req.valid('query');
      return c.json(toPage(await teams.listTeamKeys(db, team, q), q, keyView), 200);
    })
    .openapi(r.revokeKey, async (c) => {
      const { team, key: id } = c.req.valid('param');
      requireTeamManager(c, team);
      const { before, after } = await teams.revokeTeamKey(db, team, id);
      // Refused at once here and on every other replica (docs/architecture.md#replicas).
      await news.announce('key', id);
      c.set('audit', {
        action: 'key.revoke',
        resourceType: 'key',
        resourceId: id,
        teamId: team,
        before: keyView(before),
        after: keyView(after),
      });
      return c.json(keyView(after), 200);
    });
}
