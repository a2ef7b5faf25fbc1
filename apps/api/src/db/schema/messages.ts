import { index, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';
import { sessions } from './sessions.ts';

/** The transcript: user turns, model replies (with tool calls) and tool results. */
export const messages = pgTable(
  'messages',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    sessionId: text('session_id')
      .notNull()
      .references(() => sessions.id, { onDelete: 'cascade' }),
    runId: text('run_id'),
    role: text('role', { enum: ['system', 'user', 'assistant', 'tool'] }).notNull(),
    content: text('content').notNull(),
    toolCalls: jsonb('tool_calls'),
    toolCallId: text('tool_call_id'),
    contentHash: text('content_hash').notNull(),
    createdAt: createdAt(),
    summarizedAt: ts('summarized_at'),
  },
  (t) => [index('messages_session_idx').on(t.sessionId, t.id)],
);

export type MessageRow = typeof messages.$inferSelect;
