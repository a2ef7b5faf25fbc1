import { bigserial, index, jsonb, pgTable, primaryKey, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId } from './columns.ts';
import { workspaces } from './workspaces.ts';

/** A mirror of each workspace commit's trailers, for fast filtered listing. */
export const commits = pgTable(
  'commits',
  {
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    sha: text('sha').notNull(),
    teamId: teamId(),
    kind: text('kind', { enum: ['memory', 'skill', 'knowledge', 'prompt', 'source', 'user', 'system'] }).notNull(),
    author: text('author', { enum: ['agent', 'user', 'system'] }).notNull(),
    summary: text('summary').notNull(),
    paths: jsonb('paths').$type<string[]>().notNull(),
    sessionId: text('session_id'),
    runId: text('run_id'),
    evolutionId: text('evolution_id'),
    createdAt: createdAt(),
    /** Mirror order = commit order (git dates have only second precision). */
    seq: bigserial('seq', { mode: 'number' }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.workspaceId, t.sha] }), index('commits_ws_seq_idx').on(t.workspaceId, t.seq)],
);
