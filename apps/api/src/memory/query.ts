/**
 * How a search query (and an indexed chunk) is cut into terms. Plain words go to Postgres full
 * text search, which stems them and drops English stop words. What that parser cannot match is
 * searched as a substring instead: identifiers (`load_config`, `parseConfigFile`, `v2.3.1`) as a
 * whole. CJK text is indexed and searched as overlapping character pairs (the way CJK search
 * engines index text without spaces). The parts of an identifier are searched as words too.
 */

/** Han, Hiragana, Katakana and Hangul: scripts written without spaces between words. */
const CJK = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u;
const CJK_RUN = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]+/gu;
/** A token: letters, digits and the joiners an identifier or a version may contain. */
const TOKEN = /[\p{L}\p{N}_]+(?:[.\-/:][\p{L}\p{N}_]+)*/gu;
const WORD = /[\p{L}\p{N}]+/gu;

const MAX_WORDS = 16;
const MAX_SUBSTRINGS = 12;

export interface QueryTerms {
  /** Words for full-text search (lower-cased; Postgres stems them and drops stop words). */
  words: string[];
  /** CJK character pairs, indexed as words of their own (see `cjkTerms`). */
  cjk: string[];
  /** Lower-cased identifiers, searched as substrings (a trigram index serves them). */
  substrings: string[];
}

/** An identifier: something with an underscore, a dot or dash between parts, mixed case or letters with digits. */
function isIdentifier(token: string): boolean {
  return /[_.\-/:]/.test(token) || /\p{Ll}\p{Lu}/u.test(token) || (/\p{L}/u.test(token) && /\p{N}/u.test(token));
}

/** CJK character pairs of a run (a single character on its own). */
export function cjkPairs(run: string): string[] {
  const chars = [...run];
  if (chars.length === 1) return chars;
  return chars.slice(0, -1).map((c, i) => c + chars[i + 1]!);
}

export function parseQuery(q: string): QueryTerms {
  const words: string[] = [];
  const cjk: string[] = [];
  const substrings: string[] = [];
  const addWord = (w: string) => words.includes(w) || words.push(w);
  const addSub = (s: string) => substrings.includes(s) || substrings.push(s);
  for (const run of q.match(CJK_RUN) ?? []) for (const p of cjkPairs(run)) if (!cjk.includes(p)) cjk.push(p);
  const rest = q.replace(CJK_RUN, ' ');
  for (const token of rest.match(TOKEN) ?? []) {
    if (isIdentifier(token) && [...token].length >= 3) addSub(token.toLowerCase());
    for (const w of token.match(WORD) ?? []) if (!CJK.test(w)) addWord(w.toLowerCase());
  }
  return {
    words: words.slice(0, MAX_WORDS),
    cjk: cjk.slice(0, MAX_SUBSTRINGS),
    substrings: substrings.slice(0, MAX_SUBSTRINGS),
  };
}

/**
 * The CJK character pairs of a text, space-separated: indexed next to the text, so that CJK
 * search is an index lookup of exact terms rather than a scan (the parser keeps a CJK run whole).
 */
export function cjkTerms(text: string): string {
  const out = new Set<string>();
  for (const run of text.match(CJK_RUN) ?? []) for (const p of cjkPairs(run)) out.add(p);
  return [...out].join(' ');
}

/** A chunk's length in words for BM25's length normalisation (each CJK character counts as one). */
export function wordCount(text: string): number {
  let n = 0;
  for (const run of text.match(CJK_RUN) ?? []) n += [...run].length;
  n += (text.replace(CJK_RUN, ' ').match(WORD) ?? []).length;
  return n;
}

/** A real calendar day written YYYY-MM-DD (not 2023-02-29). */
export function isDay(d: string): boolean {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(d)) return false;
  const t = Date.parse(`${d}T00:00:00Z`);
  return Number.isFinite(t) && new Date(t).toISOString().startsWith(d);
}
