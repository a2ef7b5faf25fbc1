import { text, timestamp } from 'drizzle-orm/pg-core';
import { teams } from './teams.ts';

/** Timestamps are always timezone-aware. */
export const ts = (name: string) => timestamp(name, { withTimezone: true, mode: 'date' });
export const createdAt = () => ts('created_at').notNull().defaultNow();
/** Every tenant-owned row carries its team, so every query can be scoped by it. */
export const teamId = () =>
  text('team_id')
    .notNull()
    .references(() => teams.id, { onDelete: 'cascade' });
