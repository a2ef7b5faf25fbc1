import { describe, expect, it } from 'vitest';
import {
  answerEveryCall,
  countTokens,
  countTokensOf,
  fits,
  messageTokens,
  parseSummary,
  reduceOldTurns,
  renderTurns,
  splitTurns,
  truncateOldResults,
  type TranscriptEntry,
} from '../../apps/api/src/agent/context.ts';
import type { ChatMessage } from '../../apps/api/src/agent/llm.ts';
import { refusal } from '../support/fake-openai.ts';

const NOT_RUN = 'Kiln System: [Not run] the run ended first.';
let n = 0;
const entry = (message: ChatMessage, person = false): TranscriptEntry => ({ id: `m${++n}`, message, person });
const person = (content: string) => entry({ role: 'user', content }, true);
const feedback = (content: string) => entry({ role: 'user', content: `Kiln System: ${content}` });
const answer = (content: string) => entry({ role: 'assistant', content });
const calls = (...ids: string[]) =>
  entry({
    role: 'assistant',
    content: null,
    tool_calls: ids.map((id) => ({
      id,
      type: 'function' as const,
      function: { name: 'python', arguments: `{"code":"print('${id}')"}` },
    })),
  });
const result = (id: string, content = `out ${id}`) => entry({ role: 'tool', tool_call_id: id, content });
/** Why a real endpoint would refuse these messages as a chat request (null: it would send). */
const refused = (entries: TranscriptEntry[]) =>
  refusal({ model: 'm', messages: entries.map((e) => e.message) })?.message ?? null;

describe('counting the tokens of a request', () => {
  it('answers in the order asked, the same count for the same text, and 0 for empty text', async () => {
    const texts = ['hello world', '', 'hello world', 'Ça coûte 12,50 €', ''];
    const counts = await countTokensOf(texts);
    expect(counts).toHaveLength(5);
    expect(counts[1]).toBe(0);
    expect(counts[4]).toBe(0);
    expect(counts[0]).toBe(counts[2]);
    expect(counts[0]).toBe(await countTokens('hello world'));
    expect(counts[3]).toBe(await countTokens('Ça coûte 12,50 €'));
    expect(await countTokensOf([])).toEqual([]);
  });

  it('counts its texts, 3 tokens more and 4 per message; a tool call by its name and arguments', async () => {
    expect(await messageTokens([])).toBe(3);
    const call: ChatMessage = {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'c1', type: 'function', function: { name: 'python', arguments: '{"code":"print(1)"}' } }],
    };
    const tool: ChatMessage = { role: 'tool', tool_call_id: 'c1', content: '1\n' };
    const expected =
      3 +
      4 * 3 +
      (await countTokens('hi')) +
      (await countTokens('python')) +
      (await countTokens('{"code":"print(1)"}')) +
      (await countTokens('1\n'));
    expect(await messageTokens([{ role: 'user', content: 'hi' }, call, tool])).toBe(expected);
  });

  it('fits exactly at the budget and not one token under it, whether or not the byte bound decides', async () => {
    const short: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    const tokens = await messageTokens(short);
    expect(await fits(short, tokens)).toBe(true);
    expect(await fits(short, tokens - 1)).toBe(false);
    // Multi-byte text: far more bytes than tokens, so only the tokenizer can tell.
    const wide: ChatMessage[] = [{ role: 'user', content: '大丈夫です。'.repeat(500) }];
    const wideTokens = await messageTokens(wide);
    expect(wideTokens).toBeLessThan(Buffer.byteLength('大丈夫です。'.repeat(500)));
    expect(await fits(wide, wideTokens)).toBe(true);
    expect(await fits(wide, wideTokens - 1)).toBe(false);
    expect(await fits([], 3)).toBe(true);
    expect(await fits([], 2)).toBe(false);
  });
});

describe('answering every tool call of a stored transcript', () => {
  it('leaves a well-formed transcript as it is', () => {
    const t = [person('go'), calls('a', 'b'), result('a'), result('b'), answer('done'), person('again'), answer('ok')];
    expect(answerEveryCall(t, NOT_RUN)).toEqual(t);
    expect(answerEveryCall([], NOT_RUN)).toEqual([]);
  });

  it('answers the calls a run left open with the note, after the answered ones, before the next message', () => {
    const open = calls('a', 'b', 'c');
    const t = [person('go'), open, result('b'), person('what happened?')];
    const out = answerEveryCall(t, NOT_RUN);
    expect(out.map((e) => e.message)).toEqual([
      t[0]!.message,
      open.message,
      result('b').message,
      { role: 'tool', tool_call_id: 'a', content: NOT_RUN },
      { role: 'tool', tool_call_id: 'c', content: NOT_RUN },
      t[3]!.message,
    ]);
    expect(out[3]).toMatchObject({ id: `${open.id}:a`, person: false });
    expect(refused(out)).toBeNull();
    // At the very end of the transcript too.
    const last = answerEveryCall([person('go'), calls('z')], NOT_RUN);
    expect(last.at(-1)!.message).toEqual({ role: 'tool', tool_call_id: 'z', content: NOT_RUN });
  });

  it('drops tool messages that answer no open call (unknown, repeated, late) and empty answers', () => {
    const t = [
      person('go'),
      result('ghost'),
      calls('a'),
      result('a'),
      result('a'),
      answer('mid'),
      result('a'),
      entry({ role: 'assistant', content: '' }),
      answer('end'),
    ];
    const out = answerEveryCall(t, NOT_RUN);
    expect(out.map((e) => e.id)).toEqual([t[0]!.id, t[2]!.id, t[3]!.id, t[5]!.id, t[8]!.id]);
    expect(refused(out)).toBeNull();
  });

  it('turns any mix of broken transcripts into one a real endpoint accepts', () => {
    // Every way a run can stop mid-message, in a row: each prefix of a full exchange, then the next turn.
    const full = () => [calls('x1', 'x2'), result('x2'), result('x1'), answer('fine')];
    for (let cut = 0; cut <= 4; cut++) {
      const broken = [
        person('one'),
        ...full().slice(0, cut),
        feedback('Cancelled.'),
        person('two'),
        calls('y'),
        entry({ role: 'assistant', content: null }),
      ];
      const out = answerEveryCall(broken, NOT_RUN);
      expect(refused(out), `cut at ${cut}`).toBeNull();
      expect(out.filter((e) => e.message.role === 'tool' && e.message.content === NOT_RUN).length).toBe(
        cut === 1 ? 3 : cut === 2 ? 2 : 1,
      );
    }
  });
});

describe('turns', () => {
  it('a turn starts at each message of a person; what comes before the first one is a turn of its own', () => {
    const a = [
      feedback('restarted'),
      answer('hello'),
      person('p1'),
      calls('c'),
      result('c'),
      person('p2'),
      answer('ok'),
    ];
    expect(splitTurns(a).map((turn) => turn.map((e) => e.id))).toEqual([
      [a[0]!.id, a[1]!.id],
      [a[2]!.id, a[3]!.id, a[4]!.id],
      [a[5]!.id, a[6]!.id],
    ]);
    expect(splitTurns([])).toEqual([]);
    // Kiln's own feedback never starts a turn.
    expect(splitTurns([person('p'), feedback('x'), feedback('y')])).toHaveLength(1);
  });

  it('level 3 keeps of each earlier turn its first message and last plain answer; the current turn stays whole', () => {
    const first = [person('p1'), calls('a'), result('a'), answer('first answer'), calls('b'), result('b')];
    const second = [person('p2'), calls('c'), result('c')];
    const short = [person('p3'), answer('short')];
    const current = [person('p4'), calls('d'), result('d'), calls('e'), result('e')];
    const out = reduceOldTurns([first, second, short, current]);
    expect(out[0]!.map((e) => e.id)).toEqual([first[0]!.id, first[3]!.id]);
    expect(out[1]!.map((e) => e.id)).toEqual([second[0]!.id]);
    expect(out[2]).toEqual(short);
    expect(out[3]).toEqual(current);
    expect(refused(out.flat())).toBeNull();
    expect(reduceOldTurns([])).toEqual([]);
  });
});

describe('level 1: old tool results keep their head and tail', () => {
  const CAP = 100;
  const long = (tag: string) => `${tag}-HEAD ${Array.from({ length: 3000 }, (_, i) => `w${i}`).join(' ')} ${tag}-TAIL`;

  it('cuts long results and feedback of earlier turns, never the current turn, a person or an answer', async () => {
    const old = [
      person(long('person')),
      calls('a'),
      result('a', long('tool')),
      feedback(long('feedback')),
      answer(long('answer')),
    ];
    const current = [person('now'), calls('b'), result('b', long('current'))];
    const before = JSON.stringify([old, current]);
    const { turns, changed } = await truncateOldResults([old, current], CAP);
    expect(changed).toBe(2);
    expect(JSON.stringify([old, current])).toBe(before); // the input is not changed
    const text = (e: TranscriptEntry) => e.message.content as string;
    for (const i of [2, 3]) {
      const cut = text(turns[0]![i]!);
      const whole = text(old[i]!);
      expect(cut.startsWith(whole.slice(0, 200))).toBe(true);
      expect(cut.endsWith(whole.slice(-200))).toBe(true);
      expect(cut).toContain(
        `[... ${whole.length - 400} characters of this old result omitted by Kiln to save context ...]`,
      );
      expect(cut.length).toBeLessThan(whole.length);
      expect(turns[0]![i]!.id).toBe(old[i]!.id);
    }
    expect(text(turns[0]![0]!)).toBe(long('person'));
    expect(text(turns[0]![4]!)).toBe(long('answer'));
    expect(turns[1]).toEqual(current);
  });

  it('makes a dense result (hex: few characters per token) shorter, about the cap, never longer', async () => {
    const hex = Array.from({ length: 3000 }, (_, i) => ((i * 2654435761) % 65536).toString(16).padStart(4, '0')).join(
      '',
    );
    const cap = 2000;
    expect(await countTokens(hex)).toBeGreaterThan(cap);
    const { turns, changed } = await truncateOldResults(
      [[person('p'), calls('a'), result('a', hex)], [person('now')]],
      cap,
    );
    expect(changed).toBe(1);
    const cut = turns[0]![2]!.message.content as string;
    expect(cut.length).toBeLessThan(hex.length);
    expect(cut.startsWith(hex.slice(0, 200))).toBe(true);
    expect(cut.endsWith(hex.slice(-200))).toBe(true);
    expect(await countTokens(cut)).toBeLessThanOrEqual(cap + 30);
  });

  it('leaves results at or under the cap in tokens alone, even when they have more bytes than the cap', async () => {
    const wide = '日本語のテキスト'.repeat(10); // 240 bytes, far fewer tokens
    const tokens = await countTokens(wide);
    expect(Buffer.byteLength(wide)).toBeGreaterThan(tokens);
    const old = [person('p'), calls('a'), result('a', wide)];
    const { turns, changed } = await truncateOldResults([old, [person('now')]], tokens);
    expect(changed).toBe(0);
    expect(turns[0]).toEqual(old);
    expect((await truncateOldResults([old, [person('now')]], tokens - 1)).changed).toBe(1);
  });

  it('keeps more of each end when the cap is larger, and handles a transcript of one turn or none', async () => {
    const old = [person('p'), calls('a'), result('a', long('tool'))];
    const cutTo = async (cap: number) =>
      (await truncateOldResults([old, [person('now')]], cap)).turns[0]![2]!.message.content as string;
    const [small, large] = [await cutTo(CAP), await cutTo(1000)];
    expect(large.length).toBeGreaterThan(small.length);
    expect(large.length).toBeLessThan(long('tool').length);
    // About the cap, plus the note that says what was left out.
    expect(await countTokens(large)).toBeLessThanOrEqual(1000 + 30);
    expect(await truncateOldResults([old], CAP)).toEqual({ turns: [old], changed: 0 });
    expect(await truncateOldResults([], CAP)).toEqual({ turns: [], changed: 0 });
  });
});

describe('the summary of dropped turns', () => {
  it('needs both sections; the log comes back as one bullet per line, the state as written', () => {
    const reply =
      'Here you go.\n<DAILY_LOG>\nMaya asked for the totals.\n  * They were 42.\n</DAILY_LOG>\n' +
      '<project_state>\n## Progress\nTotals done.\n</project_state>';
    expect(parseSummary(reply)).toEqual({
      log: '- Maya asked for the totals.\n- They were 42.',
      state: '## Progress\nTotals done.',
    });
    expect(parseSummary('<daily_log>- a</daily_log>')).toBeNull();
    expect(parseSummary('<project_state>x</project_state>')).toBeNull();
    expect(parseSummary('<daily_log>\n\n</daily_log><project_state>x</project_state>')).toBeNull();
    expect(parseSummary('<daily_log>- a</daily_log><project_state>  </project_state>')).toBeNull();
    expect(parseSummary('')).toBeNull();
  });

  it('reads a reply with CRLF line ends: no carriage return is left in the log lines', () => {
    const parsed = parseSummary(
      '<daily_log>\r\nfirst\r\nsecond\r\n</daily_log>\r\n<project_state>\r\n## Todo\r\n</project_state>',
    );
    expect(parsed!.log).toBe('- first\n- second');
    expect(parsed!.state).toBe('## Todo');
  });

  it('renders the turns for the summariser: who spoke, what was said, which tools were called with what', () => {
    const turns = [[person('sum 1 and 2'), calls('a'), result('a', '3'), feedback('note'), answer('It is 3.')]];
    expect(renderTurns(turns)).toBe(
      [
        '### user\nsum 1 and 2',
        `### assistant\n [calls python({"code":"print('a')"})]`,
        '### tool\n3',
        '### user\nKiln System: note',
        '### assistant\nIt is 3.',
      ].join('\n\n'),
    );
    expect(renderTurns([])).toBe('');
  });
});
