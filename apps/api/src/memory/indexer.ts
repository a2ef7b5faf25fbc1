import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { and, eq, inArray, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { memoryChunks } from '../db/schema/index.ts';
import { chunkFile, INDEX_VERSION, isIndexed } from './chunker.ts';
import { builtinVector, type VectorFill } from './vectors.ts';

const SMALL = 500;
/** Chunks written between two `analyze` runs (PGlite has no autovacuum to keep planner statistics fresh). */
const ANALYZE_EVERY = 5000;
const written = new WeakMap<Db, number>();

/** Counts chunks written and refreshes the planner's statistics every ANALYZE_EVERY of them. */
async function wrote(db: Db, rows: number): Promise<void> {
  const total = (written.get(db) ?? 0) + rows;
  written.set(db, total >= ANALYZE_EVERY ? 0 : total);
  if (total >= ANALYZE_EVERY) await db.execute(sql`analyze memory_chunks`);
}

export interface IndexTarget {
  id: string;
  teamId: string;
  dir: string;
  /** Template lines that are shown but not searched (see chunker.ts). */
  boilerplate?: ReadonlySet<string>;
}

type Row = typeof memoryChunks.$inferInsert;

/** What identifies a chunk's text for its vector: its file, its content and the heading it is under. */
const vectorKey = (r: { path: string; contentHash: string; heading?: string | null }) =>
  `${r.path}\0${r.contentHash}\0${r.heading ?? ''}`;

/**
 * The vectors the index already holds for chunks of these paths, when the workspace's index was
 * embedded by this model: a commit that appends to a daily log re-embeds only its new chunks.
 */
async function knownVectors(
  db: Db,
  workspaceId: string,
  model: string,
  paths: string[],
): Promise<Map<string, number[]>> {
  const rows = rowsOf<{ path: string; content_hash: string; heading: string | null; embedding: number[] }>(
    await db.execute(sql`select c.path, c.content_hash, c.heading, c.embedding from memory_chunks c
      join memory_index m on m.workspace_id = c.workspace_id and m.embed_model = ${model}
      where c.workspace_id = ${workspaceId} and c.embedding is not null and c.path in ${sql`(${sql.join(
        paths.map((p) => sql`${p}`),
        sql`, `,
      )})`}`),
  );
  return new Map(rows.map((r) => [vectorKey({ ...r, contentHash: r.content_hash }), r.embedding.map(Number)]));
}

/**
 * The chunk rows of the given workspace paths as they are on disk now. With `vectors`, a chunk
 * takes the vector the index already has for the same text (`reuse`: a commit that appends to a
 * daily log keeps the vectors of the chunks it did not change) or a built-in skill's from the
 * cache; the others are written without one, and VectorFill embeds them after the write.
 */
async function rowsFor(ws: IndexTarget, paths: string[], vectors?: VectorFill, reuse?: Db): Promise<Row[]> {
  const rows: Row[] = [];
  for (const path of paths) {
    const text = await readFile(join(ws.dir, path), 'utf8').catch(() => null);
    if (text === null) continue;
    for (const c of chunkFile(path, text, ws.boilerplate, vectors !== undefined)) {
      rows.push({
        teamId: ws.teamId,
        workspaceId: ws.id,
        path,
        startLine: c.startLine,
        endLine: c.endLine,
        heading: c.heading,
        content: c.content,
        contentHash: createHash('sha256').update(c.content).digest('hex'),
        searchText: c.searchText,
        cjk: c.cjk,
        len: c.len,
        day: c.day,
        builtin: c.builtin,
      });
    }
  }
  if (vectors && rows.length) {
    const { model } = vectors.embedder;
    const known = reuse ? await knownVectors(reuse, ws.id, model, paths) : new Map<string, number[]>();
    for (const r of rows)
      r.embedding = known.get(vectorKey(r)) ?? (r.builtin ? builtinVector(model, r.searchText!) : undefined);
  }
  return rows;
}

const valuesOf = (rows: Row[]) =>
  sql.join(
    rows.map(
      (r) =>
        sql`(${r.teamId}, ${r.workspaceId}, ${r.path}, ${r.startLine}::int, ${r.endLine}::int, ${r.heading}, ${r.content}, ${r.contentHash}, ${r.searchText}, ${r.cjk}, ${r.len}::int, ${r.day}::date, ${r.builtin}::boolean, ${r.embedding ? `{${r.embedding.join(',')}}` : null}::real[])`,
    ),
    sql`, `,
  );
const COLUMNS = sql.raw(
  '(team_id, workspace_id, path, start_line, end_line, heading, content, content_hash, search_text, cjk, len, day, builtin, embedding)',
);

/** Rebuilds the chunks of the given workspace paths (deleted files simply lose theirs). */
export async function reindexPaths(db: Db, ws: IndexTarget, paths: string[], vectors?: VectorFill): Promise<number> {
  const targets = [...new Set(paths.filter(isIndexed))];
  if (targets.length === 0) return 0;
  const rows = await rowsFor(ws, targets, vectors, db);
  const stale = and(eq(memoryChunks.workspaceId, ws.id), inArray(memoryChunks.path, targets));
  if (rows.length === 0) {
    await db.delete(memoryChunks).where(stale);
    return 0;
  }
  if (rows.length <= SMALL) {
    // The common case (one commit's files): replace the chunks in a single statement.
    await db.execute(sql`with stale as (delete from ${memoryChunks} where ${stale})
      insert into ${memoryChunks} ${COLUMNS} select * from (values ${valuesOf(rows)}) as v`);
  } else
    await db.transaction(async (tx) => {
      await tx.delete(memoryChunks).where(stale);
      await insertRows(tx as unknown as Db, rows);
    });
  await wrote(db, rows.length);
  if (rows.some((r) => !r.embedding)) vectors?.schedule(ws.id);
  return rows.length;
}

async function insertRows(db: Db, rows: Row[]): Promise<void> {
  for (let i = 0; i < rows.length; i += SMALL)
    await db.execute(sql`insert into ${memoryChunks} ${COLUMNS} values ${valuesOf(rows.slice(i, i + SMALL))}`);
}

/** Every indexed file of a workspace, for a full rebuild. */
export async function indexedFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    const entries = await readdir(join(dir, rel), { withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      const p = rel ? `${rel}/${e.name}` : e.name;
      if (e.name === '.git') continue;
      if (e.isDirectory()) await walk(p);
      else if (isIndexed(p)) out.push(p);
    }
  };
  await walk('');
  return out.sort();
}

/**
 * Rebuilds a workspace's whole index (creation, start-up repair, a new chunking or ranking
 * version, an embeddings model change) in one transaction: searches see the old index or the
 * new one, never a half-built one. With `onlyIfStale`, nothing is done when the index is at
 * the current version already or another server holds it (it is re-indexing it): returns null.
 */
export async function reindexAll(
  db: Db,
  ws: IndexTarget,
  vectors?: VectorFill,
  opts: { onlyIfStale?: boolean } = {},
): Promise<number | null> {
  const rows = await rowsFor(ws, await indexedFiles(ws.dir), vectors);
  const model = vectors?.embedder.model ?? '';
  const done = await db.transaction(async (t) => {
    const tx = t as unknown as Db;
    await tx.execute(sql`insert into memory_index (workspace_id) values (${ws.id}) on conflict do nothing`);
    const claimed = rowsOf<{ version: number; embed_model: string }>(
      await tx.execute(
        sql`select version, embed_model from memory_index where workspace_id = ${ws.id} for update ${opts.onlyIfStale ? sql`skip locked` : sql``}`,
      ),
    )[0];
    if (opts.onlyIfStale && (!claimed || (claimed.version >= INDEX_VERSION && claimed.embed_model === model)))
      return false;
    // Term statistics are rebuilt from nothing by the insert trigger (no zero rows left behind).
    await tx.execute(sql`delete from memory_terms where workspace_id = ${ws.id}`);
    await tx.delete(memoryChunks).where(eq(memoryChunks.workspaceId, ws.id));
    await insertRows(tx, rows);
    await tx.execute(
      sql`update memory_index set version = ${INDEX_VERSION}, embed_model = ${model}, indexed_at = now() where workspace_id = ${ws.id}`,
    );
    return true;
  });
  if (!done) return null;
  // Fresh statistics after a bulk load, so the planner uses the text indexes (PGlite has no autovacuum).
  if (rows.length > SMALL) {
    written.set(db, 0);
    await db.execute(sql`analyze memory_chunks`);
  } else await wrote(db, rows.length);
  if (rows.some((r) => !r.embedding)) vectors?.schedule(ws.id);
  return rows.length;
}

/** Workspaces whose index was built by an older chunking or ranking (or never), or embedded by another model than `embedModel`. */
export async function staleIndexes(db: Db, embedModel = ''): Promise<string[]> {
  const rows = rowsOf<{ id: string }>(
    await db.execute(sql`select w.id from workspaces w left join memory_index m on m.workspace_id = w.id
      where w.deleted_at is null and (coalesce(m.version, 0) < ${INDEX_VERSION} or coalesce(m.embed_model, '') <> ${embedModel}) order by w.id`),
  );
  return rows.map((r) => r.id);
}
