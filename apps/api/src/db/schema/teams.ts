import { pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt } from './columns.ts';

export const teams = pgTable('teams', {
  id: text('id').primaryKey(),
  name: text('name').notNull().unique(),
  createdAt: createdAt(),
});
