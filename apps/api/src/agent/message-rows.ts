import { createHash } from 'node:crypto';
import { sql, type SQL } from 'drizzle-orm';
import type { MessageRow } from '../db/schema/index.ts';
import { newId } from '../lib/ids.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import type { ToolCall } from './llm.ts';

export type NewMessage = {
  role: 'user' | 'assistant' | 'tool';
  content: string;
  toolCalls?: ToolCall[];
  toolCallId?: string;
};

const hash = (s: string) => createHash('sha256').update(s).digest('hex');

/** A transcript message of a session's run, as it will be stored. */
export function messageRow(session: SessionRow, runId: string, m: NewMessage): MessageRow {
  return {
    id: newId('msg'),
    teamId: session.teamId,
    sessionId: session.id,
    runId,
    role: m.role,
    content: m.content,
    toolCalls: m.toolCalls ?? null,
    toolCallId: m.toolCallId ?? null,
    contentHash: hash(`${m.role}\n${m.content}`),
    createdAt: new Date(),
    summarizedAt: null,
  };
}

/** One model call's tokens, by team, workspace, run (none for reviews and dreams) and model. */
export function insertUsage(
  by: { teamId: string; workspaceId: string; runId: string | null; model: string },
  u: { promptTokens: number; completionTokens: number },
): SQL {
  return sql`insert into usage (id, team_id, workspace_id, run_id, model, prompt_tokens, completion_tokens)
    values (${newId('use')}, ${by.teamId}, ${by.workspaceId}, ${by.runId}, ${by.model}, ${u.promptTokens}, ${u.completionTokens})`;
}

/** The insert for a message row, to go into a step's combined write. */
export function insertMessage(row: MessageRow): SQL {
  return sql`insert into messages (id, team_id, session_id, run_id, role, content, tool_calls, tool_call_id, content_hash, created_at)
    values (${row.id}, ${row.teamId}, ${row.sessionId}, ${row.runId}, ${row.role}, ${row.content}, ${row.toolCalls === null ? null : JSON.stringify(row.toolCalls)}::jsonb,
      ${row.toolCallId}, ${row.contentHash}, ${row.createdAt.toISOString()}::timestamptz)`;
}
