import { sql } from 'drizzle-orm';
import { bigint, index, jsonb, pgTable, text, uniqueIndex } from 'drizzle-orm/pg-core';
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
    /**
     * The bytes of its working tree at its last checked write (files API, sandbox changes): what
     * it counts against its team's KILN_TEAM_WORKSPACE_BYTES_MAX.
     */
    sizeBytes: bigint('size_bytes', { mode: 'number' }).notNull().default(0),
  },
  (t) => [
    index('workspaces_team_idx').on(t.teamId, t.id),
    uniqueIndex('workspaces_team_name_live_idx').on(t.teamId, t.name).where(sql`deleted_at is null`),
  ],
);
