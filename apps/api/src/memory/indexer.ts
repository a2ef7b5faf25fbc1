import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { and, eq, inArray } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { memoryChunks } from '../db/schema/index.ts';
import { isIndexed } from '../workspace/kinds.ts';
import { chunkMarkdown } from './chunker.ts';
import type { Embedder } from './embeddings.ts';

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
  await db.transaction(async (tx) => {
    await tx.delete(memoryChunks).where(and(eq(memoryChunks.workspaceId, ws.id), inArray(memoryChunks.path, targets)));
    for (let i = 0; i < rows.length; i += 500) await tx.insert(memoryChunks).values(rows.slice(i, i + 500));
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
  return reindexPaths(db, ws, await indexedFiles(ws.dir), embedder);
}
