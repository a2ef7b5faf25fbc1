import { createHash } from 'node:crypto';
import { sql, type SQL } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { cosine, type Embedder } from './embeddings.ts';
import { parseQuery } from './query.ts';
import { B, BUILTIN_FACTOR, fuseRanks, idf, K1, mergeHits, recencyFactor, snippetLines, snippetText, type Hit } from './rank.ts';

export interface SearchHit {
  path: string;
  start_line: number;
  end_line: number;
  snippet: string;
  score: number;
  /** The date of a dated log, else null. */
  date: string | null;
  heading: string | null;
  debug?: ScoreParts;
}

/** Why a hit ranks where it does (`debug=true`). */
export interface ScoreParts {
  bm25: number;
  /** Rank in the lexical list (1 = best), null when only the vectors found it. */
  lexical_rank: number | null;
  vector_similarity: number | null;
  vector_rank: number | null;
  recency: number;
  builtin: number;
  terms: { term: string; kind: 'word' | 'substring'; df: number; idf: number }[];
  chunk: { start_line: number; end_line: number };
}

export interface SearchOptions {
  k: number;
  /** Hits to skip (pagination). */
  offset?: number;
  /** Only paths starting with this. */
  path?: string;
  /** Only dated logs of these days (inclusive, YYYY-MM-DD). */
  since?: string;
  until?: string;
  debug?: boolean;
  embedder?: Embedder;
  now?: Date;
}

export interface SearchPage {
  hits: SearchHit[];
  hasMore: boolean;
}

/** The deepest a search pages: candidates ranked per query. */
export const MAX_DEPTH = 200;

const likeEscape = (t: string) => t.replace(/[\\%_]/g, (c) => `\\${c}`);
const textArray = (xs: string[]) => sql`${`{${xs.map((x) => `"${x.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(',')}}`}::text[]`;
const floatArray = (xs: number[]) => sql`${`{${xs.join(',')}}`}::float8[]`;

interface Candidate {
  id: number;
  path: string;
  start_line: number;
  end_line: number;
  heading: string | null;
  content: string;
  day: string | null;
  builtin: boolean;
  bm25: number;
  line_scores: number[] | null;
}

/**
 * Ranks a workspace's memory, knowledge and skill chunks for a query.
 *
 * Lexical: BM25 in the database over English-stemmed full-text terms (stop words dropped) and
 * substring terms (identifiers, CJK character pairs), with IDF from the workspace's own
 * statistics. With an embeddings model, the lexical list and the nearest chunks by cosine are
 * fused by reciprocal rank. Then bounded adjustments: recency adds at most 10 % to a dated
 * entry, built-in skills count half. Snippets are the best-matching lines of each chunk and
 * their neighbours; hits that overlap in a file are merged.
 */
export async function searchMemory(db: Db, workspaceId: string, q: string, opts: SearchOptions): Promise<SearchPage> {
  const { words, substrings } = parseQuery(q);
  const offset = opts.offset ?? 0;
  if (!words.length && !substrings.length) return { hits: [], hasMore: false };
  const depth = Math.min(MAX_DEPTH, Math.max(40, (offset + opts.k) * 3));

  // 1. The query's stemmed words, each term's document frequency and the index statistics.
  const stats = rowsOf<{ term: string; kind: 'word' | 'substring'; df: number; chunks: number; total_len: number }>(
    await db.execute(sql`with s as (select chunks, total_len from memory_index where workspace_id = ${workspaceId}),
      lex as (select distinct lexeme as term from unnest(to_tsvector('english', ${words.join(' ')})) ),
      terms as (select term, 'word' as kind from lex union all select t, 'substring' from unnest(${textArray(substrings)}) t)
      select t.term, t.kind,
        (case when t.kind = 'word'
          then (select count(*) from memory_chunks c where c.workspace_id = ${workspaceId} and c.tsv @@ to_tsquery('simple', t.term))
          else (select count(*) from memory_chunks c where c.workspace_id = ${workspaceId} and c.search_text ilike '%' || replace(replace(replace(t.term, '\\', '\\\\'), '%', '\\%'), '_', '\\_') || '%')
        end)::int as df,
        coalesce((select chunks from s), 0)::int as chunks, coalesce((select total_len from s), 0)::float8 as total_len
      from terms t`),
  );
  const n = Math.max(1, stats[0]?.chunks ?? 0);
  const avgLen = stats[0] && stats[0].chunks > 0 ? Number(stats[0].total_len) / stats[0].chunks : 1;
  const terms = stats.filter((s) => s.df > 0).map((s) => ({ term: s.term, kind: s.kind, df: s.df, idf: idf(n, s.df) }));
  const lex = terms.filter((t) => t.kind === 'word');
  const subs = terms.filter((t) => t.kind === 'substring');

  const filters: SQL[] = [];
  if (opts.path) filters.push(sql`c.path like ${`${likeEscape(opts.path)}%`}`);
  if (opts.since) filters.push(sql`c.day >= ${opts.since}::date`);
  if (opts.until) filters.push(sql`c.day <= ${opts.until}::date`);
  const where = filters.length ? sql` and ${sql.join(filters, sql` and `)}` : sql``;

  // 2. Candidates by BM25 in the database, with a score for each of the best ones' lines.
  let candidates: Candidate[] = [];
  if (terms.length) {
    const lexQuery = lex.length ? sql`c.tsv @@ to_tsquery('simple', ${lex.map((t) => t.term).join(' | ')})` : sql`false`;
    const subMatch = subs.length ? sql`c.search_text ilike any(${textArray(subs.map((t) => `%${likeEscape(t.term)}%`))})` : sql`false`;
    candidates = rowsOf<Candidate>(
      await db.execute(sql`with q(lex, idf) as (select * from unnest(${textArray(lex.map((t) => t.term))}, ${floatArray(lex.map((t) => t.idf))})),
        s(sub, idf) as (select * from unnest(${textArray(subs.map((t) => t.term))}, ${floatArray(subs.map((t) => t.idf))})),
        scored as (
          select c.id, c.path, c.start_line, c.end_line, c.heading, c.content, c.day::text as day, c.builtin,
            (select coalesce(sum(m.idf * m.tf * ${sql.raw(String(K1 + 1))} / (m.tf + ${sql.raw(String(K1))} * (1 - ${sql.raw(String(B))} + ${sql.raw(String(B))} * c.len / ${avgLen}::float8))), 0) from (
              select q.idf, array_length(u.positions, 1)::float8 as tf from unnest(c.tsv) u join q on q.lex = u.lexeme
              union all
              select s.idf, ((length(lower(c.search_text)) - length(replace(lower(c.search_text), s.sub, ''))) / length(s.sub))::float8 from s
            ) m where m.tf > 0)::float8 as bm25
          from memory_chunks c
          where c.workspace_id = ${workspaceId} and (${lexQuery} or ${subMatch})${where}
          order by bm25 desc, c.path, c.start_line
          limit ${depth})
        select scored.*, (
          select array_agg((
            (select coalesce(sum(q.idf), 0) from q where to_tsvector('english', l.line) @@ to_tsquery('simple', q.lex))
            + (select coalesce(sum(s.idf), 0) from s where strpos(lower(l.line), s.sub) > 0)
          )::float8 order by l.n)
          from unnest(string_to_array(scored.content, E'\\n')) with ordinality l(line, n)
        ) as line_scores
        from scored order by bm25 desc, path, start_line`),
    );
  }

  // 3. Vector neighbours, fused with the lexical list by reciprocal rank.
  const byId = new Map(candidates.map((c) => [String(c.id), { c, vector: null as number | null }]));
  const lexicalOrder = candidates.map((c) => String(c.id));
  let vectorOrder: string[] = [];
  if (opts.embedder) {
    const [qv] = await opts.embedder.embed([q]);
    const near = await nearest(db, workspaceId, qv!, depth, where);
    for (const v of near) {
      const hit = byId.get(String(v.c.id));
      if (hit) hit.vector = v.similarity;
      else byId.set(String(v.c.id), { c: v.c, vector: v.similarity });
    }
    vectorOrder = near.map((v) => String(v.c.id));
  }
  const fused = opts.embedder ? fuseRanks([lexicalOrder, vectorOrder]) : null;
  const now = opts.now ?? new Date();

  const ranked = [...byId.entries()].map(([id, { c, vector }]) => {
    const base = fused ? fused.get(id)! : Number(c.bm25);
    const recency = recencyFactor(c.day, now);
    const builtin = c.builtin ? BUILTIN_FACTOR : 1;
    return { id, c, vector, score: base * recency * builtin, recency, builtin };
  });
  ranked.sort((a, b) => b.score - a.score || a.c.path.localeCompare(b.c.path) || a.c.start_line - b.c.start_line);

  // 4. Snippets around the best lines; overlapping hits merged.
  const linesOf = new Map<string, Map<number, string>>();
  const hits: Hit<(typeof ranked)[number]>[] = ranked.map((r) => {
    const lines = r.c.content.split('\n');
    const file = linesOf.get(r.c.path) ?? new Map<number, string>();
    lines.forEach((l, i) => file.set(r.c.start_line + i, l));
    linesOf.set(r.c.path, file);
    const scores = (r.c.line_scores ?? []).map(Number);
    const { from, to } = snippetLines(lines, scores);
    return { path: r.c.path, from: r.c.start_line + from, to: r.c.start_line + to, score: r.score, extra: r };
  });
  const merged = mergeHits(hits);
  const page = merged.slice(offset, offset + opts.k);
  return {
    hasMore: merged.length > offset + opts.k,
    hits: page.map((h) => {
      const r = h.extra;
      const file = linesOf.get(h.path)!;
      const lines = Array.from({ length: h.to - h.from + 1 }, (_, i) => file.get(h.from + i) ?? '');
      const hit: SearchHit = {
        path: h.path,
        start_line: h.from,
        end_line: h.to,
        snippet: snippetText(lines, 0, lines.length - 1),
        score: Math.round(h.score * 10_000) / 10_000,
        date: r.c.day,
        heading: r.c.heading,
      };
      if (opts.debug) {
        const lexRank = lexicalOrder.indexOf(r.id);
        const vecRank = vectorOrder.indexOf(r.id);
        hit.debug = {
          bm25: Math.round(Number(r.c.bm25 ?? 0) * 10_000) / 10_000,
          lexical_rank: lexRank === -1 ? null : lexRank + 1,
          vector_similarity: r.vector === null ? null : Math.round(r.vector * 10_000) / 10_000,
          vector_rank: vecRank === -1 ? null : vecRank + 1,
          recency: Math.round(r.recency * 10_000) / 10_000,
          builtin: r.builtin,
          terms: terms.map((t) => ({ ...t, idf: Math.round(t.idf * 10_000) / 10_000 })),
          chunk: { start_line: r.c.start_line, end_line: r.c.end_line },
        };
      }
      return hit;
    }),
  };
}

/**
 * The chunks nearest to a query vector by cosine similarity: pgvector's `<=>` where the
 * database has the extension, else computed here over the stored vectors.
 */
async function nearest(db: Db, workspaceId: string, qv: number[], limit: number, where: SQL): Promise<{ c: Candidate; similarity: number }[]> {
  const cols = sql`c.id, c.path, c.start_line, c.end_line, c.heading, c.content, c.day::text as day, c.builtin, 0::float8 as bm25, null::float8[] as line_scores`;
  if (await hasPgvector(db)) {
    const vec = `[${qv.join(',')}]`;
    const rows = rowsOf<Candidate & { similarity: number }>(
      await db.execute(sql`select ${cols}, (1 - (c.embedding::vector <=> ${vec}::vector))::float8 as similarity
        from memory_chunks c where c.workspace_id = ${workspaceId} and c.embedding is not null${where}
        order by c.embedding::vector <=> ${vec}::vector limit ${limit}`),
    );
    return rows.map((r) => ({ c: r, similarity: Number(r.similarity) }));
  }
  const rows = rowsOf<Candidate & { embedding: number[] }>(
    await db.execute(sql`select ${cols}, c.embedding from memory_chunks c where c.workspace_id = ${workspaceId} and c.embedding is not null${where}`),
  );
  return rows
    .map((r) => ({ c: r, similarity: cosine(qv, r.embedding.map(Number)) }))
    .filter((r) => r.similarity > 0)
    .sort((a, b) => b.similarity - a.similarity)
    .slice(0, limit);
}

const vectorSupport = new WeakMap<Db, Promise<boolean>>();
/** Whether the database has pgvector installed (asked once per database handle). */
export function hasPgvector(db: Db): Promise<boolean> {
  let known = vectorSupport.get(db);
  if (!known) {
    known = db
      .execute(sql`select exists(select 1 from pg_extension where extname = 'vector') as ok`)
      .then((r) => Boolean(rowsOf<{ ok: boolean }>(r)[0]?.ok))
      .catch(() => false);
    vectorSupport.set(db, known);
  }
  return known;
}

/** What a cursor belongs to: the query and its filters (a cursor of another query is refused). */
const fingerprint = (q: string, f: { path?: string; since?: string; until?: string }) =>
  createHash('sha256').update(JSON.stringify([q, f.path ?? '', f.since ?? '', f.until ?? ''])).digest('base64url').slice(0, 12);

/** The opaque cursor of the page after `offset` hits. */
export function encodeCursor(offset: number, q: string, f: { path?: string; since?: string; until?: string }): string {
  return Buffer.from(JSON.stringify({ o: offset, f: fingerprint(q, f) })).toString('base64url');
}

/** The offset a cursor stands for; null when it is malformed or belongs to another query. */
export function decodeCursor(cursor: string, q: string, f: { path?: string; since?: string; until?: string }): number | null {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { o?: unknown; f?: unknown };
    if (!Number.isInteger(v.o) || (v.o as number) < 0 || (v.o as number) >= MAX_DEPTH || v.f !== fingerprint(q, f)) return null;
    return v.o as number;
  } catch {
    return null;
  }
}

/** A real calendar day written YYYY-MM-DD. */
export const isDay = (d: string) => /^\d{4}-\d{2}-\d{2}$/.test(d) && !Number.isNaN(Date.parse(`${d}T00:00:00Z`)) && new Date(`${d}T00:00:00Z`).toISOString().startsWith(d);

/** A path prefix inside a workspace: relative, no `..`, no control characters or backslashes. */
export const isPathPrefix = (p: string) => p.length > 0 && p.length <= 200 && !p.startsWith('/') && !p.split('/').includes('..') && !/[\x00-\x1f\x7f\\]/.test(p);

/** Why search filters given by a model are unusable, or null. */
export function filterProblem(f: { path?: string; since?: string; until?: string }): string | null {
  if (f.path !== undefined && !isPathPrefix(f.path)) return 'path must be a relative path prefix such as memory/ or knowledge/';
  for (const [name, d] of [['since', f.since], ['until', f.until]] as const) if (d !== undefined && !isDay(d)) return `${name} must be a date, YYYY-MM-DD`;
  if (f.since && f.until && f.since > f.until) return 'since must not be after until';
  return null;
}
