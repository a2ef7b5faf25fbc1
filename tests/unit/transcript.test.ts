import { describe, expect, it } from 'vitest';
import type { TranscriptEntry } from '../../apps/api/src/agent/context.ts';
import type { ChatMessage } from '../../apps/api/src/agent/llm.ts';
import { FEEDBACK_PREFIX, fitTranscript, toEntry, trimCurrentTurn } from '../../apps/api/src/agent/transcript.ts';
import type { MessageRow } from '../../apps/api/src/db/schema/index.ts';

let nextId = 0;
function row(role: 'user' | 'assistant' | 'tool', content: string, extra: Partial<MessageRow> = {}): MessageRow {
  const id = `msg_${String(++nextId).padStart(6, '0')}`;
  return {
    id,
    teamId: 'team_1',
    sessionId: 'ses_1',
    runId: 'run_1',
    role,
    content,
    toolCalls: null,
    toolCallId: null,
    contentHash: id,
    createdAt: new Date(0),
    summarizedAt: null,
    ...extra,
  };
}

/** A person's message, one tool call with its result, and the model's answer. */
function turn(ask: string, result = 'ok', answer = `done: ${ask}`): MessageRow[] {
  const call = `call_${++nextId}`;
  return [
    row('user', ask),
    row('assistant', '', { toolCalls: [{ id: call, name: 'python', arguments: '{"code":"print(1)"}' }] }),
    row('tool', result, { toolCallId: call }),
    row('assistant', answer),
  ];
}

const system =
  (content = 'the system prompt') =>
  async (): Promise<ChatMessage> => ({ role: 'system', content });
const texts = (ms: ChatMessage[]) => ms.map((m) => (typeof m.content === 'string' ? m.content : null));
const roomy = { max_tokens: 64_000, max_turns: 40 };

describe('the transcript as the model gets it', () => {
  it('maps stored rows to chat messages; only a message without the feedback prefix is a person', () => {
    const [ask, call, result] = turn('hi');
    expect(toEntry(ask!)).toEqual({ id: ask!.id, person: true, message: { role: 'user', content: 'hi' } });
    expect(toEntry(row('user', `${FEEDBACK_PREFIX} [Output] 1`)).person).toBe(false);
    const callId = (call!.toolCalls as { id: string }[])[0]!.id;
    expect(toEntry(call!).message).toEqual({
      role: 'assistant',
      content: null,
      tool_calls: [{ id: callId, type: 'function', function: { name: 'python', arguments: '{"code":"print(1)"}' } }],
    });
    expect(toEntry(result!).message).toEqual({ role: 'tool', content: 'ok', tool_call_id: callId });
  });

  it('within its limits: the system prompt and every message, nothing summarised, no condensation', async () => {
    const rows = [...turn('one'), ...turn('two')];
    let summarised = 0;
    const out = await fitTranscript(rows, roomy, {
      system: system(),
      summarise: async () => {
        summarised++;
        return true;
      },
    });
    expect(out.condensed).toBeNull();
    expect(summarised).toBe(0);
    expect(texts(out.messages)).toEqual(['the system prompt', ...rows.map((r) => r.content || null)]);
  });

  it('answers a call the run left unanswered as not run', async () => {
    const [ask, call] = turn('cancelled mid-message');
    const rows = [ask!, call!, ...turn('next')];
    const out = await fitTranscript(rows, roomy, { system: system(), summarise: async () => true });
    const answer = out.messages[3]!;
    expect(answer.role).toBe('tool');
    expect(answer.role === 'tool' && answer.tool_call_id).toBe((call!.toolCalls as { id: string }[])[0]!.id);
  });

  it('level 2: over the turn limit, the oldest half of whole turns is summarised and the prompt rebuilt', async () => {
    const turns = [1, 2, 3, 4, 5].map((i) => turn(`ask ${i}`));
    const asked: string[][] = [];
    let state = 'before';
    const out = await fitTranscript(
      turns.flat(),
      { max_tokens: 64_000, max_turns: 4 },
      {
        system: async () => ({ role: 'system', content: `state: ${state}` }),
        summarise: async (ts) => {
          asked.push(ts.map((t) => t[0]!.id));
          state = 'after';
          return true;
        },
      },
    );
    expect(asked).toEqual([[turns[0]![0]!.id, turns[1]![0]!.id]]);
    expect(texts(out.messages)[0]).toBe('state: after');
    expect(out.messages).toHaveLength(1 + 3 * 4);
    expect(out.condensed).toMatchObject({ levels: [2], budget: 64_000 });
    expect(out.condensed!.after_tokens).toBeLessThan(out.condensed!.before_tokens);
  });

  it('a summary that could not be made leaves the turns where they were', async () => {
    const rows = [1, 2, 3].flatMap((i) => turn(`ask ${i}`));
    const limits = { max_tokens: 64_000, max_turns: 2 };
    const out = await fitTranscript(rows, limits, { system: system(), summarise: async () => false });
    expect(out.messages).toHaveLength(1 + rows.length);
    expect(out.condensed).toBeNull();
  });

  it('level 1: a long result of an earlier turn keeps its head and tail; the current turn stays whole', async () => {
    const long = `${'head '.repeat(50)}${'word '.repeat(3000)}${'tail '.repeat(50)}`;
    const rows = [...turn('old', long), ...turn('current', long)];
    const out = await fitTranscript(rows, roomy, { system: system(), summarise: async () => true });
    const [oldResult, currentResult] = out.messages.filter((m) => m.role === 'tool').map((m) => m.content as string);
    expect(oldResult!.length).toBeLessThan(long.length);
    expect(oldResult).toMatch(/^head /);
    expect(oldResult).toMatch(/tail $/);
    expect(oldResult).toContain('omitted by Kiln to save context');
    expect(currentResult).toBe(long);
    expect(out.condensed?.levels).toEqual([1]);
  });

  it('level 3: few turns over the token limit, earlier turns keep their first message and last answer', async () => {
    const rows = [...turn('one', 'x '.repeat(400)), ...turn('two', 'y '.repeat(400)), ...turn('three')];
    let summarised = 0;
    const out = await fitTranscript(
      rows,
      { max_tokens: 300, max_turns: 40 },
      {
        system: system(),
        summarise: async () => {
          summarised++;
          return true;
        },
      },
    );
    expect(summarised).toBe(0);
    const current = texts(rows.slice(8).map((r) => toEntry(r).message));
    expect(texts(out.messages)).toEqual(['the system prompt', 'one', 'done: one', 'two', 'done: two', ...current]);
    expect(out.condensed?.levels).toEqual([3]);
  });

  it('level 2 before 3: over the token limit with many turns, the oldest half is summarised first', async () => {
    const rows = [1, 2, 3, 4, 5, 6].flatMap((i) => turn(`ask ${i}`, 'z '.repeat(200)));
    const asked: number[] = [];
    const out = await fitTranscript(
      rows,
      { max_tokens: 600, max_turns: 40 },
      {
        system: system(),
        summarise: async (ts) => {
          asked.push(ts.length);
          return true;
        },
      },
    );
    expect(asked).toEqual([3]);
    expect(texts(out.messages)[1]).toBe('ask 4');
    expect(out.condensed?.levels).toContain(2);
  });

  it('forced (context-length error): earlier turns summarised, the current one cut to the budget', async () => {
    const exchanges = [1, 2, 3, 4].flatMap((i) => turn(`step ${i}`, 'r '.repeat(300)).slice(1, 3));
    const current = [row('user', 'the ask'), ...exchanges];
    const rows = [...turn('earlier'), ...turn('also earlier'), ...current];
    const asked: number[] = [];
    const out = await fitTranscript(rows, roomy, {
      system: system(),
      summarise: async (ts) => {
        asked.push(ts.length);
        return true;
      },
      force: { budget: 500 },
    });
    expect(asked).toEqual([2]);
    expect(texts(out.messages)[1]).toBe('the ask');
    // Exchanges go whole, oldest first: every call that is left keeps its result.
    const kept = out.messages.slice(2);
    expect(kept.length).toBeLessThan(current.length - 1);
    expect(kept.length % 2).toBe(0);
    for (const [i, m] of kept.entries()) expect(m.role).toBe(i % 2 === 0 ? 'assistant' : 'tool');
    expect(out.condensed).toMatchObject({ budget: 500 });
    expect(out.condensed!.levels).toEqual(expect.arrayContaining([2, 4]));
  });
});

describe('trimming the current turn', () => {
  const entry = (id: string, role: 'user' | 'assistant' | 'tool', person = false): TranscriptEntry => ({
    id,
    person,
    message: role === 'tool' ? { role, content: id, tool_call_id: id } : { role, content: id },
  });

  it('drops whole exchanges from the oldest until it fits, keeping the person’s message', async () => {
    const current = [
      entry('ask', 'user', true),
      entry('a1', 'assistant'),
      entry('r1', 'tool'),
      entry('r1b', 'tool'),
      entry('a2', 'assistant'),
      entry('r2', 'tool'),
      entry('a3', 'assistant'),
    ];
    const older = [[entry('old', 'user', true)]];
    const cut = await trimCurrentTurn([...older, current], async (ts) => ts.at(-1)!.length <= 4);
    expect(cut[0]).toBe(older[0]);
    expect(cut[1]!.map((e) => e.id)).toEqual(['ask', 'a2', 'r2', 'a3']);
  });

  it('never drops the person’s message or the last answer', async () => {
    const cut = await trimCurrentTurn([[entry('ask', 'user', true), entry('a1', 'assistant')]], async () => false);
    expect(cut[0]!.map((e) => e.id)).toEqual(['ask', 'a1']);
  });
});
