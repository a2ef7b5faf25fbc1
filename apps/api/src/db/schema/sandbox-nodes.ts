import { integer, jsonb, pgTable, real, text } from 'drizzle-orm/pg-core';
import { createdAt, ts } from './columns.ts';

/**
 * The sandbox nodes an org admin registered (docs/scaling.md): where each is dialled, what its
 * host has, and the last time any replica heard from it. Sandboxes on a node carry its name in
 * their container id (`<node>/<container>`), so its committed limits are summed from `sandboxes`.
 */
export const sandboxNodes = pgTable('sandbox_nodes', {
  name: text('name').primaryKey(),
  /** `https://host:port` */
  url: text('url').notNull(),
  /** active: takes new sandboxes; draining: keeps the ones it has until they end, takes none. */
  state: text('state', { enum: ['active', 'draining'] })
    .notNull()
    .default('active'),
  /** What the node last said of its host (0 until first heard). */
  memoryMb: integer('memory_mb').notNull().default(0),
  cpus: real('cpus').notNull().default(0),
  runtimes: jsonb('runtimes').$type<{ runtime: 'runc' | 'gvisor'; egress: boolean }[]>().notNull().default([]),
  /** The template images it said it has (their tags), for placement and for the operator. */
  images: jsonb('images').$type<string[]>().notNull().default([]),
  /** When a replica last had an answer from it; null: never. */
  lastHeardAt: ts('last_heard_at'),
  /** The last failure a replica saw talking to it, cleared by the next answer. */
  lastError: text('last_error'),
  createdAt: createdAt(),
});
