import { jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, ts } from './columns.ts';

/**
 * Platform self-updates: patches to Kiln's own source, org-admin only, so no team or workspace.
 * `checks` is the list of check steps (and the restart), in the order they ran.
 */
export const platformUpdates = pgTable('platform_updates', {
  id: text('id').primaryKey(),
  status: text('status', { enum: ['checking', 'ready', 'failed', 'applying', 'applied', 'rolled_back'] }).notNull(),
  commitSha: text('commit_sha'),
  changedPaths: jsonb('changed_paths').$type<string[]>().notNull().default([]),
  reason: text('reason').notNull(),
  checks: jsonb('checks').$type<unknown[]>().notNull().default([]),
  error: text('error'),
  createdAt: createdAt(),
  finishedAt: ts('finished_at'),
});
