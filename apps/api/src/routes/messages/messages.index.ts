import type { RunEventLog } from '../../agent/events.ts';
import type { AgentService } from '../../agent/service.ts';
import type { MessageRow } from '../../db/schema/index.ts';
import { teamOf, writableTeamOf } from '../../http/guards.ts';
import type { Db } from '../../db/client.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import { getSession } from '../../sessions/sessions.ts';
import { runView, streamRun } from '../runs/runs.index.ts';
import * as r from './messages.routes.ts';

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

export function messagesRouter(db: Db, agent: AgentService, events: RunEventLog) {
  return createRouter()
    .openapi(r.postMessage, async (c) => {
      const team = writableTeamOf(c);
      const { session: s } = c.req.valid('param');
      // The audit event is written with the run, in one commit.
      const { message, run } = await agent.postMessage(team, s, c.req.valid('json').content, {
        actor: c.get('principal'),
        requestId: c.get('requestId'),
      });
      c.set('audit', { action: 'session.message', recorded: true });
      if (c.req.valid('query').stream === 'true') return streamRun(c, events, run.id, 0) as never;
      return c.json({ message: messageView(message), run: runView(run) }, 202);
    })
    .openapi(r.listMessages, async (c) => {
      const team = teamOf(c);
      const { session: s } = c.req.valid('param');
      await getSession(db, team, s);
      const q = c.req.valid('query');
      return c.json(toPage(await agent.listMessages(team, s, q), q, messageView), 200);
    });
}
