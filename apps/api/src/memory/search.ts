import { createHash } from 'node:crypto';
import { sql, type SQL } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { isLineFile } from './chunker.ts';
import { cosine, type Embedder, usableVector } from './embeddings.ts';
import { isDay, parseQuery } from './query.ts';
import {
  adjusted,
  B,
  BUILTIN_FACTOR,
  type Fusable,
  fuseScores,
  K1,
  MERGED_SNIPPET_CHARS,
  mergeHits,
  recencyFactor,
  SCALE_DEPTH,
  SNIPPET_CHARS,
  snippetLines,
  snippetText,
  type Hit,
  VECTOR_DEPTH,
} from './rank.ts';

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
interface ScoreParts {
  bm25: number;
  /** Rank in the lexical list (1 = best), null when only the vectors found it. */
  lexical_rank: number | null;
  vector_similarity: number | null;
  vector_rank: number | null;
  recency: number;
  builtin: number;
  terms: Term[];
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
  /** The query's vector, started by the caller with `startQueryVector` (used only with `embedder`). */
  queryVector?: QueryVector;
  now?: Date;
}

/** A query's vector being made: it never rejects, a failure is its value. */
export type QueryVector = Promise<{ v: number[] } | { err: unknown }>;

/** Starts making `q`'s vector with `e` (a failure is awaited by the search, never left unhandled). */
export function startQueryVector(e: Embedder, q: string): QueryVector {
  return (e.embedQuery ? e.embedQuery(q) : e.embed([q]).then(([v]) => v!))
    .then((v) => {
      // An endpoint's answer is not ours: a vector pgvector would refuse is a failed one.
      if (!usableVector(v)) throw new Error('the embeddings model gave no usable vector for the query');
      return v;
    })
    .then(
      (v) => ({ v }),
      (err: unknown) => ({ err }),
    );
}

export interface SearchPage {
  hits: SearchHit[];
  hasMore: boolean;
  /** Set when an embedder is configured but its vector for the query did not come in time or failed: the hits are by words alone. */
  vectors?: { missing: 'late' | 'failed'; err?: unknown };
}

/** How long a search waits for its query's vector once the words are ranked. */
const QUERY_VECTOR_WAIT_MS = 2_000;

/** The deepest a search pages: candidates ranked per query. */
export const MAX_DEPTH = 200;
/** Expected matches of the terms that make candidates (see the statement in `searchMemory`). */
const CANDIDATE_BUDGET = 400;
/** Most chunks ranked per query. */
const CANDIDATE_CAP = 600;
/** An identifier's document frequency is counted up to this. */
const SUBSTRING_DF_CAP = 5000;
/** Of a chunk, at most this much is read back for its snippet (a tenant's file may be one huge line). */
const CONTENT_CHARS = 16_384;
/** Of a line, at most this much is scored for the snippet. */
const LINE_CHARS = 2_000;

interface Term {
  term: string;
  /** A variant: another stem of the workspace's vocabulary in the same family as a query word's. */
  kind: 'word' | 'variant' | 'cjk' | 'substring';
  df: number;
  idf: number;
}

/**
 * Stem families: Snowball gives one word's forms different stems ("allergy" `allergi`, "allergic"
 * `allerg`; "photography" `photographi`, "photograph" `photograph`). A query word of
 * VARIANT_MIN_LEN letters or more also matches, at VARIANT_WEIGHT of its IDF, up to
 * VARIANTS_PER_WORD stems of the workspace's vocabulary that begin with it (less its last letter
 * when it is longer) and are at most VARIANT_MAX_EXTRA letters longer, nearest in length first.
 * The range on `term` lets the primary key's index find them; `starts_with` decides.
 */
const VARIANT_MIN_LEN = 5;
const VARIANT_MAX_EXTRA = 3;
const VARIANTS_PER_WORD = 3;
const VARIANT_WEIGHT = 0.5;

/**
 * A word in more than COMMON_SHARE of a workspace's chunks, and in more than COMMON_MIN_DF of them,
 * is common (a speaker's name in a chat log, a word of every line; judged by IDF, so a stem's
 * family, at half its weight, is common sooner): when the query's vector came, a chunk that holds only common
 * words of a query that has others is no match by words (it ranked by how often it said the name,
 * and took the places of what the vectors found). A query of common words alone matches as before;
 * a small workspace has none.
 */
const COMMON_SHARE = 0.2;
const COMMON_MIN_DF = 50;

/** The numbers migration 0024's `memory_words` ranks the words by. */
const WORDS_SETTINGS = JSON.stringify({
  variant_min_len: VARIANT_MIN_LEN,
  variant_max_extra: VARIANT_MAX_EXTRA,
  variants_per_word: VARIANTS_PER_WORD,
  variant_weight: VARIANT_WEIGHT,
  substring_df_cap: SUBSTRING_DF_CAP,
  candidate_budget: CANDIDATE_BUDGET,
  candidate_cap: CANDIDATE_CAP,
  common_share: COMMON_SHARE,
  common_min_df: COMMON_MIN_DF,
  k1: K1,
  b: B,
  content_chars: CONTENT_CHARS,
});

/** A number of our own, written into the statement. */
const raw = (v: number) => sql.raw(String(v));
const likeEscape = (t: string) => t.replace(/[\\%_]/g, (c) => `\\${c}`);
/** The LIKE pattern of a path prefix filter (its own `%` and `_` taken literally), or null for none. */
const pathLike = (path: string | undefined) => (path ? `${likeEscape(path)}%` : null);
const textArray = (xs: string[]) =>
  sql`${`{${xs.map((x) => `"${x.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(',')}}`}::text[]`;

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
  /** It holds a word of the query that is not common (COMMON_SHARE); null for the vectors' own. */
  rare?: boolean | null;
  /** Where the words' statement read it (`(page,item)`): its similarity is read there again. */
  ctid?: string;
}

/**
 * Ranks a workspace's memory, knowledge and skill chunks for a query.
 *
 * Lexical: BM25 in the database over English-stemmed full-text terms (stop words dropped), CJK
 * character pairs (indexed as terms) and identifiers (matched as substrings), with IDF from the
 * workspace's own statistics. With an embeddings model, the lexical list and the nearest chunks by cosine are
 * fused by score (rank.ts `fuseScores`). Then bounded adjustments: recency adds at most 10 % to a dated
 * entry, built-in skills count half. Snippets are the best-matching lines of each chunk and
 * their neighbours; hits that overlap in a file are merged.
 */
export async function searchMemory(db: Db, workspaceId: string, q: string, opts: SearchOptions): Promise<SearchPage> {
  const { words, cjk, substrings } = parseQuery(q);
  const offset = opts.offset ?? 0;
  if (!words.length && !cjk.length && !substrings.length) return { hits: [], hasMore: false };
  const depth = Math.min(MAX_DEPTH, Math.max(30, (offset + opts.k) * 2));

  // The query's vector is made (in the encoder's thread, or by the endpoint) while the database
  // ranks the words, unless the caller started it already.
  const queryVector = opts.embedder && (opts.queryVector ?? startQueryVector(opts.embedder, q));

  // 1. The query's terms (words stemmed with stop words dropped, CJK pairs, identifiers) with
  // their document frequencies (kept by triggers; identifiers counted, bounded) and IDF; 2. the
  // candidates: the chunks holding the more selective terms, rarest first, up to CANDIDATE_BUDGET
  // expected matches (the rarest term always), and every identifier; BM25 with each chunk's term
  // frequencies. Both in migration 0024's function, one statement whose plans the database keeps.
  const patterns = substrings.map((t) => `%${likeEscape(t)}%`);
  const [found] = rowsOf<{ avg_len: number; terms: string; candidates: string }>(
    await db.execute(sql`select avg_len, terms, candidates from memory_words(${workspaceId}, ${words.join(' ')},
      ${textArray(cjk)}, ${textArray(substrings)}, ${textArray(patterns)}, ${pathLike(opts.path)}::text,
      ${opts.since ?? null}::date, ${opts.until ?? null}::date, ${depth}::int, ${WORDS_SETTINGS}::jsonb)`),
  );
  const avgLen = Number(found?.avg_len ?? 1);
  const termRows = JSON.parse(found?.terms ?? '[]') as [string, Term['kind'], number, number, boolean][];
  const terms: Term[] = termRows.map(([term, kind, df, idf]) => ({ term, kind, df, idf }));
  // A term is common when it is in more than COMMON_SHARE of the chunks (and COMMON_MIN_DF); of
  // the best, those that hold only common words are dropped below when the query has others.
  const common = termRows.map((t) => t[4]);
  const someRare = common.includes(false);
  let candidates = unpackCandidates(found?.candidates);

  // 3. Vector neighbours, and every candidate's similarity: both scores fused.
  let vectorOrder: string[] = [];
  let vectors: SearchPage['vectors'];
  // The words' ranking is done: the query's vector gets QUERY_VECTOR_WAIT_MS more, else (or when
  // it failed: the encoder's thread lost, the endpoint down) the search answers by words alone.
  let timer: NodeJS.Timeout | undefined;
  const qv =
    queryVector &&
    (await Promise.race([
      queryVector,
      new Promise<{ late: true }>((resolve) => {
        timer = setTimeout(() => resolve({ late: true }), QUERY_VECTOR_WAIT_MS);
      }),
    ]));
  clearTimeout(timer);
  // With the vectors' list to fuse, the words' chunks that hold only common words give their
  // places to it; by words alone they are the only guesses there are, and stay.
  if (qv && 'v' in qv && someRare) candidates = candidates.filter((c) => c.rare);
  const byId = new Map<string, { c: Candidate; vector: number | null }>(
    candidates.map((c) => [String(c.id), { c, vector: null }]),
  );
  const lexicalOrder = candidates.map((c) => String(c.id));
  if (qv && 'late' in qv) vectors = { missing: 'late' };
  else if (qv && 'err' in qv) vectors = { missing: 'failed', err: qv.err };
  else if (qv) {
    // The nearest chunks, and how near each of the words' candidates is: both scores for every chunk.
    const { near, similarity } = await nearest(
      db,
      workspaceId,
      qv.v,
      VECTOR_DEPTH,
      opts,
      candidates,
      terms.map((t) => t.term),
    );
    for (const [id, s] of similarity) {
      const hit = byId.get(String(id));
      if (hit) hit.vector = s;
    }
    for (const v of near) {
      const hit = byId.get(String(v.c.id));
      if (hit) {
        hit.vector = v.similarity;
        continue;
      }
      // Found by meaning, past the words' list: its words still count, as the database counts them
      // (none when it holds only common ones, as for the words' own).
      const w = wordsScore(v.words, terms, common, avgLen);
      byId.set(String(v.c.id), { c: { ...v.c, bm25: someRare && !w.rare ? 0 : w.bm25 }, vector: v.similarity });
    }
    vectorOrder = near.map((v) => String(v.c.id));
  }
  const fused =
    qv && 'v' in qv
      ? fuseScores(
          new Map<string, Fusable>(
            [...byId].map(([id, { c, vector }]) => [id, { bm25: Number(c.bm25 ?? 0), similarity: vector }]),
          ),
          [...lexicalOrder.slice(0, SCALE_DEPTH), ...vectorOrder],
        )
      : null;
  const now = opts.now ?? new Date();

  const ranked = [...byId.entries()].map(([id, { c, vector }]) => {
    const base = fused ? fused.get(id)! : Number(c.bm25);
    const recency = recencyFactor(c.day, now);
    const builtin = c.builtin ? BUILTIN_FACTOR : 1;
    return { id, c, vector, score: adjusted(base, recency, builtin), recency, builtin };
  });
  ranked.sort((a, b) => b.score - a.score || a.c.path.localeCompare(b.c.path) || a.c.start_line - b.c.start_line);

  // 4. Snippets around the best lines; overlapping hits merged.
  const linesOf = new Map<string, Map<number, string>>();
  const hits: Hit<(typeof ranked)[number]>[] = ranked.map((r) => {
    const lines = r.c.content.split('\n');
    const file = linesOf.get(r.c.path) ?? new Map<number, string>();
    for (const [i, l] of lines.entries()) file.set(r.c.start_line + i, l);
    linesOf.set(r.c.path, file);
    const scores = lines.map((l) => lineScore(l, terms));
    const { from, to } = snippetLines(lines, scores, isLineFile(r.c.path));
    return { path: r.c.path, from: r.c.start_line + from, to: r.c.start_line + to, score: r.score, extra: r };
  });
  const merged = mergeHits(hits, (path, from, to) => {
    const file = linesOf.get(path)!;
    let chars = 0;
    for (let i = from; i <= to; i++) chars += (file.get(i)?.length ?? 0) + 1;
    return chars - 1;
  });
  const page = merged.slice(offset, offset + opts.k);
  return {
    ...(vectors ? { vectors } : {}),
    hasMore: merged.length > offset + opts.k,
    hits: page.map((h) => {
      const r = h.extra;
      const file = linesOf.get(h.path)!;
      const lines = Array.from({ length: h.to - h.from + 1 }, (_, i) => file.get(h.from + i) ?? '');
      const shown = snippetText(lines, 0, lines.length - 1, h.merged ? MERGED_SNIPPET_CHARS : SNIPPET_CHARS);
      const hit: SearchHit = {
        path: h.path,
        start_line: h.from,
        end_line: h.from + shown.to,
        snippet: shown.text,
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
 * The words' statement answers its candidates as one JSON array of arrays: the embedded
 * database's answer costs ~10 µs a column of each row to read, and a hundred rows of eleven took
 * ~1 ms more than the same values as one text.
 */
function unpackCandidates(packed: string | undefined): Candidate[] {
  return (JSON.parse(packed ?? '[]') as [...ChunkColumns, number, boolean | null, string][]).map((r) => ({
    ...chunkOf(r),
    bm25: r[8],
    rare: r[9],
    ctid: r[10],
  }));
}

/** A chunk's columns as both packed statements give them first, in this order. */
type ChunkColumns = [number, string, number, number, string | null, string, string | null, boolean];
const chunkOf = ([id, path, start_line, end_line, heading, content, day, builtin]:
  | ChunkColumns
  | [...ChunkColumns, ...unknown[]]) => ({
  id,
  path,
  start_line,
  end_line,
  heading,
  content,
  day,
  builtin,
});

/**
 * How well one line of a chunk matches (the IDF of the query terms it holds), to choose the
 * snippet's lines. A word term is a Snowball stem: it matches the line's words it begins
 * ("adopt" in "adopted"; "citi" in "cities" and, with y for a final i, "city").
 */
export function lineScore(line: string, terms: { term: string; kind: string; idf: number }[]): number {
  const lower = line.slice(0, LINE_CHARS).toLowerCase();
  let words: string[] | null = null;
  let score = 0;
  for (const t of terms) {
    if (t.kind === 'cjk' || t.kind === 'substring') {
      if (lower.includes(t.term)) score += t.idf;
      continue;
    }
    words ??= lower.match(/[\p{L}\p{N}]+/gu) ?? [];
    const alt = t.term.endsWith('i') ? `${t.term.slice(0, -1)}y` : null;
    if (words.some((w) => w.startsWith(t.term) || (alt !== null && w.startsWith(alt)))) score += t.idf;
  }
  return score;
}

/** What BM25 reads of a chunk: its terms' frequencies, its length in words and its searched text (cut). */
interface ChunkWords {
  tf: Record<string, number> | string;
  len: number;
  search_text: string;
}

/** A chunk found by meaning, with what its words' score is made of. */
interface Near {
  c: Candidate;
  similarity: number;
  words: ChunkWords;
}

const toNear = ({ tf, len, search_text, ...c }: Omit<Candidate, 'bm25'> & ChunkWords, similarity: number): Near => ({
  c: { ...c, bm25: 0 },
  similarity,
  words: { tf, len, search_text },
});

/**
 * A chunk's BM25 for the query's terms, as the candidates' statement computes it in the database
 * (a term's frequency from the chunk's `tf`; an identifier's, its occurrences in the searched
 * text), and whether it holds a word that is not common.
 */
function wordsScore(
  w: ChunkWords,
  terms: readonly Term[],
  common: readonly boolean[],
  avgLen: number,
): { bm25: number; rare: boolean } {
  const tfs = (typeof w.tf === 'string' ? JSON.parse(w.tf) : w.tf) as Record<string, number>;
  const text = w.search_text.toLowerCase();
  let bm25 = 0;
  let rare = false;
  for (const [i, t] of terms.entries()) {
    const tf = t.kind === 'substring' ? text.split(t.term).length - 1 : Number(tfs[t.term] ?? 0);
    if (!(tf > 0)) continue;
    bm25 += (t.idf * tf * (K1 + 1)) / (tf + K1 * (1 - B + (B * Number(w.len)) / avgLen));
    if (!common[i]) rare = true;
  }
  return { bm25, rare };
}

/** The search's filters as SQL on `memory_chunks c` (empty, or starting with ` and`). */
function filtersOf(f: { path?: string; since?: string; until?: string }): SQL {
  const filters: SQL[] = [];
  if (f.path) filters.push(sql`c.path like ${pathLike(f.path)}`);
  if (f.since) filters.push(sql`c.day >= ${f.since}::date`);
  if (f.until) filters.push(sql`c.day <= ${f.until}::date`);
  return filters.length ? sql` and ${sql.join(filters, sql` and `)}` : sql``;
}

/**
 * The chunks nearest to a query vector by cosine similarity (at most `limit`, within the filters),
 * and the similarity of the chunks `of` (the words' candidates: their ids and, for pgvector, the
 * addresses the words' statement read them at; those with a vector of the query's size), in one
 * statement: pgvector's `<=>` where the database has the extension, else computed here over the
 * stored vectors. Vectors of another size (made by an earlier model, before the re-index) are left
 * out. Of a nearest chunk's term frequencies only the query's `terms` come back: a tenant's file
 * can give a chunk thousands, and they would be parsed on the API's event loop.
 */
export async function nearest(
  db: Db,
  workspaceId: string,
  qv: number[],
  limit: number,
  f: { path?: string; since?: string; until?: string },
  of: readonly { id: number; ctid?: string }[],
  terms: readonly string[],
): Promise<{ near: Near[]; similarity: Map<number, number> }> {
  const cols = sql`c.id, c.path, c.start_line, c.end_line, c.heading, left(c.content, ${raw(CONTENT_CHARS)}) as content, c.day::text as day, c.builtin`;
  const termList = textArray([...terms]);
  const tfOf = (tf: SQL) =>
    sql`(select coalesce(jsonb_object_agg(k, ${tf} -> k), '{}'::jsonb) from unnest(${termList}) k where ${tf} ? k)`;
  const words = sql`${tfOf(sql`c.tf`)} as tf, c.len, left(c.search_text, ${raw(CONTENT_CHARS)}) as search_text`;
  const where = filtersOf(f);
  // Read again where the words' statement found them: a row's address takes no index. A row changed
  // since (re-indexed) is not there any more and gets no similarity, as a chunk with no vector; an
  // address another row of the workspace has taken since gives that row's, kept only when it is
  // a candidate too (it is its own similarity).
  const tids = sql`${`{${of.flatMap((c) => (c.ctid && /^\(\d+,\d+\)$/.test(c.ctid) ? [`"${c.ctid}"`] : [])).join(',')}}`}::tid[]`;
  const pgvector = await pgvectorOf(db);
  if (pgvector) {
    const vec = queryVectorParam(qv);
    // One row: the nearest chunks as one JSON array of arrays, and the candidates' similarities as
    // one text ("id similarity id similarity …"): the embedded database's answer costs ~10 µs a
    // column of each row to read, and thirty rows of twelve or a hundred of two took ~1 ms more.
    const packed = (nearRows: SQL, v: SQL) => sql`select
      (select json_agg(json_build_array(n.id, n.path, n.start_line, n.end_line, n.heading, n.content, n.day, n.builtin, n.tf,
        n.len, n.search_text, n.similarity)) from (${nearRows}) n)::text as near,
      (select string_agg(c.id || ' ' || (1 - (c.embedding::vector <=> ${v}))::float8, ' ') from memory_chunks c
        where c.ctid = any(${tids}) and c.workspace_id = ${workspaceId} and array_length(c.embedding, 1) = ${qv.length}::int) as similarities`;
    if (qv.length === INDEX_DIMS && pgvector.nearest) {
      // Migration 0022's function (0023's columns): the HNSW index of 0017 read on past the rows the
      // filters drop (pgvector 0.8's iterative scan, in relaxed order), in one statement.
      return unpackNear(
        await db.execute(sql`with q as materialized (select ${vec}::int[]::vector(512) as v)
          ${packed(
            sql`select n.id, n.path, n.start_line, n.end_line, n.heading, n.content, n.day, n.builtin, ${tfOf(sql`n.tf`)} as tf,
              n.len, n.search_text, n.similarity
            from q cross join lateral memory_nearest_512(${workspaceId}, q.v, ${limit}::int,
              ${pathLike(f.path)}::text, ${f.since ?? null}::date, ${f.until ?? null}::date, ${raw(CONTENT_CHARS)}) n`,
            sql`(select v from q)`,
          )}`),
      );
    }
    return unpackNear(
      await db.execute(
        packed(
          sql`select ${cols}, ${words}, (1 - (c.embedding::vector <=> ${vec}::int[]::vector))::float8 as similarity
            from memory_chunks c where c.workspace_id = ${workspaceId} and array_length(c.embedding, 1) = ${qv.length}::int${where}
            order by c.embedding::vector <=> ${vec}::int[]::vector limit ${limit}`,
          sql`${vec}::int[]::vector`,
        ),
      ),
    );
  }
  const wanted = new Set(of.map((c) => c.id));
  // Every vector within the filters is compared (the candidates are within them too); only the
  // nearest are read whole.
  const vectors = rowsOf<{ id: number; embedding: number[] }>(
    await db.execute(
      sql`select c.id, c.embedding from memory_chunks c
        where c.workspace_id = ${workspaceId} and array_length(c.embedding, 1) = ${qv.length}::int${where}`,
    ),
  );
  const similarity = new Map<number, number>();
  const scores: { id: number; similarity: number }[] = [];
  for (const { id, embedding } of vectors) {
    const s = cosine(qv, embedding.map(Number));
    if (wanted.has(Number(id))) similarity.set(Number(id), s);
    if (s > 0) scores.push({ id: Number(id), similarity: s });
  }
  const top = scores.sort((a, b) => b.similarity - a.similarity).slice(0, limit);
  if (!top.length) return { near: [], similarity };
  const rows = new Map(
    rowsOf<Omit<Candidate, 'bm25'> & ChunkWords>(
      await db.execute(
        sql`select ${cols}, ${words} from memory_chunks c where c.id = any(${`{${top.map((t) => t.id).join(',')}}`}::int[])`,
      ),
    ).map((r) => [Number(r.id), r]),
  );
  const near = top.flatMap(({ id, similarity: s }) => {
    const r = rows.get(id);
    return r ? [toNear(r, s)] : []; // gone: removed between the two reads
  });
  return { near, similarity };
}

/** The nearest chunks' statement's one row (`nearest`), read: the nearest first (JSON keeps no order of the rows). */
function unpackNear(result: unknown): { near: Near[]; similarity: Map<number, number> } {
  const row = rowsOf<{ near: string | null; similarities: string | null }>(result)[0];
  const near = (JSON.parse(row?.near ?? '[]') as [...ChunkColumns, Record<string, number>, number, string, number][])
    .map((r) => toNear({ ...chunkOf(r), tf: r[8], len: r[9], search_text: r[10] }, Number(r[11])))
    .sort((a, b) => b.similarity - a.similarity || Number(a.c.id) - Number(b.c.id));
  const similarity = new Map<number, number>();
  const pairs = row?.similarities ? row.similarities.split(' ') : [];
  for (let i = 0; i + 1 < pairs.length; i += 2) similarity.set(Number(pairs[i]), Number(pairs[i + 1]));
  return { near, similarity };
}

/**
 * A query vector as the database reads it fastest: whole numbers, an `int[]` cast to `vector`.
 * Parsing 512 decimal fractions took ~0.8 ms of every search on the embedded database (its C
 * library's float parser, in WebAssembly); 512 integers take ~0.1 ms. The vector is scaled so its
 * largest component is 2^23: every integer is exact in single precision and within int4, and each
 * component keeps its value to 1 part in 2^24 of the largest. Cosine distance does not see the
 * scale, so the order and the similarities are the exact vector's to ~1e-7.
 */
export function queryVectorParam(v: number[]): string {
  const largest = v.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
  const scale = largest > 0 ? 2 ** 23 / largest : 1;
  return `{${v.map((x) => Math.round(x * scale)).join(',')}}`;
}

/** The vector size migration 0017 indexes (the built-in encoder's). */
const INDEX_DIMS = 512;

const vectorSupport = new WeakMap<Db, Promise<{ nearest: boolean } | null>>();
/**
 * The database's pgvector, or null when it is not installed, and whether migration 0022 made the
 * nearest-vectors function (it does where pgvector 0.8 or later was there at the migration: an
 * older one's index scan could return fewer neighbours than asked once the filters drop rows, so
 * the vectors are compared exactly instead). Asked once per database handle.
 */
function pgvectorOf(db: Db): Promise<{ nearest: boolean } | null> {
  let known = vectorSupport.get(db);
  if (!known) {
    known = db
      .execute(
        sql`select to_regprocedure('memory_nearest_512(text,vector,integer,text,date,date,integer)') is not null as nearest
          from pg_extension where extname = 'vector'`,
      )
      .then((r) => {
        const row = rowsOf<{ nearest: boolean }>(r)[0];
        return row ? { nearest: row.nearest === true } : null;
      })
      .catch(() => null);
    vectorSupport.set(db, known);
  }
  return known;
}

/** Whether the database has pgvector installed. */
export async function hasPgvector(db: Db): Promise<boolean> {
  return (await pgvectorOf(db)) !== null;
}

/** What a cursor belongs to: the query and its filters (a cursor of another query is refused). */
const fingerprint = (q: string, f: { path?: string; since?: string; until?: string }) =>
  createHash('sha256')
    .update(JSON.stringify([q, f.path ?? '', f.since ?? '', f.until ?? '']))
    .digest('base64url')
    .slice(0, 12);

/** The opaque cursor of the page after `offset` hits. */
export function encodeCursor(offset: number, q: string, f: { path?: string; since?: string; until?: string }): string {
  return Buffer.from(JSON.stringify({ o: offset, f: fingerprint(q, f) })).toString('base64url');
}

/** The offset a cursor stands for; null when it is malformed or belongs to another query. */
export function decodeCursor(
  cursor: string,
  q: string,
  f: { path?: string; since?: string; until?: string },
): number | null {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { o?: unknown; f?: unknown };
    if (!Number.isInteger(v.o) || (v.o as number) < 0 || (v.o as number) >= MAX_DEPTH || v.f !== fingerprint(q, f))
      return null;
    return v.o as number;
  } catch {
    return null;
  }
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const NOT_IN_PREFIX = /[\x00-\x1f\x7f\\]/;

/** A path prefix inside a workspace: relative, no `..`, no control characters or backslashes. */
export const isPathPrefix = (p: string) =>
  p.length > 0 && p.length <= 200 && !p.startsWith('/') && !p.split('/').includes('..') && !NOT_IN_PREFIX.test(p);

/** Why search filters given by a model are unusable, or null. */
export function filterProblem(f: { path?: string; since?: string; until?: string }): string | null {
  if (f.path !== undefined && !isPathPrefix(f.path))
    return 'path must be a relative path prefix such as memory/ or knowledge/';
  for (const [name, d] of [
    ['since', f.since],
    ['until', f.until],
  ] as const)
    if (d !== undefined && !isDay(d)) return `${name} must be a date, YYYY-MM-DD`;
  if (f.since && f.until && f.since > f.until) return 'since must not be after until';
  return null;
}
