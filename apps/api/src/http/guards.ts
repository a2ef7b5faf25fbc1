import type { Context } from 'hono';
import type { AppEnv, Principal } from './env.ts';
import { ApiError } from '../lib/errors.ts';

/** What a guard reads of a request: its principal (so any route's context will do, whatever else it carries). */
type Ctx = Pick<Context<AppEnv>, 'get'>;

export function requireOrgAdmin(c: Ctx): Principal {
  const p = c.get('principal');
  if (p.role !== 'org_admin') throw new ApiError('forbidden', 'this needs an org-admin key');
  return p;
}

/** The caller's team; org-admin keys are not members of a team and must use a team key here. */
export function teamOf(c: Ctx): string {
  const p = c.get('principal');
  if (!p.teamId) throw new ApiError('forbidden', 'this route acts inside a team: use a team key, not an org-admin key');
  return p.teamId;
}

/** The caller's team, refusing read-only (`viewer`) keys. */
export function writableTeamOf(c: Ctx): string {
  const team = teamOf(c);
  if (c.get('principal').role === 'viewer') throw new ApiError('forbidden', 'viewer keys are read-only');
  return team;
}

/**
 * May this caller manage the given team's keys? Org admins may for any team, a team's owner for
 * its own; any other team is answered 404, as if it did not exist.
 */
export function requireTeamManager(c: Ctx, teamId: string): void {
  const p = c.get('principal');
  if (p.role === 'org_admin') return;
  if (p.teamId !== teamId) throw ApiError.notFound('team');
  if (p.role !== 'owner') throw new ApiError('forbidden', 'only the team owner or an org admin manages keys');
}
