import { sql } from 'drizzle-orm';
import { index, integer, jsonb, pgTable, text, uniqueIndex } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';
import { sessions } from './sessions.ts';
import { workspaces } from './workspaces.ts';

export const RUN_STATUSES = ['queued', 'in_progress', 'requires_action', 'completed', 'failed', 'cancelled'] as const;
/** A run in one of these has not finished: at most one per session. */
export const ACTIVE_RUN_STATUSES = ['queued', 'in_progress', 'requires_action'] as const;

export const runs = pgTable(
  'runs',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    sessionId: text('session_id')
      .notNull()
      .references(() => sessions.id, { onDelete: 'cascade' }),
    status: text('status', { enum: RUN_STATUSES }).notNull().default('queued'),
    model: text('model'),
    /** What started the run: a person's message, or a post-session review telling the session what it changed. */
    trigger: text('trigger', { enum: ['message', 'review'] })
      .notNull()
      .default('message'),
    steps: integer('steps').notNull().default(0),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    completionTokens: integer('completion_tokens').notNull().default(0),
    error: jsonb('error'),
    createdAt: createdAt(),
    startedAt: ts('started_at'),
    finishedAt: ts('finished_at'),
    cancelRequestedAt: ts('cancel_requested_at'),
    /**
     * The instance (KILN_INSTANCE_ID) whose loop runs this run while it is queued or in progress
     * (the column keeps its first name).
     */
    instance: text('runner'),
    /** Renewed by that server while it lives; past it, any server may mark the run interrupted. */
    leaseUntil: ts('lease_until'),
  },
  (t) => [
    index('runs_session_idx').on(t.sessionId, t.id),
    // GET /v1/runs: a team's runs, newest first.
    index('runs_team_idx').on(t.teamId, t.id),
    index('runs_status_idx').on(t.status),
    // At most one unfinished run per session: the second message gets 409 session_busy.
    uniqueIndex('runs_one_active_per_session')
      .on(t.sessionId)
      .where(sql`status in ('queued', 'in_progress', 'requires_action')`),
  ],
);

export type RunRow = typeof runs.$inferSelect;

/** A change to a run's row a step has not written yet: tokens add to the totals, the rest is set. */
export interface RunPatch {
  promptTokens: number;
  completionTokens: number;
  steps?: number;
  /** queued → in_progress, at this time. */
  startedAt?: Date;
}
