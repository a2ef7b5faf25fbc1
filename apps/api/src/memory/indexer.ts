import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { and, eq, inArray, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { memoryChunks } from '../db/schema/index.ts';
import { isIndexed } from '../workspace/kinds.ts';
import { chunkMarkdown } from './chunker.ts';
import type { Embedder } from './embeddings.ts';

const SMALL = 500;

export interface IndexTarget {
  id: string;
  teamId: string;
  dir: string;
}

/** Rebuilds the chunks of the given workspace paths (deleted files simply lose theirs). */
export async function reindexPaths(db: Db, ws: IndexTarget, paths: string[], embedder?: Embedder): Promise<number> {
  const targets = [...new Set(paths.filter(isIndexed))];
  if (targets.length === 0) return 0;
  const rows: (typeof memoryChunks.$inferInsert)[] = [];
  for (const path of targets) {
    const text = await readFile(join(ws.dir, path), 'utf8').catch(() => null);
    if (text === null) continue;
    for (const c of chunkMarkdown(text)) {
      rows.push({
        teamId: ws.teamId,
        workspaceId: ws.id,
        path,
        startLine: c.startLine,
        endLine: c.endLine,
        heading: c.heading,
        content: c.content,
        contentHash: createHash('sha256').update(c.content).digest('hex'),
      });
    }
  }
  if (embedder && rows.length) {
    const vectors = await embedder.embed(rows.map((r) => (r.heading ? `${r.heading}\n${r.content}` : r.content)));
    rows.forEach((r, i) => (r.embedding = vectors[i]));
  }
  const stale = and(eq(memoryChunks.workspaceId, ws.id), inArray(memoryChunks.path, targets));
  if (rows.length === 0) {
    await db.delete(memoryChunks).where(stale);
    return 0;
  }
  if (rows.length <= SMALL) {
    // The common case (one commit's files): replace the chunks in a single statement.
    await db.execute(sql`with stale as (delete from ${memoryChunks} where ${stale})
      insert into ${memoryChunks} (team_id, workspace_id, path, start_line, end_line, heading, content, content_hash, embedding)
      select * from (values ${sql.join(
        rows.map((r) => sql`(${r.teamId}, ${r.workspaceId}, ${r.path}, ${r.startLine}::int, ${r.endLine}::int, ${r.heading}, ${r.content}, ${r.contentHash}, ${r.embedding ? `{${r.embedding.join(',')}}` : null}::real[])`),
        sql`, `,
      )}) as v`);
    return rows.length;
  }
  await db.transaction(async (tx) => {
    await tx.delete(memoryChunks).where(stale);
    for (let i = 0; i < rows.length; i += SMALL) await tx.insert(memoryChunks).values(rows.slice(i, i + SMALL));
  });
  return rows.length;
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

/** Drops and rebuilds a workspace's whole index (start-up repair, or after an embeddings model change). */
export async function reindexAll(db: Db, ws: IndexTarget, embedder?: Embedder): Promise<number> {
  await db.delete(memoryChunks).where(eq(memoryChunks.workspaceId, ws.id));
  const n = await reindexPaths(db, ws, await indexedFiles(ws.dir), embedder);
  // Fresh statistics after a bulk load, so the planner uses the text indexes (PGlite has no autovacuum).
  await db.execute(sql`analyze memory_chunks`);
  return n;
}
