// The tokenizer's own thread (see off-thread.ts): counts o200k_base tokens of texts.
//   in:  { id, texts: string[] }    out: { id, ok: number[] } | { id, error }
//
// js-tiktoken's byte-pair merge is quadratic in the length of one pre-token, and a sandbox's
// output decides those lengths: a run of one character ('x' * 30000, '=' * 40000, blank space,
// progress bars) is a single pre-token. So pre-tokens longer than MAX_PIECE characters are cut
// into MAX_PIECE-character parts before BPE: the cost is then linear in the text (at most
// MAX_PIECE² per part, and a part seen before is not merged again), and the count differs from
// the exact one only within such runs, by at most a token or so per part. Text without long
// pre-tokens is counted exactly, in one call.
import { getEncoding } from 'js-tiktoken';
import { serve } from '../lib/serve-thread.mjs';

const MAX_PIECE = 64;
const encoder = getEncoding('o200k_base');
const count = (text) => encoder.encode(text, 'all').length;
const parts = new Map();
const MAX_PARTS = 10_000;

function countPart(part) {
  let n = parts.get(part);
  if (n === undefined) {
    n = count(part);
    if (parts.size >= MAX_PARTS) parts.delete(parts.keys().next().value);
    parts.set(part, n);
  }
  return n;
}

function countBounded(text) {
  if (text.length <= MAX_PIECE) return count(text);
  // The encoder's own pre-tokenizer finds the long pieces; the text between them is counted whole.
  const pieces = new RegExp(encoder.patStr, 'gu');
  let n = 0;
  let from = 0;
  for (const m of text.matchAll(pieces)) {
    if (m[0].length <= MAX_PIECE) continue;
    if (m.index > from) n += count(text.slice(from, m.index));
    const chars = Array.from(m[0]); // cut between code points, never inside a surrogate pair
    for (let i = 0; i < chars.length; i += MAX_PIECE) n += countPart(chars.slice(i, i + MAX_PIECE).join(''));
    from = m.index + m[0].length;
  }
  if (from < text.length) n += count(text.slice(from));
  return n;
}

serve((msg) => msg.texts.map(countBounded));
