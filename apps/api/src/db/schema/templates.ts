import { index, jsonb, pgTable, text, uniqueIndex } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';

/**
 * A team's sandbox templates: an image built on the base sandbox image with the team's apt and
 * pip packages and small files. `spec_hash` is the content hash of what the image is built from
 * (base image id, packages, files, mirror, index URL): rows of any team with the same hash share
 * one image (`kiln-template:<hash>`) and one build. `image` is the image in service, which a
 * rebuild replaces only once it succeeds; `log` is the last build's output (bounded).
 */
export const templates = pgTable(
  'templates',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    name: text('name').notNull(),
    spec: jsonb('spec').notNull(),
    specHash: text('spec_hash').notNull(),
    status: text('status', { enum: ['queued', 'building', 'ready', 'failed'] }).notNull(),
    image: text('image'),
    error: text('error'),
    log: text('log').notNull().default(''),
    createdAt: createdAt(),
    updatedAt: ts('updated_at').notNull().defaultNow(),
    builtAt: ts('built_at'),
  },
  (t) => [uniqueIndex('templates_team_name_idx').on(t.teamId, t.name), index('templates_hash_idx').on(t.specHash)],
);
