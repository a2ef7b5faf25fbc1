import type { RouteConfig } from '@hono/zod-openapi';
import type { Context, MiddlewareHandler } from 'hono';
import type { Db } from '../db/client.ts';
import { getWorkspace, type WorkspaceRow } from '../workspace/records.ts';
import type { AppEnv } from './env.ts';
import { teamOf, writableTeamOf } from './guards.ts';

/** What the lookup found: the workspace, or the error the request is to be answered with. */
type Lookup = { workspace: WorkspaceRow; error?: undefined } | { workspace?: undefined; error: unknown };

/** The request context of a route inside a workspace. */
export interface WorkspaceEnv {
  Variables: { workspaceLookup: Lookup };
}

/** Loads the workspace of the path's `{workspace}`: a read (GET) needs a team key, anything else a writable one. */
async function lookUp(db: Db, c: Context<AppEnv & WorkspaceEnv>): Promise<Lookup> {
  try {
    const team = c.req.method === 'GET' ? teamOf(c) : writableTeamOf(c);
    return { workspace: await getWorkspace(db, team, c.req.param('workspace') ?? '') };
  } catch (error) {
    return { error };
  }
}

/**
 * Marks a router's routes under /v1/workspaces/{workspace}/…: each loads its workspace once, in
 * a middleware before its handler, with the team check, and the handler reads it with
 * `workspaceOf(c)`. Another team's or a deleted workspace is 404, a viewer key writing or an
 * org-admin key is 403, as when each handler looked the workspace up itself. The middleware runs
 * before validation, so it holds a failed lookup's error until the handler asks: malformed input
 * is still answered 400 first.
 */
export function workspaceScope(db: Db) {
  const load: MiddlewareHandler<AppEnv & WorkspaceEnv> = async (c, next) => {
    c.set('workspaceLookup', await lookUp(db, c));
    await next();
  };
  return <R extends RouteConfig>(route: R) => ({ ...route, middleware: load });
}

/** The workspace `workspaceScope` loaded for this request; throws the error its lookup ended in. */
export function workspaceOf(c: { var: WorkspaceEnv['Variables'] }): WorkspaceRow {
  const { workspace, error } = c.var.workspaceLookup;
  if (!workspace) throw error;
  return workspace;
}
