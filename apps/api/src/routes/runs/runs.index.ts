import type { Context } from 'hono';
import { streamSSE } from 'hono/streaming';
import { TERMINAL_EVENTS, type RunEventLog } from '../../agent/events.ts';
import type { AgentService } from '../../agent/service.ts';
import type { RunRow } from '../../db/schema/index.ts';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import type { AppEnv } from '../../http/env.ts';
import { ApiError } from '../../lib/errors.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
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

const PING_MS = 15_000;

/** The run's events as SSE from `after`, ending after the terminal event; frames carry `id: seq`. */
export function streamRun(c: Context<AppEnv>, events: RunEventLog, runId: string, after: number) {
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
        writes = writes.then(() =>
          stream.writeSSE({ id: String(ev.seq), event: ev.event, data: JSON.stringify(ev.data) }),
        );
        if (TERMINAL_EVENTS.has(ev.event)) writes.then(resolveDone);
      },
      abort.signal,
    );
    const ping = setInterval(() => void stream.writeSSE({ event: 'ping', data: '{}' }), PING_MS);
    await Promise.race([
      done,
      new Promise<void>((resolve) => abort.signal.addEventListener('abort', () => resolve(), { once: true })),
    ]);
    clearInterval(ping);
    abort.abort();
  });
}

/** Runs as the agent reports them; their events are read from the run event log, not through the agent. */
export function runsRouter(agent: AgentService, events: RunEventLog) {
  return createRouter()
    .openapi(r.listRuns, async (c) => {
      const q = c.req.valid('query');
      const status = q.status?.split(',') as RunRow['status'][] | undefined;
      return c.json(toPage(await agent.listRuns(teamOf(c), { ...q, status }), q, runView), 200);
    })
    .openapi(r.getRun, async (c) => c.json(runView(await agent.getRun(teamOf(c), c.req.valid('param').run)), 200))
    .openapi(r.cancelRun, async (c) => {
      const run = await agent.cancel(writableTeamOf(c), c.req.valid('param').run);
      c.set('audit', { action: 'run.cancel', resourceType: 'run', resourceId: run.id });
      return c.json(runView(run), 200);
    })
    .openapi(r.runEvents, async (c) => {
      const run = await agent.getRun(teamOf(c), c.req.valid('param').run);
      const header = c.req.header('last-event-id');
      if (header !== undefined && !/^\d{1,10}$/.test(header))
        throw new ApiError('invalid_request', 'Last-Event-ID must be an event sequence number');
      const after = header !== undefined ? Number(header) : (c.req.valid('query').after ?? 0);
      if ((c.req.header('accept') ?? '').includes('application/json')) {
        const list = await events.list(run.id, after);
        return c.json(
          {
            data: list.map((e) => ({ id: e.seq, event: e.event, data: e.data, created_at: e.createdAt.toISOString() })),
          },
          200,
        );
      }
      return streamRun(c, events, run.id, after) as never;
    });
}
