import { h, type Child } from './dom.ts';

/** One file's part of a unified diff (`git show --patch`). */
interface FileDiff {
  /** The path after the change (before it, for a deleted file). */
  path: string;
  lines: string[];
  added: number;
  removed: number;
  binary: boolean;
}

/** A file's lines beyond this many are folded behind a button. */
const FOLD_AT = 200;
/** Files past this many start closed. */
const OPEN_FILES = 20;

const unquote = (p: string) => (p.startsWith('"') ? p.slice(1, -1) : p);
const strip = (p: string) => unquote(p).replace(/^[ab]\//, '');

/** Splits a unified diff into its files; lines before the first file header are ignored. */
export function parseDiff(text: string): FileDiff[] {
  const files: FileDiff[] = [];
  let cur: FileDiff | undefined;
  // Inside a hunk, "--- x" is a removed line "-- x", not a header.
  let inHunk = false;
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  for (const line of lines) {
    if (line.startsWith('diff --git ')) {
      // Until ---/+++ say better: the b/ side of the header (git quotes paths with unusual characters).
      const m = /^diff --git (?:"?a\/.*?"?) ("?b\/.*"?)$/.exec(line);
      cur = { path: m ? strip(m[1]!) : line.slice(11), lines: [line], added: 0, removed: 0, binary: false };
      files.push(cur);
      inHunk = false;
      continue;
    }
    if (!cur) continue;
    cur.lines.push(line);
    if (line.startsWith('@@')) inHunk = true;
    else if (!inHunk) {
      const p = line.slice(4);
      if ((line.startsWith('+++ ') || line.startsWith('--- ')) && p !== '/dev/null') cur.path = strip(p);
      else if (line.startsWith('Binary files ')) cur.binary = true;
    } else if (line.startsWith('+')) cur.added++;
    else if (line.startsWith('-')) cur.removed++;
  }
  return files;
}

function classOf(line: string, inHunk: boolean): string {
  if (!inHunk) return 'meta';
  if (line.startsWith('@@')) return 'hunk';
  if (line.startsWith('+')) return 'add';
  if (line.startsWith('-')) return 'del';
  if (line.startsWith('\\')) return 'meta';
  return 'ctx';
}

/** The lines as text nodes in coloured spans: file contents never become markup. */
function lineSpans(lines: string[], startInHunk: boolean): { spans: HTMLElement[]; inHunk: boolean } {
  let inHunk = startInHunk;
  const spans = lines.map((line) => {
    if (line.startsWith('@@')) inHunk = true;
    else if (line.startsWith('diff --git ')) inHunk = false;
    return h('span', { class: `dl ${classOf(line, inHunk)}` }, `${line}\n`);
  });
  return { spans, inHunk };
}

function fileBox(f: FileDiff, open: boolean): HTMLElement {
  const pre = h('pre', { class: 'diff' });
  const first = lineSpans(f.lines.slice(0, FOLD_AT), false);
  pre.append(...first.spans);
  let more: Child = null;
  if (f.lines.length > FOLD_AT) {
    const rest = f.lines.length - FOLD_AT;
    const button = h(
      'button',
      {
        type: 'button',
        class: 'unfold',
        onclick: () => {
          pre.append(...lineSpans(f.lines.slice(FOLD_AT), first.inHunk).spans);
          button.remove();
        },
      },
      `Show ${rest} more line${rest === 1 ? '' : 's'}`,
    );
    more = button;
  }
  return h(
    'details',
    { class: 'file', ...(open ? { open: true } : {}) },
    h(
      'summary',
      {},
      h('code', { class: 'path' }, f.path),
      f.binary ? h('span', { class: 'stat' }, 'binary') : h('span', { class: 'stat' }, `+${f.added} −${f.removed}`),
    ),
    pre,
    more,
  );
}

/** A commit's patch, file by file: added and removed lines coloured, long files folded. */
export function diffView(text: string, truncated: boolean): HTMLElement {
  const files = parseDiff(text);
  return h(
    'div',
    { class: 'diffs' },
    files.length === 0 ? h('p', { class: 'empty' }, 'no file content changed') : null,
    ...files.map((f, i) => fileBox(f, i < OPEN_FILES)),
    truncated
      ? h('p', { class: 'hint' }, 'The diff is longer than the API returns (1 MiB); the rest is not shown.')
      : null,
  );
}
