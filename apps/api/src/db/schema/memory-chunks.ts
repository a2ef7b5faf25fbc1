import { sql } from 'drizzle-orm';
import {
  bigint,
  boolean,
  customType,
  date,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  real,
  serial,
  text,
  timestamp,
} from 'drizzle-orm/pg-core';
import { teamId, ts } from './columns.ts';
import { workspaces } from './workspaces.ts';

const tsvector = customType<{ data: string }>({ dataType: () => 'tsvector' });

/**
 * Search index over a workspace's memory, knowledge and skills, rebuilt per touched file on
 * commit (see memory/chunker.ts for how files are cut). `content` is the chunk's lines as they
 * are in the file (for snippets); `search_text` is what is searched: the heading and the lines
 * that are not the template's boilerplate, indexed with `cjk`, its CJK character pairs. `tsv` (English stemming and stop words) feeds the
 * BM25 ranking; a trigram index on `search_text` serves substring matches for text the parser
 * cannot split (Chinese, identifiers). `len` is the chunk's length in words, for BM25's length
 * normalisation; `day` the date of a dated log.
 */
export const memoryChunks = pgTable(
  'memory_chunks',
  {
    id: serial('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    path: text('path').notNull(),
    startLine: integer('start_line').notNull(),
    endLine: integer('end_line').notNull(),
    heading: text('heading'),
    content: text('content').notNull(),
    contentHash: text('content_hash').notNull(),
    searchText: text('search_text').notNull().default(''),
    cjk: text('cjk').notNull().default(''),
    len: integer('len').notNull().default(0),
    day: date('day', { mode: 'string' }),
    builtin: boolean('builtin').notNull().default(false),
    /** Each term's frequency in the chunk (lexeme → count), filled by a row trigger from the same text as `tsv`. */
    tf: jsonb('tf').$type<Record<string, number>>().notNull().default({}),
    embedding: real('embedding').array(),
    tsv: tsvector('tsv').generatedAlwaysAs(sql`to_tsvector('english'::regconfig, search_text || ' ' || cjk)`),
    updatedAt: ts('updated_at').notNull().defaultNow(),
  },
  (t) => [
    index('memory_chunks_ws_path_idx').on(t.workspaceId, t.path),
    index('memory_chunks_ws_day_idx').on(t.workspaceId, t.day),
    index('memory_chunks_tsv_idx').using('gin', t.tsv).with({ gin_pending_list_limit: 64 }),
    // The chunks still waiting for their vector (memory/vectors.ts reads them a turn at a time).
    index('memory_chunks_unembedded_idx').on(t.workspaceId, t.id).where(sql`${t.embedding} is null`),
  ],
);

/**
 * Per-workspace statistics of the index, kept by statement triggers on memory_chunks (migration
 * 0007): the chunk count and total length BM25 needs, and the version of the chunking and
 * ranking the chunks were built with and the embeddings model (a start-up job re-indexes
 * workspaces below the current version or embedded by another model).
 */
export const memoryIndex = pgTable('memory_index', {
  workspaceId: text('workspace_id')
    .primaryKey()
    .references(() => workspaces.id, { onDelete: 'cascade' }),
  chunks: integer('chunks').notNull().default(0),
  totalLen: bigint('total_len', { mode: 'number' }).notNull().default(0),
  version: integer('version').notNull().default(0),
  /** The embeddings model the chunks were embedded with ('' for none): another one means a re-index. */
  embedModel: text('embed_model').notNull().default(''),
  indexedAt: timestamp('indexed_at', { withTimezone: true }),
});

/** Each term's document frequency in a workspace's index (BM25's IDF), kept by the same triggers. */
export const memoryTerms = pgTable(
  'memory_terms',
  {
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    term: text('term').notNull(),
    df: integer('df').notNull(),
  },
  (t) => [primaryKey({ columns: [t.workspaceId, t.term] })],
);
