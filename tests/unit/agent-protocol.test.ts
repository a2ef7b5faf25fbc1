import { describe, expect, it } from 'vitest';
import {
  answerEveryCall,
  parseSummary,
  reduceOldTurns,
  renderTurns,
  splitTurns,
  type TranscriptEntry,
} from '../../apps/api/src/agent/context.ts';
import { parseToolCall, parseXml, toolsFor, TOOLS } from '../../apps/api/src/agent/protocol.ts';
import { DEFAULT_SETTINGS } from '../../apps/api/src/workspace/settings.ts';

describe('the XML protocol', () => {
  it('reads the thinking and exactly one action, finish first, code unfenced', () => {
    expect(parseXml('<thinking>plan</thinking>\n<python>\n```python\nprint(1)\n```\n</python>')).toEqual({
      thinking: 'plan',
      action: { type: 'python', code: 'print(1)' },
    });
    expect(parseXml('<thinking>t</thinking><finish>done</finish><python>x</python>').action).toEqual({
      type: 'finish',
      summary: 'done',
    });
    expect(parseXml('<memory_search>boiler service</memory_search>').action).toEqual({
      type: 'memory_search',
      query: 'boiler service',
    });
    expect(parseXml('<undo_evolution>evo_1</undo_evolution>').action).toEqual({
      type: 'undo_evolution',
      evolutionId: 'evo_1',
    });
  });

  it('finds no action in a reply without a complete action tag', () => {
    expect(parseXml('<thinking>only thinking</thinking>').action).toBeNull();
    expect(parseXml('<python>print(1)').action).toBeNull();
    expect(parseXml('<python></python>').action).toBeNull();
  });

  it('reads a source update first, even when its patch holds the other tags', () => {
    const reply =
      '<thinking>fix</thinking><propose_source_update><reason>typo</reason><patch>\n```diff\n+<finish>x</finish>\n```\n</patch></propose_source_update>';
    expect(parseXml(reply)).toEqual({
      thinking: 'fix',
      action: { type: 'source_update', patch: '+<finish>x</finish>\n', reason: 'typo' },
    });
  });
});

describe('native tool calls', () => {
  const call = (name: string, args: unknown) => ({
    id: 'call_1',
    name,
    arguments: typeof args === 'string' ? args : JSON.stringify(args),
  });

  it('turns each call into its action, memory_search with its optional filters', () => {
    expect(parseToolCall(call('python', { code: 'print(2)' }))).toEqual({
      toolCallId: 'call_1',
      action: { type: 'python', code: 'print(2)' },
    });
    expect(parseToolCall(call('memory_search', { query: 'vet', path: 'memory/', since: '2025-01-01' }))).toEqual({
      toolCallId: 'call_1',
      action: { type: 'memory_search', query: 'vet', path: 'memory/', since: '2025-01-01' },
    });
    expect(parseToolCall(call('finish', {}))).toEqual({
      toolCallId: 'call_1',
      action: { type: 'finish', summary: '' },
    });
  });

  it('makes bad JSON, an unknown tool or a missing argument a violation of that call only', () => {
    expect(parseToolCall(call('python', '{"code": '))).toEqual({
      toolCallId: 'call_1',
      violation: 'the arguments of python are not valid JSON',
    });
    expect(parseToolCall(call('rm_rf', {}))).toMatchObject({
      violation: expect.stringContaining('unknown tool rm_rf'),
    });
    expect(parseToolCall(call('python', { code: 42 }))).toMatchObject({
      violation: expect.stringContaining('missing arguments'),
    });
  });

  it('offers propose_source_update only where it is enabled', () => {
    const names = (s: typeof DEFAULT_SETTINGS) =>
      toolsFor(s).map((t) => (t.type === 'function' ? t.function.name : ''));
    expect(names({ ...DEFAULT_SETTINGS, source_updates: false })).toEqual(
      TOOLS.map((t) => (t.type === 'function' ? t.function.name : '')),
    );
    expect(names({ ...DEFAULT_SETTINGS, source_updates: true })).toContain('propose_source_update');
  });
});

describe('the transcript as an endpoint accepts it', () => {
  const user = (id: string, content: string): TranscriptEntry => ({
    id,
    person: true,
    message: { role: 'user', content },
  });
  const calls = (id: string, ...ids: string[]): TranscriptEntry => ({
    id,
    person: false,
    message: {
      role: 'assistant',
      content: null,
      tool_calls: ids.map((c) => ({ id: c, type: 'function', function: { name: 'python', arguments: '{}' } })),
    },
  });
  const tool = (id: string, callId: string): TranscriptEntry => ({
    id,
    person: false,
    message: { role: 'tool', tool_call_id: callId, content: 'ok' },
  });
  const said = (id: string, content: string): TranscriptEntry => ({
    id,
    person: false,
    message: { role: 'assistant', content },
  });

  it('answers every open call once, drops stray tool messages and empty assistant messages', () => {
    const out = answerEveryCall(
      [user('1', 'go'), calls('2', 'a', 'b'), tool('3', 'a'), tool('4', 'zzz'), said('5', ''), user('6', 'again')],
      'NOT RUN',
    );
    expect(
      out.map((e) => (e.message.role === 'tool' ? `tool:${e.message.tool_call_id}:${e.message.content}` : e.id)),
    ).toEqual(['1', '2', 'tool:a:ok', 'tool:b:NOT RUN', '6']);
  });

  it('splits whole turns at each person\u2019s message and keeps only the first message and last answer of old turns', () => {
    const entries = [
      user('1', 'a'),
      calls('2', 'x'),
      tool('3', 'x'),
      said('4', 'answer a'),
      user('5', 'b'),
      said('6', 'answer b'),
    ];
    const turns = splitTurns(entries);
    expect(turns.map((t) => t.map((e) => e.id))).toEqual([
      ['1', '2', '3', '4'],
      ['5', '6'],
    ]);
    expect(reduceOldTurns(turns).map((t) => t.map((e) => e.id))).toEqual([
      ['1', '4'],
      ['5', '6'],
    ]);
    expect(renderTurns([turns[1]!])).toBe('### user\nb\n\n### assistant\nanswer b');
  });

  it('accepts a summary only with both sections, and writes its log one bullet per line', () => {
    expect(parseSummary('<daily_log>x</daily_log>')).toBeNull();
    expect(
      parseSummary(
        '<daily_log>Asked for totals.\n  * Sent them.</daily_log><project_state>## Progress\ndone</project_state>',
      ),
    ).toEqual({
      log: '- Asked for totals.\n- Sent them.',
      state: '## Progress\ndone',
    });
  });
});
