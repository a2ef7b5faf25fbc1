import { boolean, index, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';
import { workspaces } from './workspaces.ts';

export const sessions = pgTable(
  'sessions',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    title: text('title'),
    status: text('status', { enum: ['active', 'ended'] })
      .notNull()
      .default('active'),
    /** Set by an approve_session decision: code in this session no longer asks. */
    autoApprove: boolean('auto_approve').notNull().default(false),
    /** The <Current_Project_State> snapshot written when old turns were condensed away. */
    stateSnapshot: text('state_snapshot'),
    createdAt: createdAt(),
    lastActivityAt: ts('last_activity_at').notNull().defaultNow(),
    lastReviewedAt: ts('last_reviewed_at'),
    endedAt: ts('ended_at'),
  },
  (t) => [index('sessions_workspace_idx').on(t.workspaceId, t.id), index('sessions_team_idx').on(t.teamId)],
);
