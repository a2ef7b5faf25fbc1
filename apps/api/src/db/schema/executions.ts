import { boolean, index, integer, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId } from './columns.ts';

export const executions = pgTable(
  'executions',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    sessionId: text('session_id').notNull(),
    sandboxId: text('sandbox_id'),
    runId: text('run_id'),
    codeHash: text('code_hash').notNull(),
    durationMs: integer('duration_ms').notNull(),
    exitCode: integer('exit_code'),
    error: text('error'),
    truncated: boolean('truncated').notNull().default(false),
    stdoutBytes: integer('stdout_bytes').notNull().default(0),
    stderrBytes: integer('stderr_bytes').notNull().default(0),
    /** The execution's requests through the egress proxy (host, port, method, allowed, status, bytes). */
    egress: jsonb('egress').notNull().default([]),
    createdAt: createdAt(),
  },
  (t) => [index('executions_session_idx').on(t.sessionId, t.id)],
);
