import { sql } from 'drizzle-orm';
import { customType, index, integer, pgTable, real, serial, text } from 'drizzle-orm/pg-core';
import { teamId, ts } from './columns.ts';
import { workspaces } from './workspaces.ts';

const tsvector = customType<{ data: string }>({ dataType: () => 'tsvector' });

/**
 * Search index over a workspace's memory, knowledge and skills, rebuilt per touched file on
 * commit. `tsv` feeds full-text search; a trigram index on `content` (migration 0001) serves
 * substring matches for text the full-text parser cannot split, such as Chinese.
 */
export const memoryChunks = pgTable(
  'memory_chunks',
  {
    id: serial('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id').notNull().references(() => workspaces.id, { onDelete: 'cascade' }),
    path: text('path').notNull(),
    startLine: integer('start_line').notNull(),
    endLine: integer('end_line').notNull(),
    heading: text('heading'),
    content: text('content').notNull(),
    contentHash: text('content_hash').notNull(),
    embedding: real('embedding').array(),
    tsv: tsvector('tsv').generatedAlwaysAs(sql`to_tsvector('simple', coalesce(heading, '') || ' ' || content)`),
    updatedAt: ts('updated_at').notNull().defaultNow(),
  },
  (t) => [index('memory_chunks_ws_path_idx').on(t.workspaceId, t.path), index('memory_chunks_tsv_idx').using('gin', t.tsv)],
);
