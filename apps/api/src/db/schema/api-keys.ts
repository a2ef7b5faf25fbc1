import { boolean, index, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, ts } from './columns.ts';
import { teams } from './teams.ts';

/** Keys are stored as a SHA-256 hash; `team_id` is null for org-admin keys. */
export const apiKeys = pgTable(
  'api_keys',
  {
    id: text('id').primaryKey(),
    teamId: text('team_id').references(() => teams.id, { onDelete: 'cascade' }),
    name: text('name').notNull(),
    role: text('role', { enum: ['org_admin', 'owner', 'admin', 'member', 'viewer'] }).notNull(),
    canApprove: boolean('can_approve').notNull().default(false),
    keyHash: text('key_hash').notNull().unique(),
    keyPrefix: text('key_prefix').notNull(),
    createdAt: createdAt(),
    lastUsedAt: ts('last_used_at'),
    revokedAt: ts('revoked_at'),
  },
  (t) => [index('api_keys_team_idx').on(t.teamId)],
);
