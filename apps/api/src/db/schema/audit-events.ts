import { index, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt } from './columns.ts';

/** Append-only record of every state change: who, what, on which resource, before and after. */
export const auditEvents = pgTable(
  'audit_events',
  {
    id: text('id').primaryKey(),
    teamId: text('team_id'),
    actorKeyId: text('actor_key_id'),
    actorRole: text('actor_role'),
    action: text('action').notNull(),
    resourceType: text('resource_type'),
    resourceId: text('resource_id'),
    before: jsonb('before'),
    after: jsonb('after'),
    requestId: text('request_id'),
    createdAt: createdAt(),
  },
  (t) => [index('audit_events_team_idx').on(t.teamId, t.id), index('audit_events_action_idx').on(t.action)],
);
