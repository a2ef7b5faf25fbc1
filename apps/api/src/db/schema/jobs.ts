import { index, integer, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, ts } from './columns.ts';

/** Durable jobs: an instance's job runner leases a row (instance, locked_until) so replicas never run one twice. */
export const jobs = pgTable(
  'jobs',
  {
    id: text('id').primaryKey(),
    kind: text('kind').notNull(),
    payload: jsonb('payload').notNull(),
    status: text('status', { enum: ['queued', 'running', 'succeeded', 'failed'] })
      .notNull()
      .default('queued'),
    dedupeKey: text('dedupe_key').unique(),
    runAt: ts('run_at').notNull().defaultNow(),
    attempts: integer('attempts').notNull().default(0),
    maxAttempts: integer('max_attempts').notNull().default(3),
    /** The instance whose job runner holds the lease (the column keeps its first name). */
    instance: text('locked_by'),
    lockedUntil: ts('locked_until'),
    lastError: text('last_error'),
    createdAt: createdAt(),
    finishedAt: ts('finished_at'),
  },
  (t) => [index('jobs_due_idx').on(t.status, t.runAt)],
);
