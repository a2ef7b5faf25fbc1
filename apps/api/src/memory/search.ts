import { and, eq, isNotNull, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { memoryChunks } from '../db/schema/index.ts';
import { cosine, type Embedder } from './embeddings.ts';

export interface SearchHit {
  path: string;
  start_line: number;
  end_line: number;
  snippet: string;
  score: number;
}

const CANDIDATES = 200;
const DAILY = /^memory\/(\d{4}-\d{2}-\d{2})\.md$/;
/** Daily logs lose half their weight every this many days; core memory never decays. */
const HALF_LIFE_DAYS = 30;

/** Words and CJK runs of a query, without duplicates (lower-cased unless `keepCase`). */
export function queryTerms(q: string, keepCase = false): string[] {
  const terms = (keepCase ? q : q.toLowerCase())
    .split(/[\s,.;:!?()[\]{}"'`<>|/\\，。；：！？（）【】「」、]+/u)
    .filter((t) => t.length > 0);
  return [...new Set(terms)].slice(0, 12);
}

const likeEscape = (t: string) => t.replace(/[\\%_]/g, (c) => `\\${c}`);

/** Terms the full-text parser does not split into searchable words: non-ASCII text and identifiers. */
const needsSubstring = (t: string) => /[^\x00-\x7f]/.test(t) || /[_.\d]|[a-z][A-Z]/.test(t);

/**
 * Ranks a workspace's memory, knowledge and skill chunks for a query: Postgres full-text
 * rank (simple config) plus substring coverage of the query terms (which finds Chinese text and
 * code identifiers the full-text parser cannot split), plus cosine similarity when an embeddings
 * model is configured. Dated daily logs decay with age.
 */
export async function searchMemory(
  db: Db,
  workspaceId: string,
  q: string,
  k: number,
  opts: { embedder?: Embedder; now?: Date } = {},
): Promise<SearchHit[]> {
  const terms = queryTerms(q);
  if (terms.length === 0) return [];
  const tsquery = sql`websearch_to_tsquery('simple', ${terms.join(' or ')})`;
  const columns = {
    id: memoryChunks.id,
    path: memoryChunks.path,
    startLine: memoryChunks.startLine,
    endLine: memoryChunks.endLine,
    heading: memoryChunks.heading,
    content: memoryChunks.content,
  };
  const ftsRows = await db
    .select({ ...columns, fts: sql<number>`ts_rank(${memoryChunks.tsv}, ${tsquery}, 32)` })
    .from(memoryChunks)
    .where(and(eq(memoryChunks.workspaceId, workspaceId), sql`${memoryChunks.tsv} @@ ${tsquery}`))
    .orderBy(sql`7 desc`)
    .limit(CANDIDATES);
  // Substring matching is the expensive part: it runs for what full-text search cannot split
  // (Chinese, identifiers), and for plain words only when full-text search found too little.
  const substringTerms = ftsRows.length >= k ? queryTerms(q, true).filter(needsSubstring) : terms;
  const likeRows = substringTerms.length
    ? await db
        .select({ ...columns, fts: sql<number>`0` })
        .from(memoryChunks)
        .where(
          and(
            eq(memoryChunks.workspaceId, workspaceId),
            sql`(${sql.join(
              substringTerms.map((t) => sql`${memoryChunks.content} ilike ${`%${likeEscape(t.toLowerCase())}%`}`),
              sql` or `,
            )})`,
          ),
        )
        .limit(CANDIDATES)
    : [];
  const rows = [...ftsRows, ...likeRows.filter((r) => !ftsRows.some((f) => f.id === r.id))];

  const byId = new Map(rows.map((r) => [r.id, { ...r, fts: Number(r.fts), vector: 0 }]));
  if (opts.embedder) {
    const [qv] = await opts.embedder.embed([q]);
    const vectors = await db
      .select({ id: memoryChunks.id, path: memoryChunks.path, startLine: memoryChunks.startLine, endLine: memoryChunks.endLine, heading: memoryChunks.heading, content: memoryChunks.content, embedding: memoryChunks.embedding })
      .from(memoryChunks)
      .where(and(eq(memoryChunks.workspaceId, workspaceId), isNotNull(memoryChunks.embedding)));
    for (const v of vectors) {
      const sim = cosine(qv!, v.embedding!);
      const hit = byId.get(v.id);
      if (hit) hit.vector = sim;
      else if (sim > 0.3) byId.set(v.id, { ...v, fts: 0, vector: sim });
    }
  }

  const now = (opts.now ?? new Date()).getTime();
  const scored = [...byId.values()].map((r) => {
    const haystack = `${r.heading ?? ''}\n${r.content}`.toLowerCase();
    const coverage = terms.filter((t) => haystack.includes(t)).length / terms.length;
    let score = 0.5 * r.fts + 0.5 * coverage + (opts.embedder ? 0.6 * Math.max(0, r.vector) : 0);
    const day = DAILY.exec(r.path)?.[1];
    if (day) score *= 0.5 ** (Math.max(0, now - Date.parse(`${day}T00:00:00Z`)) / 86_400_000 / HALF_LIFE_DAYS);
    return { r, score };
  });
  scored.sort((a, b) => b.score - a.score);
  return scored.slice(0, k).map(({ r, score }) => ({
    path: r.path,
    start_line: r.startLine,
    end_line: r.endLine,
    snippet: snippetOf(r.content, terms),
    score: Math.round(score * 10_000) / 10_000,
  }));
}

/** Up to ~300 characters around the first matching line. */
function snippetOf(content: string, terms: string[]): string {
  const lines = content.split('\n');
  const at = Math.max(0, lines.findIndex((l) => terms.some((t) => l.toLowerCase().includes(t))));
  const text = lines.slice(Math.max(0, at - 1), at + 3).join('\n').trim();
  return text.length > 300 ? `${text.slice(0, 297)}...` : text;
}
