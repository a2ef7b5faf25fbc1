import { index, integer, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId } from './columns.ts';

/** One row per model call: tokens by team, workspace, run and model. */
export const usage = pgTable(
  'usage',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id').notNull(),
    runId: text('run_id'),
    model: text('model').notNull(),
    promptTokens: integer('prompt_tokens').notNull(),
    completionTokens: integer('completion_tokens').notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('usage_team_created_idx').on(t.teamId, t.createdAt)],
);
