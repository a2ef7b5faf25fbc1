export interface Chunk {
  startLine: number;
  endLine: number;
  heading: string | null;
  content: string;
}

const MAX_LINES = 40;

/**
 * Splits Markdown into search chunks: a new chunk at every heading, and long sections cut every
 * `MAX_LINES` lines. Line numbers are 1-based and inclusive. Front matter stays with the first
 * chunk (it holds a skill's name and description).
 */
export function chunkMarkdown(text: string): Chunk[] {
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  const chunks: Chunk[] = [];
  let start = 0;
  let heading: string | null = null;
  let inFence = false;
  const flush = (end: number) => {
    const body = lines.slice(start, end).join('\n');
    if (body.trim()) chunks.push({ startLine: start + 1, endLine: end, heading, content: body });
    start = end;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    if (/^(```|~~~)/.test(line)) inFence = !inFence;
    const h = !inFence && /^#{1,6}\s+(.*)$/.exec(line);
    if (h && i > start) flush(i);
    if (h) heading = h[1]!.trim();
    if (i + 1 - start >= MAX_LINES) flush(i + 1);
  }
  flush(lines.length);
  return chunks;
}
