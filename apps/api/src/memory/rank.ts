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
/**
 * What the words count for in the fused score, against 1 − WORDS_WEIGHT for the meaning (see
 * `fuseScores`). A rank throws away by how much a chunk won: a turn that says the answer in other
 * words is nearer the question by far than small talk is, and a fusion of ranks gave it no more
 * than the small talk's place. Recall within 2,000 characters (`npm run bench:recall`, k=50, the
 * built-in encoder, windows of two turns; generated / hand-written set): the ranks fused (the
 * words' at 1, the vectors' at 0.5, as before) 0.69 / 0.62; the scores, with the words at 0.1:
 * 0.75 / 0.62, 0.2: 0.77 / 0.67, 0.25: 0.76 / 0.67, 0.3: 0.75 / 0.66, 0.4: 0.77 / 0.64, 0.5:
 * 0.74 / 0.62, 0.8: 0.70 / 0.57. A quarter keeps a little more of the words, which find names and
 * identifiers the encoder does not know.
 */
export const WORDS_WEIGHT = 0.25;
/**
 * The nearest chunks by meaning a search reads, whatever the page's depth: past the first few
 * dozen the encoder's neighbours are small talk near every question. With the scores fused (the
 * similarity then scaled over every candidate, the words at 0.2): 15, 20, 30 and 40 gave 0.77 /
 * 0.67, 0.76 / 0.67, 0.77 / 0.68 and 0.77 / 0.68; 60 and 100, 0.73 / 0.64 and 0.72 / 0.64.
 */
export const VECTOR_DEPTH = 30;
/** The words' chunks whose similarity sets the meaning's scale with the VECTOR_DEPTH nearest (see `fuseScores`). */
export const SCALE_DEPTH = 30;

/** A candidate of the fusion: its BM25 (0 when no word of the query is in it) and cosine similarity (null: no vector). */
export interface Fusable {
  bm25: number;
  similarity: number | null;
}

/**
 * Convex fusion of the words' and the meaning's scores: WORDS_WEIGHT × BM25 / the best BM25, plus
 * (1 − WORDS_WEIGHT) × the similarity scaled so that, among `scale` (the best SCALE_DEPTH by words
 * and the VECTOR_DEPTH nearest), the least similar is 0 and the most 1. A chunk outside the scale
 * may score below 0 by meaning; one with no vector gets the scale's 0. The scale's members do not
 * depend on how deep a page ranks, so neither does any chunk's score, and pages agree.
 */
export function fuseScores<K>(items: Map<K, Fusable>, scale: readonly K[]): Map<K, number> {
  let best = 0;
  for (const it of items.values()) best = Math.max(best, it.bm25);
  let lo = Number.POSITIVE_INFINITY;
  let hi = Number.NEGATIVE_INFINITY;
  for (const k of scale) {
    const s = items.get(k)?.similarity;
    if (s === null || s === undefined) continue;
    lo = Math.min(lo, s);
    hi = Math.max(hi, s);
  }
  const span = hi > lo ? hi - lo : 1;
  const out = new Map<K, number>();
  for (const [k, it] of items) {
    const words = best > 0 ? it.bm25 / best : 0;
    const meaning = it.similarity === null || !Number.isFinite(lo) ? 0 : (it.similarity - lo) / span;
    out.set(k, WORDS_WEIGHT * words + (1 - WORDS_WEIGHT) * meaning);
  }
  return out;
}

/** The factor recency multiplies a score by: 1 for undated entries, up to 1 + RECENCY_MAX for today's. */
export function recencyFactor(day: string | null, now: Date): number {
  if (!day) return 1;
  const age = Math.max(0, (now.getTime() - Date.parse(`${day}T00:00:00Z`)) / 86_400_000);
  return 1 + RECENCY_MAX * 0.5 ** (age / RECENCY_HALF_LIFE_DAYS);
}

/**
 * A score with its adjustments (recency, built-in), each a factor above 1 to raise it, below 1 to
 * lower it. A fused score can be below 0 (a chunk less similar than the whole scale, `fuseScores`):
 * there the factor divides, so a recent entry still ranks above an old one of the same score, and a
 * built-in skill still below the workspace's own.
 */
export function adjusted(score: number, ...factors: number[]): number {
  let out = score;
  for (const f of factors) out = out >= 0 ? out * f : out / f;
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
