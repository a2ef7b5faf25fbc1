import { sql } from 'drizzle-orm';
import { boolean, index, integer, jsonb, pgTable, text, uniqueIndex } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';

/**
 * A team's webhook endpoints. `secret_sealed` is the signing secret (`whsec_…`), sealed like a
 * workspace secret (AES-256-GCM, the webhook id as associated data): the server needs the
 * secret itself to sign every delivery, so it cannot keep only a hash of it.
 */
export const webhooks = pgTable(
  'webhooks',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    url: text('url').notNull(),
    events: text('events').array().notNull(),
    description: text('description'),
    enabled: boolean('enabled').notNull().default(true),
    secretSealed: text('secret_sealed').notNull(),
    createdAt: createdAt(),
    updatedAt: ts('updated_at').notNull().defaultNow(),
  },
  (t) => [index('webhooks_team_idx').on(t.teamId, t.id)],
);

/**
 * One event owed to one webhook, and how its sending went. `body` is the exact JSON sent (what
 * the signature covers); retries send it again with the same id (`webhook-id`), a replay is a
 * new delivery (new id) of the same body. `attempt_log` keeps every attempt (bounded by the
 * maximum number of attempts): when, the HTTP status or the error, how long it took.
 */
export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: text('id').primaryKey(),
    webhookId: text('webhook_id')
      .notNull()
      .references(() => webhooks.id, { onDelete: 'cascade' }),
    teamId: teamId(),
    eventId: text('event_id').notNull(),
    eventType: text('event_type').notNull(),
    body: text('body').notNull(),
    status: text('status', { enum: ['pending', 'succeeded', 'failed'] })
      .notNull()
      .default('pending'),
    attempts: integer('attempts').notNull().default(0),
    maxAttempts: integer('max_attempts').notNull(),
    lastStatusCode: integer('last_status_code'),
    lastError: text('last_error'),
    attemptLog: jsonb('attempt_log').notNull().default([]),
    replayOf: text('replay_of'),
    createdAt: createdAt(),
    updatedAt: ts('updated_at').notNull().defaultNow(),
    nextAttemptAt: ts('next_attempt_at'),
    deliveredAt: ts('delivered_at'),
  },
  (t) => [
    index('webhook_deliveries_webhook_idx').on(t.webhookId, t.id),
    // An event fans out to a webhook once (a fan-out that ran again after a crash adds nothing); replays are extra rows.
    uniqueIndex('webhook_deliveries_event_idx').on(t.webhookId, t.eventId).where(sql`replay_of is null`),
  ],
);
