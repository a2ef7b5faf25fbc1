import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil, PAUSED, pendingApproval, TERMINAL } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

/** The assistant message with tool calls last in a chat request, and the tool messages after it. */
function lastCalls(chat: any): {
  ids: string[];
  names: string[];
  answers: { tool_call_id: string; content: string }[];
} {
  const i = chat.messages.findLastIndex((m: any) => m.role === 'assistant' && m.tool_calls);
  const calls = chat.messages[i].tool_calls as { id: string; function: { name: string } }[];
  const answers = chat.messages.slice(i + 1).filter((m: any) => m.role === 'tool');
  return { ids: calls.map((c) => c.id), names: calls.map((c) => c.function.name), answers };
}

const python = (code: string) => ({ name: 'python', arguments: { code } });

describe('parallel tool calls: every call of a message is carried out and answered, in order', () => {
  const ctx = useAgentApp('parallel');
  const tools = (rules: { match: string; behavior: string }[] = []) => ({
    protocol: 'tools',
    approval: { mode: 'auto', rules },
  });
  const paused = PAUSED;
  const pending = (session: string) => pendingApproval(ctx.t, ctx.team.key, session);

  it('two calls (python + memory_search), then three: each answered in order, and the run completes', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, tools());
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=MEMORY.md`, {
      key: ctx.team.key,
      raw: '# Core memory\n\n- The kiln fires at 1200 degrees.\n',
    });
    ctx.fake.script(
      {
        content: 'Both at once.',
        tool_calls: [python('print(6 * 7)'), { name: 'memory_search', arguments: { query: 'kiln degrees' } }],
      },
      {
        tool_calls: [
          python('x = 2'),
          { name: 'memory_search', arguments: { query: 'fires' } },
          python('print(x + 40)'),
        ],
      },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'Done.' } }] },
    );
    const before = ctx.fake.chats().length;
    const { run, names } = await converse(ctx.t, ctx.team.key, session, 'go');
    expect(run).toMatchObject({ status: 'completed', steps: 3 });
    expect(names.filter((n) => n === 'exec.completed')).toHaveLength(3);
    expect(names.filter((n) => n === 'memory.searched')).toHaveLength(2);
    const [, second, third] = ctx.fake.chats().slice(before);
    const two = lastCalls(second);
    expect(two.names).toEqual(['python', 'memory_search']);
    expect(two.answers.map((a) => a.tool_call_id)).toEqual(two.ids);
    expect(two.answers[0]!.content).toContain('42');
    expect(two.answers[1]!.content).toContain('1200 degrees');
    const three = lastCalls(third);
    expect(three.answers.map((a) => a.tool_call_id)).toEqual(three.ids);
    expect(three.answers[2]!.content).toContain('42');
  });

  it('an ask-rule call in the middle pauses the run; once approved, it and the rest run in order', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools([{ match: 'NEEDS_OK', behavior: 'ask' }]));
    ctx.fake.script(
      { tool_calls: [python('print("one")'), python('# NEEDS_OK\nprint("two")'), python('print("three")')] },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'ok' } }] },
    );
    const before = ctx.fake.chats().length;
    const first = await converse(ctx.t, ctx.team.key, session, 'three steps', paused);
    expect(first.run.status).toBe('requires_action');
    expect(first.names.filter((n) => n === 'exec.completed')).toHaveLength(1);
    const a = await pending(session);
    expect(a.code).toContain('NEEDS_OK');
    expect(
      (await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'approve' } })).status,
    ).toBe(200);
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(events.filter((e) => e.event === 'exec.completed')).toHaveLength(3);
    const chats = ctx.fake.chats().slice(before);
    expect(chats).toHaveLength(2);
    const { ids, answers } = lastCalls(chats[1]);
    expect(answers.map((x) => x.tool_call_id)).toEqual(ids);
    expect(answers.map((x) => x.content.split('\n')[2])).toEqual(['one', 'two', 'three']);
  });

  it('a denied call is answered with the denial, and the next call goes on', async () => {
    const { session } = await sessionIn(
      ctx.t,
      ctx.team,
      tools([
        { match: 'FORBIDDEN', behavior: 'deny' },
        { match: 'ASK_ME', behavior: 'ask' },
      ]),
    );
    ctx.fake.script(
      {
        tool_calls: [
          python('print("FORBIDDEN")'),
          python('print("allowed")'),
          python('# ASK_ME\nprint("refused by a person")'),
          python('print("last")'),
        ],
      },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'ok' } }] },
    );
    const before = ctx.fake.chats().length;
    const first = await converse(ctx.t, ctx.team.key, session, 'try', paused);
    expect(first.run.status).toBe('requires_action');
    const a = await pending(session);
    expect(
      (
        await ctx.t.call('POST', `/v1/approvals/${a.id}`, {
          key: ctx.team.key,
          body: { decision: 'deny', reason: 'not today' },
        })
      ).status,
    ).toBe(200);
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    const { ids, answers } = lastCalls(ctx.fake.chats().slice(before)[1]);
    expect(answers.map((x) => x.tool_call_id)).toEqual(ids);
    expect(answers[0]!.content).toContain('[Denied by policy]');
    expect(answers[1]!.content).toContain('allowed');
    expect(answers[2]!.content).toContain('[User Denied]');
    expect(answers[2]!.content).toContain('not today');
    expect(answers[3]!.content).toContain('last');
  });

  it('finish alongside calls: the calls before it run, every call is answered, and the run completes', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools());
    ctx.fake.script({
      content: 'Wrapping up.',
      tool_calls: [
        python('print("before")'),
        { name: 'finish', arguments: { summary: 'All done.' } },
        python('print("after")'),
      ],
    });
    const { run, names } = await converse(ctx.t, ctx.team.key, session, 'finish it');
    expect(run.status).toBe('completed');
    expect(names.filter((n) => n === 'exec.completed')).toHaveLength(1);
    const transcript = (await ctx.t.call('GET', `/v1/sessions/${session}/messages`, { key: ctx.team.key })).body.data;
    const assistant = transcript.findIndex((m: any) => m.tool_calls);
    const ids = transcript[assistant].tool_calls.map((c: { id: string }) => c.id);
    const answers = transcript.slice(assistant + 1, assistant + 4);
    expect(answers.map((m: any) => [m.role, m.tool_call_id])).toEqual(ids.map((id: string) => ['tool', id]));
    expect(answers[0].content).toContain('before');
    expect(answers[2].content).toMatch(/Not run/);
    expect(transcript.at(-1)).toMatchObject({ role: 'assistant', content: 'All done.' });
    // The next run of the session sends that transcript, and a real endpoint accepts it.
    ctx.fake.script({ content: 'Nothing more to do.' });
    expect((await converse(ctx.t, ctx.team.key, session, 'anything else?')).run.status).toBe('completed');
  });

  it('a call with invalid arguments is answered with the violation; the others run', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools());
    ctx.fake.script(
      { tool_calls: [{ name: 'python', arguments: '{"code": ' }, python('print("fine")')] },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'ok' } }] },
    );
    const before = ctx.fake.chats().length;
    const { run } = await converse(ctx.t, ctx.team.key, session, 'go');
    expect(run.status).toBe('completed');
    const { ids, answers } = lastCalls(ctx.fake.chats().slice(before)[1]);
    expect(answers.map((x) => x.tool_call_id)).toEqual(ids);
    expect(answers[0]!.content).toContain('[Protocol Violation]');
    expect(answers[1]!.content).toContain('fine');
  });

  it('a run cancelled mid-message leaves a transcript the next run of the session can send', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools([{ match: 'WAIT', behavior: 'ask' }]));
    ctx.fake.script({ tool_calls: [python('print("one")'), python('# WAIT\nprint("two")'), python('print("three")')] });
    const first = await converse(ctx.t, ctx.team.key, session, 'start', paused);
    expect(first.run.status).toBe('requires_action');
    expect((await ctx.t.call('POST', `/v1/runs/${first.run.id}/cancel`, { key: ctx.team.key })).body.status).toBe(
      'cancelled',
    );
    ctx.fake.script({ content: 'Fresh start.' });
    const before = ctx.fake.chats().length;
    const next = await converse(ctx.t, ctx.team.key, session, 'start over');
    expect(next.run.status).toBe('completed');
    const { ids, answers } = lastCalls(ctx.fake.chats()[before]);
    expect(answers.map((x) => x.tool_call_id)).toEqual(ids);
    expect(answers[1]!.content).toMatch(/Not run/);
    expect(answers[2]!.content).toMatch(/Not run/);
  });

  it('a server that numbers its call ids from 0 in every message (or sends none) still gets one answer per call', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools());
    ctx.fake.script(
      {
        tool_calls: [
          { ...python('print("a")'), id: 'call_0' },
          { ...python('print("b")'), id: '' },
        ],
      },
      {
        tool_calls: [
          { ...python('print("c")'), id: 'call_0' },
          { ...python('print("d")'), id: '' },
        ],
      },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'ok' }, id: 'call_0' }] },
    );
    const before = ctx.fake.chats().length;
    expect((await converse(ctx.t, ctx.team.key, session, 'go')).run.status).toBe('completed');
    const last = ctx.fake.chats().slice(before)[2];
    const ids = last.messages.flatMap((m: any) => m.tool_calls?.map((c: { id: string }) => c.id) ?? []);
    expect(new Set(ids).size).toBe(4);
    expect(lastCalls(last).answers.map((x) => x.content.split('\n')[2])).toEqual(['c', 'd']);
  });

  it('an empty answer ends the run, and the next run of the session does not send it as an empty message', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, tools());
    ctx.fake.script({ content: '' });
    expect((await converse(ctx.t, ctx.team.key, session, 'say nothing')).run.status).toBe('completed');
    ctx.fake.script({ content: 'Now I speak.' });
    expect((await converse(ctx.t, ctx.team.key, session, 'say something')).run.status).toBe('completed');
  });
});
