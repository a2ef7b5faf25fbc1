import { eq, sql } from 'drizzle-orm';
import type { Context } from 'hono';
import { streamSSE } from 'hono/streaming';
import type { RunEventLog } from '../../agent/events.ts';
import { TERMINAL_EVENTS } from '../../agent/events.ts';
import type { AgentService } from '../../agent/service.ts';
import type { ApprovalRow, MessageRow, RunRow } from '../../db/schema/index.ts';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import type { Db } from '../../db/client.ts';
import { usage } from '../../db/schema/index.ts';
import type { AppEnv } from '../../http/env.ts';
import { ApiError } from '../../lib/errors.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import { getSession } from '../../sessions/sessions.ts';
import * as r from './runs.routes.ts';

export const runView = (run: RunRow) => ({
  id: run.id,
  session_id: run.sessionId,
  workspace_id: run.workspaceId,
  status: run.status,
  model: run.model,
  steps: run.steps,
  usage: { prompt_tokens: run.promptTokens, completion_tokens: run.completionTokens },
  error: (run.error as { code: string; message: string } | null) ?? null,
  created_at: run.createdAt.toISOString(),
  finished_at: run.finishedAt?.toISOString() ?? null,
});

const messageView = (m: MessageRow) => ({
  id: m.id,
  session_id: m.sessionId,
  run_id: m.runId,
  role: m.role,
  content: m.content,
  tool_calls: (m.toolCalls as { id: string; name: string; arguments: string }[] | null) ?? null,
  tool_call_id: m.toolCallId,
  created_at: m.createdAt.toISOString(),
});

const approvalView = (a: ApprovalRow) => ({
  id: a.id,
  run_id: a.runId,
  session_id: a.sessionId,
  workspace_id: a.workspaceId,
  code: a.code,
  requires_org_admin: a.requiresOrgAdmin,
  status: a.status,
  decision: a.decision,
  reason: a.reason,
  created_at: a.createdAt.toISOString(),
  expires_at: a.expiresAt.toISOString(),
});

const PING_MS = 15_000;

/** The run's events as SSE from `after`, ending after the terminal event; frames carry `id: seq`. */
function streamRun(c: Context<AppEnv>, events: RunEventLog, runId: string, after: number) {
  return streamSSE(c, async (stream) => {
    const abort = new AbortController();
    stream.onAbort(() => abort.abort());
    let resolveDone!: () => void;
    const done = new Promise<void>((resolve) => (resolveDone = resolve));
    let writes = Promise.resolve();
    await events.follow(
      runId,
      after,
      (ev) => {
        writes = writes.then(() => stream.writeSSE({ id: String(ev.seq), event: ev.event, data: JSON.stringify(ev.data) }));
        if (TERMINAL_EVENTS.has(ev.event)) writes.then(resolveDone);
      },
      abort.signal,
    );
    const ping = setInterval(() => void stream.writeSSE({ event: 'ping', data: '{}' }), PING_MS);
    await Promise.race([done, new Promise<void>((resolve) => abort.signal.addEventListener('abort', () => resolve(), { once: true }))]);
    clearInterval(ping);
    abort.abort();
  });
}

export function runsRouter(db: Db, agent: AgentService) {
  return createRouter()
    .openapi(r.postMessage, async (c) => {
      const team = writableTeamOf(c);
      const { s } = c.req.valid('param');
      // The audit event is written with the run, in one commit.
      const { message, run } = await agent.postMessage(team, s, c.req.valid('json').content, { actor: c.get('principal'), requestId: c.get('requestId') });
      c.set('audit', { action: 'session.message', recorded: true });
      if (c.req.valid('query').stream === 'true') return streamRun(c, agent.events, run.id, 0) as never;
      return c.json({ message: messageView(message), run: runView(run) }, 202);
    })
    .openapi(r.listMessages, async (c) => {
      const team = teamOf(c);
      const { s } = c.req.valid('param');
      await getSession(db, team, s);
      const q = c.req.valid('query');
      return c.json(toPage(await agent.listMessages(team, s, q), q, messageView), 200);
    })
    .openapi(r.listRuns, async (c) => {
      const q = c.req.valid('query');
      const status = q.status?.split(',') as RunRow['status'][] | undefined;
      return c.json(toPage(await agent.listRuns(teamOf(c), { ...q, status }), q, runView), 200);
    })
    .openapi(r.getRun, async (c) => c.json(runView(await agent.getRun(teamOf(c), c.req.valid('param').r)), 200))
    .openapi(r.cancelRun, async (c) => {
      const run = await agent.cancel(writableTeamOf(c), c.req.valid('param').r);
      c.set('audit', { action: 'run.cancel', resourceType: 'run', resourceId: run.id });
      return c.json(runView(run), 200);
    })
    .openapi(r.runEvents, async (c) => {
      const run = await agent.getRun(teamOf(c), c.req.valid('param').r);
      const header = c.req.header('last-event-id');
      if (header !== undefined && !/^\d{1,10}$/.test(header)) throw new ApiError('invalid_request', 'Last-Event-ID must be an event sequence number');
      const after = header !== undefined ? Number(header) : (c.req.valid('query').after ?? 0);
      if ((c.req.header('accept') ?? '').includes('application/json')) {
        const list = await agent.events.list(run.id, after);
        return c.json({ data: list.map((e) => ({ id: e.seq, event: e.event, data: e.data, created_at: e.createdAt.toISOString() })) }, 200);
      }
      return streamRun(c, agent.events, run.id, after) as never;
    })
    .openapi(r.listApprovals, async (c) => {
      const orgAdmin = c.get('principal').role === 'org_admin';
      return c.json({ data: (await agent.listApprovals(orgAdmin ? null : teamOf(c), c.req.valid('query'))).map(approvalView) }, 200);
    })
    .openapi(r.decideApproval, async (c) => {
      // Org admins decide the approvals only they may (platform source updates), in any team.
      if (c.get('principal').role !== 'org_admin') teamOf(c);
      const { decision, reason } = c.req.valid('json');
      const a = await agent.decide(c.get('principal'), c.req.valid('param').a, decision, reason);
      c.set('audit', { action: 'approval.decide', resourceType: 'approval', resourceId: a.id, teamId: a.teamId, after: { decision, reason: reason ?? null, run_id: a.runId } });
      return c.json(approvalView(a), 200);
    })
    .openapi(r.getUsage, async (c) => {
      const team = teamOf(c);
      const col = c.req.valid('query').group_by === 'workspace' ? usage.workspaceId : usage.model;
      const rows = await db
        .select({
          key: col,
          prompt_tokens: sql<number>`sum(${usage.promptTokens})::int`,
          completion_tokens: sql<number>`sum(${usage.completionTokens})::int`,
          calls: sql<number>`count(*)::int`,
        })
        .from(usage)
        .where(eq(usage.teamId, team))
        .groupBy(col);
      return c.json({ data: rows.map((x) => ({ ...x, prompt_tokens: Number(x.prompt_tokens), completion_tokens: Number(x.completion_tokens), calls: Number(x.calls) })) }, 200);
    });
}
