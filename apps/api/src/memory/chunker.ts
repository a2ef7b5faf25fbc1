import { cjkTerms, isDay, wordCount } from './query.ts';

/**
 * How files are cut for search, and its version: change either and bump INDEX_VERSION, so the
 * start-up job re-indexes every workspace (see indexer.ts `reindexStale`).
 */
export const INDEX_VERSION = 3;

export interface Chunk {
  /** 1-based, inclusive: the file lines the chunk spans. */
  startLine: number;
  endLine: number;
  heading: string | null;
  /** The file's lines startLine..endLine as they are (snippets are cut from these). */
  content: string;
  /** What is searched: the heading and the chunk's lines that are not template boilerplate. */
  searchText: string;
  /** The CJK character pairs of `searchText` (indexed with it). */
  cjk: string;
  /** Length of `searchText` in words. */
  len: number;
  /** The date of a dated log (`memory/…/YYYY-MM-DD….md`), else null. */
  day: string | null;
  /** Part of a built-in skill (ranked below a user's own memory of the same relevance). */
  builtin: boolean;
}

/**
 * Window sizes, in non-blank lines. Logs and core memory hold one fact or turn per line. With
 * vectors, windows of two lines, one apart: every turn is in one window with the turn before it and
 * in one with the turn after it (a question with its answer, an answer with its question), and a
 * window's vector is of those two turns, not diluted by four. By words alone, windows of four, two
 * apart: a question's words and its answer's are then more often in one window. Recall within 2,000
 * characters (`npm run bench:recall`, generated / hand-written set): with the built-in encoder,
 * windows of four 0.67 / 0.60, of two 0.69 / 0.62 (the ranks fused as they were then); with the
 * scores fused (rank.ts), two 0.77 / 0.68, three 0.74 / 0.63, one 0.66 / 0.58. By words alone
 * (`KILN_EMBEDDINGS_MODEL=none`), four 0.59 / 0.53, two 0.56 / 0.47. The index records the model it
 * was made with and is made again when it changes. Knowledge pages and skills are prose: larger
 * windows, a third overlapping.
 */
export const WINDOWS = {
  lines: { size: 2, step: 1 },
  linesByWords: { size: 4, step: 2 },
  prose: { size: 12, step: 8 },
} as const;

const DATED = /(?:^|\/)(\d{4}-\d{2}-\d{2})[^/]*\.md$/;

/** The date a log's file name carries, when it is a real date. */
export function dayOfPath(path: string): string | null {
  if (!path.startsWith('memory/')) return null;
  const d = DATED.exec(path)?.[1];
  return d && isDay(d) ? d : null;
}

export const isBuiltin = (path: string) => path.startsWith('skills/builtin/');

/** Paths whose content feeds the memory search index. */
export function isIndexed(path: string): boolean {
  return path.endsWith('.md') && (path === 'MEMORY.md' || /^(memory|knowledge|skills)\//.test(path));
}
const modeOf = (path: string) => (path === 'MEMORY.md' || path.startsWith('memory/') ? 'lines' : 'prose');
/** A file of one fact or turn a line (a log, core memory), not prose. */
export const isLineFile = (path: string) => modeOf(path) === 'lines';

/** The lines of the workspace template that say nothing about the user (headers, instructions). */
export function boilerplateLines(templateTexts: string[]): Set<string> {
  const out = new Set<string>();
  for (const text of templateTexts) for (const l of text.split('\n')) if (l.trim().length >= 3) out.add(l.trim());
  return out;
}

const HEADING = /^#{1,6}\s+(.*)$/;
const FENCE = /^(```|~~~)/;

/**
 * Cuts a Markdown file into overlapping windows within its sections (a heading starts a
 * section; headings inside code fences do not). Line numbers are 1-based and exact. Front
 * matter stays with the first window (it holds a skill's name and description). Lines equal to
 * a line of the template (`boilerplate`) are shown but not searched; built-in skills are
 * searched whole.
 */
export function chunkFile(
  path: string,
  text: string,
  boilerplate: ReadonlySet<string> = new Set(),
  /** False when the index has no vectors (`KILN_EMBEDDINGS_MODEL=none`): logs get the wider windows. */
  withVectors = true,
): Chunk[] {
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  const builtin = isBuiltin(path);
  const day = dayOfPath(path);
  const mode = modeOf(path);
  const { size, step } = WINDOWS[mode === 'lines' && !withVectors ? 'linesByWords' : mode];
  const isBoilerplate = (l: string) => !builtin && boilerplate.has(l.trim());
  const chunks: Chunk[] = [];

  // Sections: the heading and the indexes of its non-blank, non-heading lines.
  const sections: { heading: string | null; headingSearched: boolean; lines: number[] }[] = [
    { heading: null, headingSearched: false, lines: [] },
  ];
  let inFence = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    if (FENCE.test(line)) inFence = !inFence;
    // A CRLF file's lines end in \r, which `.` and `$` do not match.
    const h = !inFence && HEADING.exec(line.endsWith('\r') ? line.slice(0, -1) : line);
    if (h) {
      sections.push({ heading: h[1]!.trim(), headingSearched: !isBoilerplate(line), lines: [] });
      continue;
    }
    if (line.trim()) sections.at(-1)!.lines.push(i);
  }

  for (const s of sections) {
    if (!s.lines.length) continue;
    const starts: number[] = [];
    for (let at = 0; ; at += step) {
      if (at + size >= s.lines.length) {
        starts.push(Math.max(0, s.lines.length - size));
        break;
      }
      starts.push(at);
    }
    for (const at of [...new Set(starts)]) {
      const idx = s.lines.slice(at, at + size);
      const first = idx[0]!;
      const last = idx.at(-1)!;
      const searched = idx.map((i) => lines[i]!).filter((l) => !isBoilerplate(l));
      if (!searched.length) continue;
      const searchText = [s.heading && s.headingSearched ? s.heading : '', ...searched].filter(Boolean).join('\n');
      chunks.push({
        startLine: first + 1,
        endLine: last + 1,
        heading: s.heading,
        content: lines.slice(first, last + 1).join('\n'),
        searchText,
        cjk: cjkTerms(searchText),
        len: Math.max(1, wordCount(searchText)),
        day,
        builtin,
      });
    }
  }
  return chunks;
}

/** What the model is asked for when it writes a daily log (condensation, dream): a shape search finds. */
export const LOG_LINE_RULES = `One line per fact or turn, each a "- " bullet that stands on its own: name who and what
(no "he", "it", "the above"), say what was asked, done, decided or found, with the time (HH:MM) when
known; copy names, paths, numbers and identifiers verbatim. No paragraphs, no nested bullets.`;

/**
 * A model's daily-log text in the shape search indexes best: every line a "- " bullet of its
 * own (paragraphs split at line breaks, nested bullets flattened), headings kept, blank lines dropped.
 */
export function toLogLines(text: string): string {
  const out: string[] = [];
  let inFence = false;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    const fence = FENCE.test(line);
    if (fence) inFence = !inFence;
    if (fence || inFence || HEADING.test(line) || line.startsWith('<!--')) out.push(raw.trimEnd());
    else out.push(`- ${line.replace(/^(?:[-*+]|\d+[.)])\s+/, '')}`);
  }
  return out.join('\n');
}
