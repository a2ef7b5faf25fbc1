import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { McpServer } from '@modelcontextprotocol/server';
import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { auditEvents, runEvents } from '../../apps/api/src/db/schema/index.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil, PAUSED, pendingApproval, TERMINAL } from '../support/agent.ts';
import { createTestApp } from '../support/app.ts';
import { startFakeOpenAI } from '../support/fake-openai.ts';
import { serveMcp } from '../support/mcp.ts';
import { sessionIn } from '../support/sandbox.ts';

/** The value of the workspace secret the MCP server's Authorization header is made of. */
const TOKEN = `ghp_${randomBytes(18).toString('hex')}`;
const AUTH = 'Bearer ${secrets.GH_TOKEN}';

/** An MCP server made with the SDK (Streamable HTTP on 127.0.0.1), recording what it was sent. */
async function startMcpServer() {
  const authorizations: (string | null)[] = [];
  const calls: { tool: string; args: unknown }[] = [];
  const called = new EventEmitter();
  let lastAuth: string | null = null;
  const served = await serveMcp(
    () => {
      const s = new McpServer({ name: 'test-tracker', version: '1.0.0' });
      s.registerTool(
        'create_issue',
        { description: 'Create an issue in the tracker', inputSchema: z.object({ title: z.string() }) },
        async ({ title }) => {
          calls.push({ tool: 'create_issue', args: { title } });
          return { content: [{ type: 'text', text: `created issue "${title}" as #7` }] };
        },
      );
      // A careless (or hostile) server that echoes the credential it was sent.
      s.registerTool('whoami', { description: 'Who the caller is' }, async () => {
        calls.push({ tool: 'whoami', args: {} });
        return { content: [{ type: 'text', text: `you sent ${lastAuth}` }] };
      });
      // Never answers (until the client gives up).
      s.registerTool('sleep', { description: 'Sleeps forever' }, async () => {
        calls.push({ tool: 'sleep', args: {} });
        called.emit('sleep');
        return new Promise<never>(() => undefined);
      });
      return s;
    },
    (req) => {
      lastAuth = req.headers.get('authorization');
      authorizations.push(lastAuth);
    },
  );
  return {
    url: served.url,
    authorizations,
    calls,
    /** Resolves when the next call of `sleep` arrives. */
    sleeping: () => new Promise<void>((r) => called.once('sleep', () => r())),
    close: () => served.close(true),
    closeAll: served.closeAll,
  };
}

/** An HTTP server that accepts every request and never answers it. */
async function startHangingServer() {
  const sockets = new Set<Socket>();
  let requests = 0;
  const server = createServer(() => {
    requests++;
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    requests: () => requests,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** A port nothing listens on (opened, then closed). */
async function closedPortUrl() {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return `http://127.0.0.1:${port}/mcp`;
}

/** A hostile MCP server: too many tools, odd names, long descriptions, wild schemas, oversized results. */
async function startHostileServer() {
  return serveMcp(() => {
    const s = new McpServer({ name: 'hostile', version: '1.0.0' });
    s.registerTool('big', { description: 'a large answer' }, async () => ({
      content: [{ type: 'text', text: 'x'.repeat(100_000) }],
    }));
    s.registerTool('huge', { description: 'a response over the byte bound' }, async () => ({
      content: [{ type: 'text', text: 'y'.repeat(2 * 1024 * 1024) }],
    }));
    for (let i = 0; i < 60; i++)
      s.registerTool(
        `tool_${i}`,
        { description: 'd'.repeat(10_000), inputSchema: z.object({ a: z.string() }) },
        async () => ({
          content: [{ type: 'text', text: 'ok' }],
        }),
      );
    return s;
  });
}

/** An HTTP server that answers every request with 200 and text that is not MCP. */
async function startGarbageServer() {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{"this is": "not json-rpc"');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

type Mcp = Awaited<ReturnType<typeof startMcpServer>>;

describe('the agent as an MCP client', () => {
  const ctx = useAgentApp('mcp-client', {
    sandbox: false,
    env: { KILN_OUTBOUND_ALLOW: '127.0.0.1', KILN_MCP_TIMEOUT_S: '2' },
  });
  let mcp: Mcp;
  let hanging: Awaited<ReturnType<typeof startHangingServer>>;

  beforeAll(async () => {
    mcp = await startMcpServer();
    hanging = await startHangingServer();
  });
  afterAll(async () => {
    await hanging?.close();
    mcp?.closeAll();
    await mcp?.close();
  });

  /** A session in a new workspace with these MCP servers (and the GH_TOKEN secret), policy `auto` unless given. */
  async function sessionWith(servers: unknown[], settings: Record<string, unknown> = {}) {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, {
      approval: { mode: 'auto', rules: [] },
      mcp_servers: servers,
      ...settings,
    });
    const put = await ctx.t.call('PUT', `/v1/workspaces/${ws}/secrets/GH_TOKEN`, {
      key: ctx.team.key,
      body: { value: TOKEN },
    });
    expect(put.status).toBeLessThan(300);
    return { ws, session };
  }
  const tracker = () => ({ name: 'gh', url: mcp.url, headers: { Authorization: AUTH } });

  /** Nothing the run stored, logged or audited holds the secret's value. */
  async function expectNoSecret(runId: string) {
    const events = await ctx.t.database.db.select().from(runEvents).where(eq(runEvents.runId, runId));
    expect(events.length).toBeGreaterThan(0);
    expect(JSON.stringify(events)).not.toContain(TOKEN);
    const audits = await ctx.t.database.db.select().from(auditEvents);
    expect(JSON.stringify(audits)).not.toContain(TOKEN);
    expect(ctx.t.logText()).not.toContain(TOKEN);
    const messages = JSON.stringify(ctx.fake.chats());
    expect(messages).not.toContain(TOKEN);
  }

  it('XML: the prompt lists the tools, <tool> calls one with the secret in its header, recorded and audited', async () => {
    const { session } = await sessionWith([tracker()]);
    const before = mcp.calls.length;
    ctx.fake.script(
      { content: '<thinking>file it</thinking><tool name="gh.create_issue">{"title": "Login is broken"}</tool>' },
      { content: '<tool name="gh.whoami"></tool>' },
      { content: '<finish>filed #7</finish>' },
    );
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'file a bug');
    expect(run.status).toBe('completed');
    expect(mcp.calls.slice(before)).toEqual([
      { tool: 'create_issue', args: { title: 'Login is broken' } },
      { tool: 'whoami', args: {} },
    ]);
    // The server got the secret's value, filled in from ${secrets.GH_TOKEN}.
    expect(mcp.authorizations.at(-1)).toBe(`Bearer ${TOKEN}`);
    const chats = ctx.fake.chats().slice(-3);
    const system = chats[0].messages[0].content as string;
    expect(system).toContain('<MCP_Tools>');
    expect(system).toContain('- gh.create_issue: Create an issue in the tracker');
    expect(system).toContain('"title":{"type":"string"}');
    expect(system).toContain('<tool name="server.tool">');
    expect(chats[0].tools).toBeUndefined();
    expect(chats[1].messages.at(-1).content).toBe(
      'Kiln System: [Tool Result] gh.create_issue\ncreated issue "Login is broken" as #7',
    );
    // The server echoed the credential: the model sees it masked.
    expect(chats[2].messages.at(-1).content).toContain('you sent Bearer [secret:GH_TOKEN]');
    const calls = events.filter((e) => e.event === 'tool.call').map((e) => e.data);
    expect(calls).toEqual([
      { server: 'gh', tool: 'create_issue', arguments: { title: 'Login is broken' }, decision: 'allow' },
      { server: 'gh', tool: 'whoami', arguments: {}, decision: 'allow' },
    ]);
    const results = events.filter((e) => e.event === 'tool.result').map((e) => e.data as Record<string, unknown>);
    expect(results[0]).toMatchObject({ server: 'gh', tool: 'create_issue', error: null, is_error: false });
    expect(typeof results[0]!.duration_ms).toBe('number');
    const audited = await ctx.t.database.db
      .select()
      .from(auditEvents)
      .where(and(eq(auditEvents.action, 'agent.tool_call'), eq(auditEvents.resourceId, run.id)));
    expect(audited).toHaveLength(2);
    expect(audited[0]).toMatchObject({ actorRole: 'agent', teamId: ctx.team.id, resourceType: 'run' });
    expect(audited.map((a) => (a.after as { tool: string }).tool).sort()).toEqual(['create_issue', 'whoami']);
    await expectNoSecret(run.id);
  });

  it('tool calling: the tools go in the request as functions server__tool; a call is made and answered', async () => {
    const { session } = await sessionWith([tracker()], { protocol: 'tools' });
    const before = mcp.calls.length;
    ctx.fake.script(
      { tool_calls: [{ name: 'gh__create_issue', arguments: { title: 'Native' } }] },
      { content: 'Filed it.' },
    );
    const { run } = await converse(ctx.t, ctx.team.key, session, 'file it');
    expect(run.status).toBe('completed');
    expect(mcp.calls.slice(before)).toEqual([{ tool: 'create_issue', args: { title: 'Native' } }]);
    const [first, second] = ctx.fake.chats().slice(-2);
    const fn = first.tools.find((t: { function: { name: string } }) => t.function.name === 'gh__create_issue');
    expect(fn.function.parameters).toMatchObject({
      type: 'object',
      properties: { title: { type: 'string' } },
      required: ['title'],
    });
    expect(fn.function.description).toContain('Create an issue in the tracker');
    expect(first.tools.map((t: { function: { name: string } }) => t.function.name)).toEqual(
      expect.arrayContaining(['python', 'finish', 'gh__whoami', 'gh__sleep']),
    );
    const answer = second.messages.at(-1);
    expect(answer.role).toBe('tool');
    expect(answer.content).toContain('created issue "Native" as #7');
    await expectNoSecret(run.id);
  });

  it('malformed arguments: the model is told clearly in both protocols, and nothing is called', async () => {
    const before = mcp.calls.length;
    const xml = await sessionWith([tracker()]);
    ctx.fake.script(
      { content: '<tool name="gh.create_issue">{"title": </tool>' },
      { content: '<tool name="gh.create_issue">["not", "an", "object"]</tool>' },
      { content: '<tool name="create_issue">{}</tool>' },
      { content: '<finish>gave up</finish>' },
    );
    const a = await converse(ctx.t, ctx.team.key, xml.session, 'try');
    expect(a.run.status).toBe('completed');
    const told = ctx.fake
      .chats()
      .slice(-3)
      .map((c) => c.messages.at(-1).content as string);
    expect(told[0]).toMatch(
      /^Kiln System: \[Tool Error\] gh\.create_issue was not made: the arguments are not valid JSON/,
    );
    expect(told[1]).toContain('the arguments must be one JSON object');
    expect(told[2]).toContain('needs name="server.tool"');

    const native = await sessionWith([tracker()], { protocol: 'tools' });
    ctx.fake.script(
      { tool_calls: [{ name: 'gh__create_issue', arguments: '{"title": ' }] },
      { tool_calls: [{ name: 'gh__no_such_tool', arguments: {} }] },
      { content: 'gave up' },
    );
    const b = await converse(ctx.t, ctx.team.key, native.session, 'try');
    expect(b.run.status).toBe('completed');
    const [second, third] = ctx.fake.chats().slice(-2);
    expect(second.messages.at(-1)).toMatchObject({ role: 'tool' });
    expect(second.messages.at(-1).content).toContain('gh.create_issue was not made: the arguments are not valid JSON');
    expect(third.messages.at(-1).content).toContain('unknown tool gh__no_such_tool');
    expect(mcp.calls.length).toBe(before);
  });

  it('a rule naming the tool asks: approve makes the call, deny tells the model and makes none', async () => {
    const rules = [{ tool: 'gh.create_issue', behavior: 'ask' }];
    const { session } = await sessionWith([tracker()], { approval: { mode: 'auto', rules } });
    const before = mcp.calls.length;
    ctx.fake.script(
      { content: '<tool name="gh.create_issue">{"title": "Needs a yes"}</tool>' },
      { content: '<finish>filed</finish>' },
    );
    const first = await converse(ctx.t, ctx.team.key, session, 'file it', PAUSED);
    expect(first.run.status).toBe('requires_action');
    expect(first.events.find((e) => e.event === 'tool.call')!.data).toMatchObject({ decision: 'ask' });
    expect(mcp.calls.length).toBe(before);
    const a = await pendingApproval(ctx.t, ctx.team.key, session);
    expect(a.code).toBe('Kiln MCP tool call: gh.create_issue\nArguments:\n{\n  "title": "Needs a yes"\n}');
    const ok = await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'approve' } });
    expect(ok.status).toBe(200);
    const done = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(done.at(-1)!.event).toBe('run.completed');
    expect(done.map((e) => e.event)).toEqual(expect.arrayContaining(['approval.resolved', 'tool.result']));
    expect(mcp.calls.slice(before)).toEqual([{ tool: 'create_issue', args: { title: 'Needs a yes' } }]);
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain('created issue "Needs a yes"');

    // The next call of the same tool asks again; a person refuses it.
    ctx.fake.script(
      { content: '<tool name="gh.create_issue">{"title": "Refused"}</tool>' },
      { content: '<finish>ok, not filed</finish>' },
    );
    const second = await converse(ctx.t, ctx.team.key, session, 'file another', PAUSED);
    expect(second.run.status).toBe('requires_action');
    const b = await pendingApproval(ctx.t, ctx.team.key, session);
    await ctx.t.call('POST', `/v1/approvals/${b.id}`, {
      key: ctx.team.key,
      body: { decision: 'deny', reason: 'not this one' },
    });
    const ended = await eventsUntil(ctx.t, second.run.id, TERMINAL);
    expect(ended.at(-1)!.event).toBe('run.completed');
    expect(ended.map((e) => e.event)).not.toContain('tool.result');
    const told = ctx.fake.chats().at(-1).messages.at(-1).content as string;
    expect(told).toContain('[User Denied] A person refused this tool call: not this one');
    expect(mcp.calls.length).toBe(before + 1);
  });

  it('tool calling: a call that needs approval pauses; once approved the tool message answers that call', async () => {
    const rules = [{ tool: 'gh.*', behavior: 'ask' }];
    const { session } = await sessionWith([tracker()], { protocol: 'tools', approval: { mode: 'auto', rules } });
    const before = mcp.calls.length;
    ctx.fake.script(
      { tool_calls: [{ name: 'gh__create_issue', arguments: { title: 'Native approval' }, id: 'call_native_1' }] },
      { content: 'Filed.' },
    );
    const first = await converse(ctx.t, ctx.team.key, session, 'file it', PAUSED);
    expect(first.run.status).toBe('requires_action');
    const a = await pendingApproval(ctx.t, ctx.team.key, session);
    expect(a.code).toContain('Kiln MCP tool call: gh.create_issue');
    await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'approve' } });
    const done = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(done.at(-1)!.event).toBe('run.completed');
    expect(mcp.calls.slice(before)).toEqual([{ tool: 'create_issue', args: { title: 'Native approval' } }]);
    const answer = ctx.fake.chats().at(-1).messages.at(-1);
    expect(answer).toMatchObject({ role: 'tool', tool_call_id: 'call_native_1' });
    expect(answer.content).toContain('created issue "Native approval"');
  });

  it('a deny rule with a pattern on the arguments refuses the call without asking', async () => {
    const rules = [{ tool: 'gh.*', match: '"title":"prod', behavior: 'deny' }];
    const { session } = await sessionWith([tracker()], { approval: { mode: 'ask', rules } });
    const before = mcp.calls.length;
    ctx.fake.script(
      { content: '<tool name="gh.create_issue">{"title": "prod is down"}</tool>' },
      { content: '<finish>not allowed</finish>' },
    );
    const { run } = await converse(ctx.t, ctx.team.key, session, 'file it');
    expect(run.status).toBe('completed');
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain('[Denied by policy] This tool call was not made');
    expect(mcp.calls.length).toBe(before);
  });

  it('a server that is down, one that never answers and a call that hangs give errors; the run completes', async () => {
    const down = await closedPortUrl();
    const servers = [{ name: 'down', url: down }, { name: 'slow', url: hanging.url }, tracker()];
    const { session } = await sessionWith(servers);
    ctx.fake.script(
      { content: '<tool name="down.anything">{}</tool>' },
      { content: '<tool name="slow.anything">{}</tool>' },
      { content: '<tool name="gh.sleep">{}</tool>' },
      { content: '<finish>the servers are unwell</finish>' },
    );
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'use them');
    expect(run.status).toBe('completed');
    const chats = ctx.fake.chats().slice(-4);
    const system = chats[0].messages[0].content as string;
    expect(system).toMatch(/server down is unavailable now: could not reach the server/);
    expect(system).toMatch(/server slow is unavailable now: connecting to slow took longer than 2 s/);
    expect(system).toContain('- gh.create_issue');
    const told = chats.slice(1).map((c) => c.messages.at(-1).content as string);
    expect(told[0]).toMatch(/^Kiln System: \[Tool Error\] down\.anything gave no result: could not reach the server/);
    expect(told[1]).toMatch(
      /^Kiln System: \[Tool Error\] slow\.anything gave no result: connecting to slow took longer than 2 s/,
    );
    expect(told[2]).toMatch(
      /^Kiln System: \[Tool Error\] gh\.sleep gave no result: the call of gh\.sleep took longer than 2 s/,
    );
    const results = events.filter((e) => e.event === 'tool.result').map((e) => e.data as { error: string | null });
    expect(results).toHaveLength(3);
    expect(results.every((r) => typeof r.error === 'string' && r.error.length > 0)).toBe(true);
    expect(hanging.requests()).toBeGreaterThan(0);
  });

  it('a hostile server is bounded: the request stays valid, big results are cut, oversized ones and garbage are errors', async () => {
    const hostile = await startHostileServer();
    const garbage = await startGarbageServer();
    try {
      const { session } = await sessionWith(
        [
          { name: 'evil', url: hostile.url },
          { name: 'junk', url: garbage.url },
        ],
        { protocol: 'tools' },
      );
      ctx.fake.script(
        { tool_calls: [{ name: 'evil__big', arguments: {} }] },
        { tool_calls: [{ name: 'evil__huge', arguments: {} }] },
        { content: 'done' },
      );
      const { run } = await converse(ctx.t, ctx.team.key, session, 'go');
      expect(run.status).toBe('completed');
      const [first, second, third] = ctx.fake.chats().slice(-3);
      // The strict fake accepted every request (useAgentApp checks no refusal): names and schemas are valid.
      const names = first.tools.map((t: { function: { name: string } }) => t.function.name) as string[];
      const mcpNames = names.filter((n) => n.startsWith('evil__'));
      expect(mcpNames.length).toBeLessThanOrEqual(32);
      expect(mcpNames).toContain('evil__big');
      expect(JSON.stringify(first.tools).length).toBeLessThan(64 * 1024);
      const system = first.messages[0].content as string;
      expect(system).toMatch(/server evil: \d+ tool\(s\) not offered/);
      expect(system).toMatch(/server junk is unavailable now: /);
      const big = second.messages.at(-1).content as string;
      expect(big).toContain('[truncated: the result had 100000 characters]');
      expect(big.length).toBeLessThan(17_000);
      expect(third.messages.at(-1).content).toMatch(/evil\.huge gave no result: .*more than 1048576 bytes/);
    } finally {
      await hostile.close();
      await garbage.close();
    }
  });

  it('bad settings are a 400 envelope and change nothing; an unknown secret is a clear tool error at call time', async () => {
    const { ws } = await sessionWith([tracker()]);
    const bad: [string, unknown[]][] = [
      ['not a URL', [{ name: 'x', url: 'not a url' }]],
      ['not http(s)', [{ name: 'x', url: 'ftp://example.com/mcp' }]],
      ['credentials in the URL', [{ name: 'x', url: 'https://user:pw@example.com/mcp' }]],
      [
        'duplicate names',
        [
          { name: 'x', url: 'https://example.com/a' },
          { name: 'x', url: 'https://example.com/b' },
        ],
      ],
      ['a name with __', [{ name: 'a__b', url: 'https://example.com/mcp' }]],
      ['an upper-case name', [{ name: 'GitHub', url: 'https://example.com/mcp' }]],
      ['too many', Array.from({ length: 9 }, (_, i) => ({ name: `s${i}`, url: 'https://example.com/mcp' }))],
      [
        'a literal credential',
        [{ name: 'x', url: 'https://example.com/mcp', headers: { Authorization: 'Bearer abc' } }],
      ],
      ['a header with a line break', [{ name: 'x', url: 'https://example.com/mcp', headers: { 'X-A': 'a\r\nb' } }]],
      ['a bad reference', [{ name: 'x', url: 'https://example.com/mcp', headers: { 'X-A': '${env.HOME}' } }]],
      ['a bad header name', [{ name: 'x', url: 'https://example.com/mcp', headers: { 'X A': 'v' } }]],
    ];
    for (const [why, servers] of bad) {
      const r = await ctx.t.call('PATCH', `/v1/workspaces/${ws}`, {
        key: ctx.team.key,
        body: { settings: { mcp_servers: servers } },
      });
      expect(r.status, why).toBe(400);
      expect(r.body.error.code, why).toBe('invalid_request');
    }
    const badRule = await ctx.t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: ctx.team.key,
      body: { settings: { approval: { rules: [{ tool: 'gh create', behavior: 'ask' }] } } },
    });
    expect(badRule.status).toBe(400);
    const after = await ctx.t.call('GET', `/v1/workspaces/${ws}`, { key: ctx.team.key });
    expect(after.body.settings.mcp_servers).toEqual([tracker()]);
    expect(after.body.settings.approval.rules).toEqual([]);

    const missing = await sessionWith([
      { name: 'gh', url: mcp.url, headers: { Authorization: 'Bearer ${secrets.NOT_SET}' } },
    ]);
    const before = mcp.authorizations.length;
    ctx.fake.script(
      { content: '<tool name="gh.create_issue">{"title": "x"}</tool>' },
      { content: '<finish>no</finish>' },
    );
    const { run } = await converse(ctx.t, ctx.team.key, missing.session, 'try');
    expect(run.status).toBe('completed');
    const chats = ctx.fake.chats().slice(-2);
    expect(chats[0].messages[0].content).toContain(
      'server gh is unavailable now: header Authorization references the secret NOT_SET, which this workspace does not have',
    );
    expect(chats[1].messages.at(-1).content).toContain(
      '[Tool Error] gh.create_issue gave no result: header Authorization references the secret NOT_SET',
    );
    expect(mcp.authorizations.length).toBe(before);
  });

  it('another team cannot use a workspace’s MCP settings: its workspace is not found', async () => {
    const { ws } = await sessionWith([tracker()]);
    const other = await ctx.t.team('mcp-other');
    const r = await ctx.t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: other.key,
      body: { settings: { mcp_servers: [] } },
    });
    expect(r.status).toBe(404);
    const after = await ctx.t.call('GET', `/v1/workspaces/${ws}`, { key: ctx.team.key });
    expect(after.body.settings.mcp_servers).toHaveLength(1);
  });

  it('a run cancelled while a call hangs ends at once, long before the MCP deadline', async () => {
    const fake = await startFakeOpenAI();
    const t = await createTestApp({
      sandbox: false,
      model: { baseURL: fake.url, model: 'fake-model' },
      env: { KILN_OUTBOUND_ALLOW: '127.0.0.1', KILN_MCP_TIMEOUT_S: '600' },
    });
    try {
      const team = await t.team('mcp-cancel');
      const { session } = await sessionIn(t, team, {
        approval: { mode: 'auto', rules: [] },
        mcp_servers: [{ name: 'gh', url: mcp.url }],
      });
      fake.script({ content: '<tool name="gh.sleep">{}</tool>' });
      const sleeping = mcp.sleeping();
      const r = await t.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'wait' } });
      expect(r.status).toBe(202);
      await sleeping;
      const cancel = await t.call('POST', `/v1/runs/${r.body.run.id}/cancel`, { key: team.key });
      expect(cancel.status).toBeLessThan(300);
      const events = await eventsUntil(t, r.body.run.id, TERMINAL);
      expect(events.at(-1)!.event).toBe('run.cancelled');
      expect(events.find((e) => e.event === 'tool.result')?.data).toMatchObject({ error: 'the run was cancelled' });
    } finally {
      await t.close();
      await fake.close();
    }
  });

  it('without KILN_OUTBOUND_ALLOW a loopback server is refused before any request reaches it', async () => {
    const fake = await startFakeOpenAI();
    const t = await createTestApp({ sandbox: false, model: { baseURL: fake.url, model: 'fake-model' } });
    try {
      const team = await t.team('mcp-strict');
      const { session } = await sessionIn(t, team, {
        approval: { mode: 'auto', rules: [] },
        mcp_servers: [{ name: 'gh', url: mcp.url }],
      });
      const before = mcp.authorizations.length;
      fake.script(
        { content: '<tool name="gh.create_issue">{"title": "x"}</tool>' },
        { content: '<finish>no</finish>' },
      );
      const { run } = await converse(t, team.key, session, 'try');
      expect(run.status).toBe('completed');
      const chats = fake.chats();
      expect(chats[0].messages[0].content).toContain(
        'server gh is unavailable now: the outbound policy refused the server address: 127.0.0.1 is not a public address',
      );
      expect(chats[1].messages.at(-1).content).toContain(
        'gh.create_issue gave no result: the outbound policy refused the server address',
      );
      expect(mcp.authorizations.length).toBe(before);
    } finally {
      await t.close();
      await fake.close();
    }
  });
});
