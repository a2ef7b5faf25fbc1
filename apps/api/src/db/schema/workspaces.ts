import { sql } from 'drizzle-orm';
import { index, jsonb, pgTable, text, uniqueIndex } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';

export const workspaces = pgTable(
  'workspaces',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    name: text('name').notNull(),
    settings: jsonb('settings').notNull(),
    head: text('head'),
    createdAt: createdAt(),
    updatedAt: ts('updated_at').notNull().defaultNow(),
    deletedAt: ts('deleted_at'),
    /** Why the last start-up repair of its repository failed (null when it did not). */
    repairError: text('repair_error'),
    repairFailedAt: ts('repair_failed_at'),
  },
  (t) => [
    index('workspaces_team_idx').on(t.teamId, t.id),
    uniqueIndex('workspaces_team_name_live_idx').on(t.teamId, t.name).where(sql`deleted_at is null`),
  ],
);
