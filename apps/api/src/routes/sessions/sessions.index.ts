import { streamSSE } from 'hono/streaming';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import type { CacheNews } from '../../db/cache-news.ts';
import type { Db } from '../../db/client.ts';
import { ApiError } from '../../lib/errors.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import { workspaceOf, workspaceScope } from '../../http/workspace-scope.ts';
import type { SandboxEngine } from '../../sandbox/engine.ts';
import { sandboxPath } from '../../sandbox/paths.ts';
import { checkRelativePath } from '../../workspace/paths.ts';
import { SessionCache } from '../../sessions/session-cache.ts';
import * as sessions from '../../sessions/sessions.ts';
import type { WorkspaceService } from '../../workspace/service.ts';
import type { WorkspaceRow } from '../../workspace/records.ts';
import { execInSession, type SessionExecResult } from '../../sessions/session-exec.ts';
import { commitView } from '../workspace-repo/workspace-repo.index.ts';
import * as r from './sessions.routes.ts';

const view = (s: sessions.SessionRow) => ({
  id: s.id,
  workspace_id: s.workspaceId,
  title: s.title,
  status: s.status,
  created_at: s.createdAt.toISOString(),
  last_activity_at: s.lastActivityAt.toISOString(),
  ended_at: s.endedAt?.toISOString() ?? null,
});

export function sessionsRouter(db: Db, engine: SandboxEngine, workspaces: WorkspaceService, news: CacheNews) {
  const cache = new SessionCache(db, news);
  const scoped = workspaceScope(db);
  /** The session (active, this team's), its workspace, and what its sandbox may use. */
  async function target(teamId: string, sessionId: string) {
    const { workspace } = await cache.activeWithWorkspace(teamId, sessionId);
    const at = { teamId, sessionId, workspaceDir: workspaces.dirOf(workspace.id) };
    return { ws: workspace, ...engine.settings.execContext(workspace, at) };
  }
  const run = (
    ws: WorkspaceRow,
    ctx: { teamId: string; sessionId: string },
    code: string,
    opts: Parameters<typeof execInSession>[4],
  ) => execInSession({ engine, workspaces }, ws, ctx, code, opts).then(execView);

  return createRouter()
    .openapi(scoped(r.create), async (c) => {
      const ws = workspaceOf(c);
      const row = await sessions.createSession(db, ws.teamId, ws.id, c.req.valid('json')?.title);
      c.set('audit', { action: 'session.create', resourceType: 'session', resourceId: row.id, after: view(row) });
      return c.json(view(row), 201);
    })
    .openapi(scoped(r.list), async (c) => {
      const ws = workspaceOf(c);
      const q = c.req.valid('query');
      return c.json(toPage(await sessions.listSessions(db, ws.teamId, ws.id, q), q, view), 200);
    })
    .openapi(r.get, async (c) => {
      const row = await sessions.getSession(db, teamOf(c), c.req.valid('param').session);
      const sbx = await engine.sessionSandbox(row.id);
      const sandbox = sbx && {
        id: sbx.id,
        state: sbx.state,
        runtime: sbx.runtime,
        paused_at: sbx.pausedAt?.toISOString() ?? null,
        checkpoint_bytes: sbx.checkpointBytes,
        expires_at: sbx.expiresAt.toISOString(),
      };
      return c.json({ ...view(row), sandbox }, 200);
    })
    .openapi(r.end, async (c) => {
      const team = writableTeamOf(c);
      const { before, after } = await sessions.endSession(db, team, c.req.valid('param').session);
      await news.announce('session', after.id);
      await engine.release(after.id, 'session_ended');
      c.set('audit', {
        action: 'session.end',
        resourceType: 'session',
        resourceId: after.id,
        before: view(before),
        after: view(after),
      });
      return c.json(view(after), 200);
    })
    .openapi(r.exec, async (c) => {
      const team = writableTeamOf(c);
      const { session: s } = c.req.valid('param');
      const { code, timeout_s } = c.req.valid('json');
      const { ctx, ws } = await target(team, s);
      // The execution's audit event is written with its record, in one commit.
      const audit = { actor: c.get('principal'), requestId: c.get('requestId') };
      const prov = { author: 'user' as const, actor: c.get('principal').keyId, sessionId: s };
      c.set('audit', { action: 'session.exec', recorded: true });
      if (c.req.valid('query').stream === 'true') {
        return streamSSE(c, async (stream) => {
          const abort = new AbortController();
          stream.onAbort(() => abort.abort());
          let seq = 0;
          const result = await run(ws, ctx, code, {
            timeoutS: timeout_s,
            audit,
            prov,
            signal: abort.signal,
            onOutput: (name, data) =>
              void stream.writeSSE({
                id: String(++seq),
                event: 'exec.output',
                data: JSON.stringify({ stream: name, data }),
              }),
          });
          await stream.writeSSE({ id: String(++seq), event: 'exec.completed', data: JSON.stringify(result) });
        }) as never;
      }
      return c.json(await run(ws, ctx, code, { timeoutS: timeout_s, audit, prov }), 200);
    })
    .openapi(r.keepAlive, async (c) => {
      const team = writableTeamOf(c);
      const { ws, ctx } = await target(team, c.req.valid('param').session);
      const kept = await engine.keepAlive(ctx.sessionId, ws.settings.sandbox);
      const body = {
        session_id: ctx.sessionId,
        sandbox_id: kept?.sandboxId ?? null,
        idle_s: Math.round(engine.settings.idleMsFor(ws.settings.sandbox) / 1000),
        reclaim_at: kept?.reclaimAt.toISOString() ?? null,
      };
      c.set('audit', { action: 'session.keepalive', resourceType: 'session', resourceId: ctx.sessionId, after: body });
      return c.json(body, 200);
    })
    .openapi(r.pause, async (c) => {
      const team = writableTeamOf(c);
      const { ctx } = await target(team, c.req.valid('param').session);
      const paused = await engine.pause(ctx.sessionId);
      const body = {
        session_id: ctx.sessionId,
        sandbox_id: paused.sandboxId,
        state: 'paused' as const,
        checkpoint_bytes: paused.bytes,
        pause_ms: Math.round(paused.ms),
      };
      c.set('audit', { action: 'session.pause', resourceType: 'session', resourceId: ctx.sessionId, after: body });
      return c.json(body, 200);
    })
    .openapi(r.resume, async (c) => {
      const team = writableTeamOf(c);
      const { ctx, limits } = await target(team, c.req.valid('param').session);
      const resumed = await engine.resume(ctx, limits);
      const body = {
        session_id: ctx.sessionId,
        sandbox_id: resumed.sandboxId,
        state: 'running' as const,
        resumed_ms: resumed.ms,
        ...(resumed.lost ? { lost: resumed.lost } : {}),
      };
      c.set('audit', { action: 'session.resume', resourceType: 'session', resourceId: ctx.sessionId, after: body });
      return c.json(body, 200);
    })
    .openapi(r.putFile, async (c) => {
      const team = writableTeamOf(c);
      const path = sandboxPath(c.req.valid('query').path);
      const { ctx, limits } = await target(team, c.req.valid('param').session);
      const data = Buffer.from(await c.req.arrayBuffer());
      const size = await engine.putFile(ctx, limits, path, data).catch((err: Error) => {
        throw new ApiError('invalid_request', `could not write ${path}: ${err.message}`);
      });
      c.set('audit', {
        action: 'session.file.put',
        resourceType: 'session',
        resourceId: ctx.sessionId,
        after: { path, size },
      });
      return c.json({ path, size }, 200);
    })
    .openapi(r.getFile, async (c) => {
      const team = teamOf(c);
      const path = sandboxPath(c.req.valid('query').path);
      const { ws, ctx, limits } = await target(team, c.req.valid('param').session);
      // A viewer may not run code, so it gets nothing code made: only /workspace as committed
      // (what the workspace files API shows it), never the sandbox's own files.
      const viewer = c.get('principal').role === 'viewer';
      if (viewer && !path.startsWith('/workspace/'))
        throw new ApiError(
          'forbidden',
          `viewer keys read only /workspace as committed: ${path} is the sandbox's, written by code a viewer may not run`,
        );
      // A read starts no sandbox (it resumes a paused one): without one, /workspace is the
      // workspace as committed, which is what a new sandbox would be given.
      let data = viewer
        ? null
        : await engine.readLiveFile(ctx.sessionId, path, { ctx, limits }).catch((err: Error) => {
            if (err instanceof ApiError) throw err;
            throw /No such file|FileNotFound/.test(err.message)
              ? ApiError.notFound(`file ${path}`)
              : new ApiError('invalid_request', `could not read ${path}: ${err.message}`);
          });
      if (!data) {
        if (!path.startsWith('/workspace/'))
          throw ApiError.notFound(
            `file ${path} (the session has no sandbox running; /tmp and the home directory start empty with its next execution)`,
          );
        const rel = checkRelativePath(path.slice('/workspace/'.length));
        const info = await workspaces.stat(ws.id, rel);
        if (!info?.isFile()) throw ApiError.notFound(`file ${path}`);
        data = await engine.maskFile(ws.id, await workspaces.readFile(ws.id, rel));
      }
      return c.body(new Uint8Array(data), 200, { 'content-type': 'application/octet-stream' }) as never;
    });
}

/** The API's view of an execution: no null error, and the workspace commit summarised. */
function execView(result: SessionExecResult) {
  const { error, workspace, ...rest } = result;
  return {
    ...rest,
    ...(error ? { error } : {}),
    workspace: workspace
      ? {
          commit: workspace.commit ? commitView(workspace.commit) : null,
          redactions: workspace.redactions,
          refused: [...workspace.refused, ...workspace.ignored, ...workspace.skipped],
        }
      : null,
  };
}
