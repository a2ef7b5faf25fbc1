/**
 * The ranking model, as pure functions (the SQL in search.ts computes the same BM25 in the
 * database; these are its reference and the parts applied after it).
 */

/** BM25 parameters: term-frequency saturation and length normalisation. */
export const K1 = 1.2;
export const B = 0.75;
/** Recency is a tie-breaker: at most this much is added to a dated entry's score (today's). */
export const RECENCY_MAX = 0.1;
const RECENCY_HALF_LIFE_DAYS = 90;
/** Built-in skills rank below a user's own memory unless they match clearly better. */
export const BUILTIN_FACTOR = 0.5;
/** Reciprocal-rank fusion constant (the usual 60). */
const RRF_K = 60;
/**
 * What the vector list counts for in the fusion, against 1 for the words': a chunk near the
 * question in meaning but sharing none of its words lifts less than one that has them. With equal
 * weights, among 3k–10k chunks of unrelated logs (their small talk near every question) the
 * vectors took places the words had won; at a half, recall with the built-in encoder was 0.62
 * both without and with 3k such chunks (equal weights: 0.62 and 0.59; words alone: 0.56 and 0.58;
 * 0.3: 0.61 and 0.62; `KILN_EMBEDDINGS_MODEL=builtin npm run bench:recall`).
 */
export const VECTOR_WEIGHT = 0.5;
/**
 * The nearest chunks by meaning that are fused, at most, whatever the page's depth: past the
 * first few dozen the encoder's neighbours are small talk near every question, and each vote they
 * cast reorders the words' list at random. With k=50 (100 of each list) recall within 2,000
 * characters was 0.64 / 0.56 (generated / hand-written set); with 30 of them, 0.64 / 0.59 (20: 0.63
 * / 0.60; 10: 0.64 / 0.59), and reading the nearest vectors took 9 ms instead of 12 at 10k chunks
 * (p50; `npm run bench:recall`). Among 10k chunks of other people's logs recall was 0.59 against
 * 0.61–0.63. At the default k=8 a page ranks 30 of each list, as before.
 */
export const VECTOR_DEPTH = 30;

/** Robertson–Spärck Jones IDF, never negative: a term in every chunk still counts a little. */
export function idf(chunks: number, df: number): number {
  return Math.log(1 + (chunks - df + 0.5) / (df + 0.5));
}

/** The factor recency multiplies a score by: 1 for undated entries, up to 1 + RECENCY_MAX for today's. */
export function recencyFactor(day: string | null, now: Date): number {
  if (!day) return 1;
  const age = Math.max(0, (now.getTime() - Date.parse(`${day}T00:00:00Z`)) / 86_400_000);
  return 1 + RECENCY_MAX * 0.5 ** (age / RECENCY_HALF_LIFE_DAYS);
}

/** Weighted reciprocal-rank fusion of several best-first lists of ids (each list's weight, default 1). */
export function fuseRanks(lists: string[][], weights: number[] = []): Map<string, number> {
  const out = new Map<string, number>();
  for (const [l, list] of lists.entries()) {
    const w = weights[l] ?? 1;
    for (const [i, id] of list.entries()) out.set(id, (out.get(id) ?? 0) + w / (RRF_K + i + 1));
  }
  return out;
}

export interface Hit<T = unknown> {
  path: string;
  /** The snippet's first and last file line. */
  from: number;
  to: number;
  score: number;
  /** Set when a weaker hit's lines were merged into this one (its snippet may be MERGED_SNIPPET_CHARS long). */
  merged?: true;
  extra: T;
}

/** Longest span (in lines) two overlapping hits are merged into. */
const MERGE_MAX_LINES = 8;

/**
 * Best-first hits without repeats: a hit whose lines overlap or touch a better hit of the same
 * file is merged into it (the union of their lines, when at most MERGE_MAX_LINES lines and, with
 * `charsOf`, MERGED_SNIPPET_CHARS characters) or, when its lines are all inside the better one,
 * dropped. A union too long keeps the weaker hit apart, with only the lines the better one does
 * not show: every hit's lines are then shown whole by its snippet.
 */
export function mergeHits<T>(hits: Hit<T>[], charsOf?: (path: string, from: number, to: number) => number): Hit<T>[] {
  const kept: Hit<T>[] = [];
  for (const h of hits) {
    const near = kept.find((k) => k.path === h.path && h.from <= k.to + 1 && h.to >= k.from - 1);
    if (!near) {
      kept.push({ ...h });
      continue;
    }
    if (h.from >= near.from && h.to <= near.to) continue;
    const from = Math.min(near.from, h.from);
    const to = Math.max(near.to, h.to);
    if (to - from + 1 <= MERGE_MAX_LINES && (!charsOf || charsOf(h.path, from, to) <= MERGED_SNIPPET_CHARS)) {
      near.from = from;
      near.to = to;
      near.merged = true;
    } else if (h.to > near.to || h.from < near.from) {
      // Too long to merge: keep only the lines the better hit does not show.
      kept.push(h.from < near.from ? { ...h, to: near.from - 1 } : { ...h, from: near.to + 1 });
    }
  }
  return kept;
}

/** Most characters a snippet has. */
export const SNIPPET_CHARS = 320;
/** Most characters of a snippet two merged hits share (what they would have taken apart). */
export const MERGED_SNIPPET_CHARS = 2 * SNIPPET_CHARS;

/** A line that asks something: the turn after it is its answer. */
const ASKS = /\?\s*$/;

/**
 * The lines a snippet shows, around the best-matching line of a chunk (`scores[i]` for the
 * chunk's i-th line), while the snippet stays within SNIPPET_CHARS. Indexes into the chunk's lines.
 * In a conversation (`turns`: a log, one turn a line) the lines that complete that turn: the one
 * after it (the answer, or what was said next) and the one before it only when that one asks (the
 * question it answers); its other neighbour would take the room of another hit. In prose, both
 * neighbours.
 */
export function snippetLines(lines: string[], scores: number[], turns = false): { from: number; to: number } {
  let best = 0;
  for (let i = 1; i < lines.length; i++) if ((scores[i] ?? 0) > (scores[best] ?? 0)) best = i;
  let chars = lines[best]!.length;
  const neighbour = (dir: 1 | -1, when: (line: string) => boolean = () => true) => {
    let i = best + dir;
    while (i >= 0 && i < lines.length && !lines[i]!.trim()) i += dir;
    if (i < 0 || i >= lines.length || !when(lines[i]!) || chars + lines[i]!.length + 1 > SNIPPET_CHARS) return best;
    chars += lines[i]!.length + 1;
    return i;
  };
  const to = neighbour(1);
  const from = turns ? neighbour(-1, (l) => ASKS.test(l)) : neighbour(-1);
  return { from, to };
}

/**
 * The snippet of lines from..to (blank lines left out), at most `max` characters: whole lines
 * while they fit, and `to` becomes the last line shown, so a hit's line range never claims a line
 * its snippet does not show. Only a first line longer than `max` is cut.
 */
export function snippetText(
  lines: string[],
  from: number,
  to: number,
  max = SNIPPET_CHARS,
): { text: string; to: number } {
  const shown: string[] = [];
  let used = -1;
  let last = from;
  for (let i = from; i <= to; i++) {
    const l = lines[i]!;
    if (!l.trim()) continue;
    if (!shown.length && l.length > max) return { text: `${l.slice(0, max - 1)}…`, to: i };
    if (used + 1 + l.length > max) break;
    shown.push(l);
    used += 1 + l.length;
    last = i;
  }
  return { text: shown.join('\n'), to: last };
}
