import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';

/** An assistant message calling tools with these ids. */
const calls = (...ids: string[]) => ({
  role: 'assistant',
  content: null,
  tool_calls: ids.map((id) => ({
    id,
    type: 'function',
    function: { name: 'python', arguments: '{"code":"print(1)"}' },
  })),
});
const answer = (id: string, content = 'ok') => ({ role: 'tool', tool_call_id: id, content });
const user = (content = 'hi') => ({ role: 'user', content });
const TOOL = {
  type: 'function',
  function: {
    name: 'python',
    parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] },
  },
};

describe('the scripted model refuses what a real endpoint refuses', () => {
  let fake: FakeOpenAI;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
  });
  afterAll(() => fake.close());

  const post = async (body: unknown) => {
    const r = await fetch(`${fake.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: r.status, body: (await r.json()) as any };
  };
  const chat = (messages: unknown[], extra: object = {}) => post({ model: 'fake-model', messages, ...extra });

  it('accepts parallel calls answered in any order, directly after their message, before the next one', async () => {
    fake.script({ content: 'first' }, { content: 'second' });
    const ok = await chat(
      [
        { role: 'system', content: 's' },
        user(),
        calls('a', 'b', 'c'),
        answer('a'),
        answer('c'),
        answer('b'),
        user('next'),
      ],
      { tools: [TOOL] },
    );
    expect(ok.status).toBe(200);
    expect(ok.body.choices[0].message.content).toBe('first');
    const again = await chat([
      user(),
      calls('a'),
      answer('a'),
      { role: 'assistant', content: 'done' },
      user(),
      calls('b'),
      answer('b'),
    ]);
    expect(again.status).toBe(200);
  });

  const invalid: [string, () => Promise<{ status: number; body: any }>, RegExp][] = [
    [
      'a call left unanswered before a user message',
      () => chat([user(), calls('a', 'b'), answer('a'), user()]),
      /tool_call_ids did not have response messages: b/,
    ],
    [
      'a call left unanswered at the end',
      () => chat([user(), calls('a', 'b'), answer('b')]),
      /did not have response messages: a/,
    ],
    [
      'an answer to no call (orphan)',
      () => chat([user(), answer('x')]),
      /must be a response to a preceeding message with 'tool_calls'/,
    ],
    [
      'an answer to a call of another message',
      () => chat([user(), calls('a'), answer('a'), { role: 'assistant', content: 'x' }, answer('a')]),
      /preceeding message with 'tool_calls'/,
    ],
    [
      'an answer repeated',
      () => chat([user(), calls('a'), answer('a'), answer('a')]),
      /preceeding message with 'tool_calls'/,
    ],
    [
      'an answer after a user message',
      () => chat([user(), calls('a'), user(), answer('a')]),
      /did not have response messages: a/,
    ],
    [
      'an answer without a tool_call_id',
      () => chat([user(), calls('a'), { role: 'tool', content: 'ok' }]),
      /tool_call_id/,
    ],
    [
      'a repeated call id',
      () => chat([user(), calls('a'), answer('a'), calls('a'), answer('a')]),
      /duplicate tool call id/,
    ],
    [
      'an assistant message with neither content nor calls',
      () => chat([user(), { role: 'assistant', content: null }, user()]),
      /expected a string/,
    ],
    [
      'an empty assistant message',
      () => chat([user(), { role: 'assistant', content: '' }, user()]),
      /expected a string/,
    ],
    [
      'empty tool_calls',
      () => chat([user(), { role: 'assistant', content: 'x', tool_calls: [] }]),
      /tool_calls': empty array/,
    ],
    [
      'a malformed call',
      () =>
        chat([
          user(),
          {
            role: 'assistant',
            content: null,
            tool_calls: [{ id: 'a', type: 'function', function: { name: 'python', arguments: {} } }],
          },
        ]),
      /tool_calls\[0\]/,
    ],
    ['an unknown role', () => chat([{ role: 'robot', content: 'x' }]), /Invalid value: 'robot'/],
    ['a missing role', () => chat([{ content: 'x' }]), /Invalid value: 'undefined'/],
    ['a user message without content', () => chat([{ role: 'user' }]), /content/],
    ['an empty user message', () => chat([user('')]), /content/],
    ['no messages', () => chat([]), /empty array/],
    ['no model', () => post({ messages: [user()] }), /model/],
    ['an empty tools list', () => chat([user()], { tools: [] }), /tools/],
    [
      'a tool named with spaces',
      () => chat([user()], { tools: [{ type: 'function', function: { name: 'run python' } }] }),
      /function.name/,
    ],
    ['two tools of one name', () => chat([user()], { tools: [TOOL, TOOL] }), /duplicate function name/],
    [
      'parameters that are not an object schema',
      () => chat([user()], { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }] }),
      /type: "object"/,
    ],
    [
      'parameters with an invalid type',
      () =>
        chat([user()], {
          tools: [
            {
              type: 'function',
              function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'text' } } } },
            },
          ],
        }),
      /not a JSON schema type/,
    ],
    [
      'parameters with invalid required',
      () =>
        chat([user()], {
          tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', required: 'x' } } }],
        }),
      /required/,
    ],
    ['a tool that is not a function', () => chat([user()], { tools: [{ type: 'retrieval' }] }), /tools\[0\]/],
  ];
  for (const [name, request, message] of invalid) {
    it(`400 invalid_request_error for ${name}, without using a scripted answer`, async () => {
      fake.script({ content: 'never sent' });
      const before = fake.refusals.length;
      const r = await request();
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ type: 'invalid_request_error', message: expect.stringMatching(message) });
      expect(Object.keys(r.body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
      expect(fake.refusals.splice(before)).toHaveLength(1);
      expect(fake.pending()).toBe(1);
      expect((await chat([user()])).status).toBe(200);
    });
  }
});

describe('the scripted embeddings model refuses what a real endpoint refuses', () => {
  let fake: FakeOpenAI;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
  });
  afterAll(() => fake.close());

  const embed = async (body: unknown) => {
    const res = await fetch(`${fake.url}/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: (await res.json()) as any };
  };

  it('answers a vector per text, in order', async () => {
    const r = await embed({ model: 'm', input: ['a red car', 'a cat'], encoding_format: 'float' });
    expect(r.status).toBe(200);
    expect(r.body.data.map((d: { index: number }) => d.index)).toEqual([0, 1]);
    expect(r.body.data[0].embedding).toHaveLength(512);
  });

  const invalid: [string, unknown, RegExp][] = [
    ['no model', { input: 'x' }, /model/],
    ['no input', { model: 'm' }, /input/],
    ['an empty text', { model: 'm', input: ['ok', ''] }, /\$\.input/],
    ['an empty list', { model: 'm', input: [] }, /\$\.input/],
    ['more than 2,048 texts', { model: 'm', input: Array.from({ length: 2049 }, () => 'x') }, /maximum length 2048/],
    // 3,000 Chinese characters: 9,000 bytes, more than 8,192 tokens for a tokenizer that may give one a byte.
    ['a text over the context', { model: 'm', input: ['短', '字'.repeat(3000)] }, /maximum context length is 8192/],
    ['over 300,000 tokens in all', { model: 'm', input: Array.from({ length: 40 }, () => 'y'.repeat(8000)) }, /300000/],
    ['an unknown encoding', { model: 'm', input: 'x', encoding_format: 'int8' }, /encoding_format|float/],
  ];
  for (const [name, body, message] of invalid) {
    it(`400 invalid_request_error for ${name}`, async () => {
      const before = fake.refusals.length;
      const r = await embed(body);
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ type: 'invalid_request_error', message: expect.stringMatching(message) });
      expect(fake.refusals.splice(before)).toHaveLength(1);
    });
  }
});
