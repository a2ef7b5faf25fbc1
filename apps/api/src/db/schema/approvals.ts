import { boolean, index, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';
import { runs } from './runs.ts';

export const approvals = pgTable(
  'approvals',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id').notNull(),
    sessionId: text('session_id').notNull(),
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    code: text('code').notNull(),
    /** Under tool calling, the call whose result the decision answers. */
    toolCallId: text('tool_call_id'),
    status: text('status', { enum: ['pending', 'approved', 'denied', 'expired'] })
      .notNull()
      .default('pending'),
    decision: text('decision', { enum: ['approve', 'deny', 'approve_session'] }),
    reason: text('reason'),
    requiresOrgAdmin: boolean('requires_org_admin').notNull().default(false),
    decidedBy: text('decided_by'),
    createdAt: createdAt(),
    expiresAt: ts('expires_at').notNull(),
    decidedAt: ts('decided_at'),
  },
  (t) => [index('approvals_team_status_idx').on(t.teamId, t.status), index('approvals_run_idx').on(t.runId)],
);

export type ApprovalRow = typeof approvals.$inferSelect;
