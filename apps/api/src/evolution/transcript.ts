import type { MessageRow } from '../db/schema/index.ts';

/** One message of a transcript as a reviewer reads it: long texts keep their head and tail. */
function clip(text: string, max: number): string {
  if (text.length <= max) return text;
  const half = Math.floor(max / 2);
  return `${text.slice(0, half)}\n[… ${text.length - max} characters omitted …]\n${text.slice(-half)}`;
}

/**
 * A session's whole transcript as text — the person's messages, the agent's replies with their
 * tool calls, and every result (output, errors) — newest kept when it is too long.
 */
export function renderSession(rows: MessageRow[], opts: { perMessage: number; total: number }): string {
  const parts = rows.map((m) => {
    const calls = ((m.toolCalls as { name: string; arguments: string }[] | null) ?? [])
      .map((c) => `\n[calls ${c.name}(${clip(c.arguments, opts.perMessage)})]`)
      .join('');
    const who = m.role === 'tool' || (m.role === 'user' && m.content.startsWith('Kiln System:')) ? 'result' : m.role;
    return `### ${who} (${m.createdAt.toISOString().slice(0, 16).replace('T', ' ')})\n${clip(m.content, opts.perMessage)}${calls}`;
  });
  let size = 0;
  let from = parts.length;
  while (from > 0 && size + parts[from - 1]!.length <= opts.total) size += parts[--from]!.length + 2;
  const omitted = from > 0 ? `[… ${from} earlier message(s) omitted …]\n\n` : '';
  return omitted + parts.slice(from).join('\n\n');
}
