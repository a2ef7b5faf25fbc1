import { index, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';

/** Mirrors the containers Kiln owns; the reaper reconciles it with Docker. */
export const sandboxes = pgTable(
  'sandboxes',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id'),
    sessionId: text('session_id'),
    /** The API instance holding the runner stream; only it can use (or must reap) the container. */
    owner: text('owner').notNull(),
    limits: jsonb('limits').notNull(),
    containerId: text('container_id').notNull(),
    image: text('image').notNull(),
    /** The container runtime it runs in (rows from before runtimes existed ran in runc). */
    runtime: text('runtime', { enum: ['runc', 'gvisor'] })
      .notNull()
      .default('runc'),
    state: text('state', { enum: ['starting', 'ready', 'removed'] }).notNull(),
    removedReason: text('removed_reason'),
    createdAt: createdAt(),
    lastUsedAt: ts('last_used_at').notNull().defaultNow(),
    expiresAt: ts('expires_at').notNull(),
    removedAt: ts('removed_at'),
  },
  (t) => [index('sandboxes_team_state_idx').on(t.teamId, t.state), index('sandboxes_session_idx').on(t.sessionId)],
);
