import { OffThread } from '../lib/off-thread.ts';
import { LOG_LINE_RULES, toLogLines } from '../memory/chunker.ts';
import type { ChatMessage } from './llm.ts';

/** The tokenizer runs in its own thread: a tenant's output decides how long it takes. */
const tokenizer = new OffThread<{ texts: string[] }, number[]>(
  new URL('./tokenizer.worker.mjs', import.meta.url),
  'tokenizer',
);
const counted = new Map<string, number>();
const MAX_CACHED = 50_000;

/**
 * Tokens of each text with a real BPE tokenizer (o200k_base), cached by content and counted off
 * the event loop, in linear time (pre-tokens longer than 64 characters are cut before BPE; see
 * tokenizer.worker.mjs).
 */
export async function countTokensOf(texts: string[]): Promise<number[]> {
  const found = new Map<string, number>();
  for (const t of texts) {
    const hit = t ? counted.get(t) : 0;
    if (hit !== undefined) found.set(t, hit);
  }
  const missing = [...new Set(texts.filter((t) => !found.has(t)))];
  if (missing.length) {
    const counts = await tokenizer.run({ texts: missing });
    missing.forEach((t, i) => {
      found.set(t, counts[i]!);
      if (counted.size >= MAX_CACHED) counted.delete(counted.keys().next().value!);
      counted.set(t, counts[i]!);
    });
  }
  return texts.map((t) => found.get(t)!);
}

export async function countTokens(text: string): Promise<number> {
  return (await countTokensOf([text]))[0]!;
}

/**
 * An upper bound on a text's tokens without tokenizing: a byte-level BPE token is at least one
 * byte, so a text never has more tokens than UTF-8 bytes.
 */
const maxTokens = (text: string) => Buffer.byteLength(text);

/** The texts of a chat request that count: content, and the name and arguments of tool calls. */
function textsOf(m: ChatMessage): string[] {
  const texts = typeof m.content === 'string' ? [m.content] : [];
  if (m.role === 'assistant' && m.tool_calls)
    for (const c of m.tool_calls) if (c.type === 'function') texts.push(c.function.name, c.function.arguments);
  return texts;
}

/** Tokens of a whole chat request: content, tool calls and a few tokens of framing per message. */
export async function messageTokens(messages: ChatMessage[]): Promise<number> {
  const counts = await countTokensOf(messages.flatMap(textsOf));
  return 3 + 4 * messages.length + counts.reduce((a, b) => a + b, 0);
}

/** A stored transcript message with what the context manager needs to know about it. */
export interface TranscriptEntry {
  id: string;
  message: ChatMessage;
  /** Written by a person (not Kiln feedback): starts a turn. */
  person: boolean;
}

/**
 * The transcript as a real endpoint accepts it: each tool call of an assistant message answered
 * exactly once, by the tool messages directly after it and before any other message; no tool
 * message that answers no open call; no assistant message with neither content nor calls. A run
 * that ended mid-message (cancelled at an approval, failed, interrupted by a restart) leaves
 * calls unanswered in the stored transcript: they are answered here with `notRun`, so the
 * session's next run can still be sent.
 */
export function answerEveryCall(entries: TranscriptEntry[], notRun: string): TranscriptEntry[] {
  const out: TranscriptEntry[] = [];
  let open: { id: string; calls: string[] } | undefined;
  const close = () => {
    for (const call of open?.calls ?? [])
      out.push({
        id: `${open!.id}:${call}`,
        person: false,
        message: { role: 'tool', tool_call_id: call, content: notRun },
      });
    open = undefined;
  };
  for (const e of entries) {
    const m = e.message;
    if (m.role === 'tool') {
      const at = open?.calls.indexOf(m.tool_call_id) ?? -1;
      if (at >= 0) {
        open!.calls.splice(at, 1);
        out.push(e);
      }
      continue;
    }
    close();
    if (m.role === 'assistant' && m.tool_calls?.length) open = { id: e.id, calls: m.tool_calls.map((c) => c.id) };
    else if (m.role === 'assistant' && !m.content) continue;
    out.push(e);
  }
  close();
  return out;
}

/** Whole turns: a person's message and everything up to the next one. */
export function splitTurns(entries: TranscriptEntry[]): TranscriptEntry[][] {
  const turns: TranscriptEntry[][] = [];
  for (const e of entries) {
    if (e.person || turns.length === 0) turns.push([e]);
    else turns.at(-1)!.push(e);
  }
  return turns;
}

/** Level 1: tool results of earlier turns over `capTokens` keep their head and tail with a note. */
export async function truncateOldResults(
  turns: TranscriptEntry[][],
  capTokens: number,
): Promise<{ turns: TranscriptEntry[][]; changed: number }> {
  const textOf = (e: TranscriptEntry) => (typeof e.message.content === 'string' ? e.message.content : '');
  const isResult = (e: TranscriptEntry) => e.message.role === 'tool' || (e.message.role === 'user' && !e.person);
  const older = turns.slice(0, -1).flat(); // the current turn stays whole
  // Only the results the byte bound cannot clear are tokenized, all in one request.
  const candidates = older.filter((e) => isResult(e) && maxTokens(textOf(e)) > capTokens);
  const counts = await countTokensOf(candidates.map(textOf));
  const over = new Map(candidates.flatMap((e, i) => (counts[i]! > capTokens ? [[e, counts[i]!] as const] : [])));
  let changed = 0;
  const out = turns.map((turn) =>
    turn.map((e) => {
      const tokens = over.get(e);
      if (tokens === undefined) return e;
      changed++;
      const text = textOf(e);
      // About half the cap at each end, in this text's own characters per token (dense text such
      // as hex has fewer than English), at least 200 characters, and always less than the whole.
      const keep = Math.min(
        Math.max(200, Math.floor((text.length * capTokens) / (2 * tokens))),
        Math.floor(text.length / 4),
      );
      const omitted = text.length - 2 * keep;
      const content = `${text.slice(0, keep)}\n[... ${omitted} characters of this old result omitted by Kiln to save context ...]\n${text.slice(-keep)}`;
      return { ...e, message: { ...e.message, content } as ChatMessage };
    }),
  );
  return { turns: out, changed };
}

/**
 * Level 3: each earlier turn shrinks to its first (person's) message and its last answer; the
 * tool calls and results in between go, so no call is ever left without its result.
 */
export function reduceOldTurns(turns: TranscriptEntry[][]): TranscriptEntry[][] {
  return turns.map((turn, i) => {
    if (i === turns.length - 1 || turn.length <= 2) return turn;
    const first = turn[0]!;
    const lastAnswer = [...turn]
      .reverse()
      .find(
        (e) =>
          e.message.role === 'assistant' &&
          typeof e.message.content === 'string' &&
          e.message.content &&
          !('tool_calls' in e.message && e.message.tool_calls),
      );
    return lastAnswer ? [first, lastAnswer] : [first];
  });
}

export const SUMMARY_INSTRUCTIONS = `You condense an agent's conversation so the work can continue without it.
Reply with exactly two sections:
<daily_log>
Today's log: what was asked, what was done, decisions, results, problems. Facts only.
${LOG_LINE_RULES}
</daily_log>
<project_state>
## Progress
## Todo
## Key identifiers
(file paths, names, ids, numbers, commands — copied verbatim)
## Environment
</project_state>`;

/** Parses the summariser's answer; both sections are required. */
export function parseSummary(reply: string): { log: string; state: string } | null {
  const log = toLogLines(/<daily_log>([\s\S]*?)<\/daily_log>/i.exec(reply)?.[1]?.trim() ?? '');
  const state = /<project_state>([\s\S]*?)<\/project_state>/i.exec(reply)?.[1]?.trim();
  return log && state ? { log, state } : null;
}

/** The dropped turns as plain text for the summariser. */
export function renderTurns(turns: TranscriptEntry[][]): string {
  return turns
    .flat()
    .map((e) => {
      const m = e.message;
      const calls =
        m.role === 'assistant' && m.tool_calls
          ? m.tool_calls
              .map((c) => (c.type === 'function' ? ` [calls ${c.function.name}(${c.function.arguments})]` : ''))
              .join('')
          : '';
      return `### ${e.person ? 'user' : m.role}\n${typeof m.content === 'string' ? m.content : ''}${calls}`;
    })
    .join('\n\n');
}

/** Does the request fit in `budget` tokens? Tokenizes only when the byte bound cannot tell. */
export async function fits(messages: ChatMessage[], budget: number): Promise<boolean> {
  let bound = 3;
  for (const m of messages) bound += 4 + textsOf(m).reduce((n, t) => n + maxTokens(t), 0);
  return bound <= budget || (await messageTokens(messages)) <= budget;
}
