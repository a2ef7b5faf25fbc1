import { describe, expect, it } from 'vitest';
import { createTestApp } from '../support/app.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil } from '../support/agent.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/** SSE frames (event, data, id fields in any order). */
function parseSse(text: string): { id: number; event: string; data: string }[] {
  return text
    .split('\n\n')
    .filter((f) => f.trim())
    .map((f) => Object.fromEntries(f.split('\n').map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 2)])))
    .filter((f) => f.id !== undefined)
    .map((f) => ({ id: Number(f.id), event: f.event!, data: f.data! }));
}

describe('the agent loop against a scripted OpenAI-compatible model', () => {
  const ctx = useAgentApp('agent');
  const auto = { approval: { mode: 'auto' } };

  it('thinks, runs Python, searches memory, observes and finishes (XML protocol)', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, auto);
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=MEMORY.md`, {
      key: ctx.team.key,
      raw: '# Core memory\n\n- The answer is usually 42.\n',
    });
    ctx.fake.script(
      {
        content:
          '<thinking>I will compute it.</thinking>\n<python>\n```python\nx = 6 * 7\nprint(f"x={x}")\n```\n</python>',
      },
      { content: '<thinking>Check memory.</thinking><memory_search>answer usually</memory_search>' },
      { content: '<thinking>Variables persist.</thinking><python>print(x + 1)</python>' },
      { content: '<thinking>Done.</thinking><finish>The answer is 42.</finish>' },
    );
    const { run, names, events } = await converse(ctx.t, ctx.team.key, session, 'What is six times seven?');
    expect(run).toMatchObject({ status: 'completed', steps: 4, model: 'fake-model' });
    expect(run.usage.prompt_tokens).toBe(400);
    expect(names.slice(0, 5)).toEqual([
      'run.created',
      'message.created',
      'run.in_progress',
      'step.created',
      'thinking',
    ]);
    expect(names).toEqual(
      expect.arrayContaining([
        'code.proposed',
        'exec.started',
        'exec.output',
        'exec.completed',
        'memory.searched',
        'run.completed',
      ]),
    );
    expect(names.at(-2)).toBe('message.created');
    expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1));
    const outputs = events
      .filter((e) => e.event === 'exec.output')
      .map((e) => (e.data as { data: string }).data)
      .join('');
    expect(outputs).toBe('x=42\n43\n');

    const chats = ctx.fake.chats();
    const system = chats[0].messages[0].content as string;
    expect(system).toContain('<Core_Memory path="/workspace/MEMORY.md" budget="1/50 entries');
    expect(system).toContain('- memory-keeping: How to add, merge and prune entries');
    expect(system).toContain('/workspace/skills/builtin/memory-keeping/SKILL.md');
    expect(system).toContain('<Knowledge_Index>');
    expect(system).toContain('<Environment>');
    expect(system).not.toMatch(/\{(memory_path|workspace|skills_path)\}/);
    const feedback = chats[1].messages.at(-1);
    expect(feedback).toMatchObject({ role: 'user' });
    expect(feedback.content).toContain('[Execution Success]');
    expect(feedback.content).toContain('x=42');
    expect(chats[2].messages.at(-1).content).toContain('The answer is usually 42.');
    expect(chats[3].messages.at(-1).content).toContain('43');

    const transcript = await ctx.t.call('GET', `/v1/sessions/${session}/messages`, { key: ctx.team.key });
    expect(transcript.body.data[0]).toMatchObject({ role: 'user', content: 'What is six times seven?' });
    expect(transcript.body.data.at(-1)).toMatchObject({ role: 'assistant', content: 'The answer is 42.' });
    // The agent's variables are the session's: direct exec sees them too.
    expect((await exec(ctx.t, ctx.team.key, session, 'x')).stdout).toBe('42\n');
    const usage = await ctx.t.call('GET', '/v1/usage?group_by=model', { key: ctx.team.key });
    expect(usage.body.data.find((u: { key: string }) => u.key === 'fake-model')).toMatchObject({
      calls: 4,
      prompt_tokens: 400,
    });
    // The message's audit event is written with the run (one commit), by the key that sent it.
    const audit = await ctx.t.call('GET', '/v1/audit?action=session.message&limit=100', { key: ctx.team.key });
    const [posted] = audit.body.data.filter((e: { resource_id: string }) => e.resource_id === run.id);
    expect(posted).toMatchObject({
      team_id: ctx.team.id,
      resource_type: 'run',
      actor_role: 'owner',
      after: { session_id: session },
    });
    expect(posted.actor).toMatch(/^key_/);
    expect(posted.request_id).toBeTruthy();
    expect(audit.body.data.filter((e: { resource_id: string }) => e.resource_id === run.id)).toHaveLength(1);
  });

  it('corrects a reply without an action tag, and fails clearly after three in a row', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    ctx.fake.script({ content: 'Sure, let me think about that.' }, { content: '<finish>Recovered.</finish>' });
    const ok = await converse(ctx.t, ctx.team.key, session, 'hello');
    expect(ok.run.status).toBe('completed');
    const chats = ctx.fake.chats();
    expect(chats.at(-1).messages.at(-1).content).toMatch(/\[Protocol Violation\].*<python>/);
    ctx.fake.script(...Array.from({ length: 4 }, () => ({ content: 'no tags at all' })));
    const bad = await converse(ctx.t, ctx.team.key, session, 'again');
    expect(bad.run.status).toBe('failed');
    expect(bad.run.error).toMatchObject({ code: 'protocol_violation' });
    expect(bad.run.error.message).toMatch(/4 times in a row/);
  });

  it('speaks native tool calling when the workspace says so', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { ...auto, protocol: 'tools' });
    ctx.fake.script(
      { content: 'Computing.', tool_calls: [{ name: 'python', arguments: { code: 'print(sum(range(5)))' } }] },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'The sum is 10.' } }] },
    );
    const { run } = await converse(ctx.t, ctx.team.key, session, 'sum 0..4');
    expect(run.status).toBe('completed');
    const chats = ctx.fake.chats();
    const second = chats.at(-1);
    expect(second.tools.map((x: { function: { name: string } }) => x.function.name)).toEqual([
      'python',
      'memory_search',
      'undo_evolution',
      'finish',
    ]);
    const assistant = second.messages.at(-2);
    const tool = second.messages.at(-1);
    expect(assistant.tool_calls[0].function).toMatchObject({
      name: 'python',
      arguments: '{"code":"print(sum(range(5)))"}',
    });
    expect(tool).toMatchObject({ role: 'tool', tool_call_id: assistant.tool_calls[0].id });
    expect(tool.content).toContain('10');
    const transcript = await ctx.t.call('GET', `/v1/sessions/${session}/messages`, { key: ctx.team.key });
    expect(transcript.body.data.at(-1)).toMatchObject({ role: 'assistant', content: 'The sum is 10.' });
  });

  it('retries a 429, and fails with model_unavailable when the endpoint keeps failing', async () => {
    const retrying = await createTestApp({ model: { baseURL: ctx.fake.url, model: 'fake-model', maxRetries: 1 } });
    try {
      const tm = await retrying.team('retry');
      const { session } = await sessionIn(retrying, tm, auto);
      ctx.fake.script({ status: 429, error: { message: 'slow down' } }, { content: '<finish>after retry</finish>' });
      expect((await converse(retrying, tm.key, session, 'hi')).run.status).toBe('completed');
      ctx.fake.script({ status: 500, error: { message: 'boom' } }, { status: 503, error: { message: 'still down' } });
      const failed = await converse(retrying, tm.key, session, 'hi again');
      expect(failed.run).toMatchObject({ status: 'failed', error: { code: 'model_unavailable' } });
      expect(failed.run.error.message).toMatch(/503/);
      expect(ctx.fake.pending()).toBe(0);
    } finally {
      await retrying.close();
    }
  });

  it('ends a runaway run at max_steps', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { ...auto, max_steps: 2 });
    ctx.fake.script({ content: '<python>print(1)</python>' }, { content: '<python>print(2)</python>' });
    const { run } = await converse(ctx.t, ctx.team.key, session, 'loop');
    expect(run).toMatchObject({ status: 'failed', steps: 2, error: { code: 'max_steps' } });
  });

  it('refuses a second message while a run is active (409 session_busy), and cancel stops the model call', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    ctx.fake.script({ hang: true });
    const before = ctx.fake.chats().length;
    const first = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'wait' },
    });
    await ctx.fake.chatRequests(before + 1);
    const second = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'me too' },
    });
    expect(second.status).toBe(409);
    expect(second.body.error).toMatchObject({ code: 'session_busy', run_id: first.body.run.id });
    await ctx.t.call('POST', `/v1/runs/${first.body.run.id}/cancel`, { key: ctx.team.key });
    const events = await eventsUntil(ctx.t, first.body.run.id, ['run.cancelled', 'run.failed', 'run.completed']);
    expect(events.at(-1)!.event).toBe('run.cancelled');
    expect((await ctx.t.call('GET', `/v1/runs/${first.body.run.id}`, { key: ctx.team.key })).body.status).toBe(
      'cancelled',
    );
  });

  it('cancel during a long execution kills the code; the sandbox keeps working', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    ctx.fake.script({
      content: '<python>import time\nprint("started", flush=True)\nwhile True:\n    time.sleep(0.05)</python>',
    });
    const r = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'spin' },
    });
    await eventsUntil(ctx.t, r.body.run.id, ['exec.output']);
    await ctx.t.call('POST', `/v1/runs/${r.body.run.id}/cancel`, { key: ctx.team.key });
    const events = await eventsUntil(ctx.t, r.body.run.id, ['run.cancelled', 'run.failed', 'run.completed']);
    expect(events.at(-1)!.event).toBe('run.cancelled');
    const completed = events.find((e) => e.event === 'exec.completed');
    expect((completed!.data as { error: { type: string } }).error.type).toBe('Cancelled');
    expect((await exec(ctx.t, ctx.team.key, session, 'print("alive")')).stdout).toBe('alive\n');
  });

  it('streams the run over SSE and resumes from Last-Event-ID without loss or duplicates', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    ctx.fake.script({ content: '<python>print("a")</python>' }, { content: '<finish>done</finish>' });
    const res = await ctx.t.app.request(`/v1/sessions/${session}/messages?stream=true`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ctx.team.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ content: 'stream it' }),
    });
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const text = await res.text();
    const frames = parseSse(text);
    expect(frames.map((f) => f.id)).toEqual(frames.map((_, i) => i + 1));
    expect(frames.at(-1)!.event).toBe('run.completed');
    const runId = JSON.parse(frames.find((f) => f.event === 'run.created')!.data).run_id;
    const resumed = await ctx.t.app.request(`/v1/runs/${runId}/events`, {
      headers: { authorization: `Bearer ${ctx.team.key}`, 'last-event-id': '4' },
    });
    const rest = parseSse(await resumed.text()).map((f) => f.id);
    expect(rest).toEqual(frames.filter((f) => f.id > 4).map((f) => f.id));
    const json = await ctx.t.call('GET', `/v1/runs/${runId}/events?after=2`, {
      key: ctx.team.key,
      headers: { accept: 'application/json' },
    });
    expect(json.body.data.map((e: { id: number }) => e.id)).toEqual(frames.filter((f) => f.id > 2).map((f) => f.id));
  });

  it('a client that disconnects mid-run and reconnects with Last-Event-ID gets the rest, nothing twice', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script(
      { content: '<thinking>needs approval</thinking><python>print("later")</python>' },
      { content: '<finish>resumed fine</finish>' },
    );
    const abort = new AbortController();
    const res = await ctx.t.app.request(`/v1/sessions/${session}/messages?stream=true`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ctx.team.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ content: 'pause in the middle' }),
      signal: abort.signal,
    });
    // Read until the run pauses for its approval, then drop the connection.
    const reader = res.body!.getReader();
    let text = '';
    while (!text.includes('event: run.requires_action')) text += new TextDecoder().decode((await reader.read()).value);
    abort.abort();
    const first = parseSse(text.slice(0, text.lastIndexOf('\n\n') + 2));
    const lastSeen = first.at(-1)!.id;
    const runId = JSON.parse(first.find((f) => f.event === 'run.created')!.data).run_id;
    const approval = (await ctx.t.call('GET', '/v1/approvals?status=pending', { key: ctx.team.key })).body.data.find(
      (a: { run_id: string }) => a.run_id === runId,
    );
    await ctx.t.call('POST', `/v1/approvals/${approval.id}`, { key: ctx.team.key, body: { decision: 'approve' } });
    const resumed = await ctx.t.app.request(`/v1/runs/${runId}/events`, {
      headers: { authorization: `Bearer ${ctx.team.key}`, 'last-event-id': String(lastSeen) },
    });
    const rest = parseSse(await resumed.text());
    const all = [...first, ...rest];
    expect(all.map((f) => f.id)).toEqual(all.map((_, i) => i + 1));
    expect(rest[0]!.event).toBe('approval.resolved');
    expect(rest.at(-1)!.event).toBe('run.completed');
    const stored = await ctx.t.call('GET', `/v1/runs/${runId}/events`, {
      key: ctx.team.key,
      headers: { accept: 'application/json' },
    });
    expect(stored.body.data.map((e: { event: string }) => e.event)).toEqual(all.map((f) => f.event));
  });

  it('without a model configured, says so clearly; everything else still works', async () => {
    const bare = await createTestApp();
    try {
      const tm = await bare.team('no-model');
      const { session } = await sessionIn(bare, tm, auto);
      const r = await bare.call('POST', `/v1/sessions/${session}/messages`, { key: tm.key, body: { content: 'hi' } });
      expect(r.status).toBe(503);
      expect(r.body.error.code).toBe('model_unavailable');
      expect(r.body.error.message).toMatch(/no model endpoint.*OPENAI_BASE_URL.*restarts it/);
      // A workspace's model cannot help without an endpoint, and the message does not suggest it.
      expect(r.body.error.message).not.toMatch(/set the workspace setting/);
      expect((await exec(bare, tm.key, session, 'print(2)')).stdout).toBe('2\n');
    } finally {
      await bare.close();
    }
    // With an endpoint but no model named, the workspace's "model" setting is the fix, and works.
    const unnamed = await createTestApp({
      sandbox: false,
      env: { OPENAI_BASE_URL: ctx.fake.url, OPENAI_API_KEY: 'k' },
    });
    try {
      const tm = await unnamed.team('no-model-name');
      const ws = (await unnamed.call('POST', '/v1/workspaces', { key: tm.key, body: { name: 'w' } })).body.id;
      const session = (await unnamed.call('POST', `/v1/workspaces/${ws}/sessions`, { key: tm.key, body: {} })).body.id;
      const post = () =>
        unnamed.call('POST', `/v1/sessions/${session}/messages`, { key: tm.key, body: { content: 'hi' } });
      const r = await post();
      expect(r.status).toBe(503);
      expect(r.body.error.message).toMatch(/set the workspace setting "model", or KILN_MODEL/);
      const set = await unnamed.call('PATCH', `/v1/workspaces/${ws}`, {
        key: tm.key,
        body: { settings: { model: 'fake-model' } },
      });
      expect(set.status).toBe(200);
      ctx.fake.script({ content: '<finish>named</finish>' });
      expect((await post()).status).toBe(202);
    } finally {
      await unnamed.close();
    }
  });
});
