import { index, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, ts } from './columns.ts';
import { teams } from './teams.ts';

/** Reviews and dreams: a workspace's self-evolution (platform self-updates are `platform_updates`). */
export const evolutions = pgTable(
  'evolutions',
  {
    id: text('id').primaryKey(),
    teamId: text('team_id').references(() => teams.id, { onDelete: 'cascade' }),
    workspaceId: text('workspace_id'),
    sessionId: text('session_id'),
    kind: text('kind', { enum: ['review', 'dream'] }).notNull(),
    status: text('status').notNull(),
    commitSha: text('commit_sha'),
    changedPaths: jsonb('changed_paths').$type<string[]>().notNull().default([]),
    summary: text('summary'),
    diary: text('diary'),
    checks: jsonb('checks'),
    error: text('error'),
    createdAt: createdAt(),
    finishedAt: ts('finished_at'),
  },
  (t) => [index('evolutions_ws_idx').on(t.workspaceId, t.id)],
);
