import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { gitSync } from '../support/checkout.ts';

/** Serves an app over real HTTP on 127.0.0.1; resolves with its base URL. */
async function listen(t: TestApp): Promise<{ url: string; server: ServerType }> {
  const server = serve({ fetch: t.app.fetch, port: 0, hostname: '127.0.0.1' });
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

const closeServer = (server: ServerType) => new Promise<void>((resolve) => server.close(() => resolve()));

/** The SDK's own client on the SDK's own Streamable HTTP transport, with a Kiln key (or none). */
async function connect(url: string, key?: string, modern = false): Promise<Client> {
  const client = new Client(
    { name: 'kiln-test', version: '1' },
    modern ? { versionNegotiation: { mode: 'auto' } } : undefined,
  );
  const transport = new StreamableHTTPClientTransport(
    new URL(`${url}/mcp`),
    key ? { requestInit: { headers: { authorization: `Bearer ${key}` } } } : {},
  );
  await client.connect(transport);
  return client;
}

type Result = { isError?: boolean; content: { type: string; text?: string }[]; structuredContent?: any };
const textOf = (r: Result) => r.content.map((c) => c.text ?? '').join('');

describe('Kiln as an MCP server', () => {
  const ctx = useAgentApp('mcp-server');
  let url: string;
  let server: ServerType;
  const clients: Client[] = [];
  let other: { id: string; key: string };
  let viewer: string;
  let ws: { id: string; name: string };
  let otherWs: string;

  const open = async (key = ctx.team.key, modern = false) => {
    const c = await connect(url, key, modern);
    clients.push(c);
    return c;
  };
  const tool = async (name: string, args: Record<string, unknown>, key = ctx.team.key): Promise<Result> =>
    (await (await open(key)).callTool({ name, arguments: args })) as Result;
  const ok = async (name: string, args: Record<string, unknown>, key?: string) => {
    const r = await tool(name, args, key);
    expect(r.isError, textOf(r)).toBeFalsy();
    return r.structuredContent;
  };
  const workspace = async (key: string, settings?: unknown) => {
    const r = await ctx.t.call('POST', '/v1/workspaces', {
      key,
      body: { name: `mcp-${Math.random().toString(36).slice(2, 10)}`, settings },
    });
    expect(r.status).toBe(201);
    return { id: r.body.id as string, name: r.body.name as string };
  };

  beforeAll(async () => {
    ({ url, server } = await listen(ctx.t));
    other = await ctx.t.team('mcp-other');
    viewer = (
      await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
        key: ctx.team.key,
        body: { name: 'viewer', role: 'viewer' },
      })
    ).body.key;
    ws = await workspace(ctx.team.key);
    otherWs = (await workspace(other.key)).id;
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
  });
  afterAll(async () => {
    if (server) await closeServer(server);
  });

  it('lists the tools with the arguments named as documented, in both protocol eras', async () => {
    for (const modern of [false, true]) {
      const { tools } = await (await open(ctx.team.key, modern)).listTools();
      const args = Object.fromEntries(tools.map((t) => [t.name, Object.keys(t.inputSchema.properties ?? {}).sort()]));
      expect(args).toEqual({
        run_python: ['code', 'session', 'workspace'],
        list_files: ['path', 'workspace'],
        read_file: ['path', 'workspace'],
        write_file: ['content', 'path', 'workspace'],
        memory_search: ['query', 'workspace'],
        list_commits: ['workspace'],
        revert_commit: ['sha', 'workspace'],
        ask_agent: ['message', 'session', 'workspace'],
      });
      const write = tools.find((t) => t.name === 'write_file')!;
      expect(write.inputSchema.required).toEqual(['workspace', 'path', 'content']);
      expect((write.inputSchema.properties as any).workspace.description).toMatch(/id .* or its name/);
    }
  });

  it('run_python keeps variables between calls of one session; a call without one starts empty and its sandbox ends with it', async () => {
    const first = await ok('run_python', { workspace: ws.name, code: 'x = 41\nprint("set")' });
    expect(first).toMatchObject({ workspace_id: ws.id, stdout: 'set\n', error: null, exit_code: 0 });
    expect(first.session_id).toMatch(/^ses_/);
    // Its sandbox is gone: the session, passed back, goes on in a new interpreter, then keeps it.
    const sandboxes = await ctx.t.call('GET', '/v1/sandboxes', { key: ctx.team.key });
    expect(sandboxes.body.data.map((x: any) => x.session_id)).not.toContain(first.session_id);
    const second = await ok('run_python', { workspace: ws.id, session: first.session_id, code: 'y = 41\nx' });
    expect(second).toMatchObject({ session_id: first.session_id, restarted: true, error: { type: 'NameError' } });
    const third = await ok('run_python', { workspace: ws.id, session: first.session_id, code: 'y + 1' });
    expect(third).toMatchObject({ session_id: first.session_id, stdout: '42\n', error: null, restarted: false });
    const fresh = await ok('run_python', { workspace: ws.id, code: 'print(y)' });
    expect(fresh.session_id).not.toBe(first.session_id);
    expect(fresh.error).toMatchObject({ type: 'NameError' });
    // The executions are audited as the API audits them, by the key that called the tool.
    const audit = await ctx.t.call('GET', '/v1/audit?action=session.exec', { key: ctx.team.key });
    const sessions = audit.body.data.map((a: any) => a.resource_id);
    expect(sessions).toEqual(expect.arrayContaining([first.session_id, fresh.session_id]));
  });

  it('run_python calls without a session, more than the team may have sandboxes, leave none: a REST session still gets one', async () => {
    const team = await ctx.t.team('mcp-quota');
    const mine = await workspace(team.key, { sandbox: { timeout_s: 2 } });
    // The app's cap (KILN_SANDBOX_MAX_PER_TEAM): one call more than it, then one whose code fails and one that times out.
    for (let i = 0; i <= 10; i++)
      expect((await ok('run_python', { workspace: mine.id, code: `print(${i})` }, team.key)).stdout).toBe(`${i}\n`);
    expect(
      (await ok('run_python', { workspace: mine.id, code: 'raise ValueError("no")' }, team.key)).error,
    ).toMatchObject({
      type: 'ValueError',
    });
    const slow = await ok('run_python', { workspace: mine.id, code: 'import time\ntime.sleep(60)' }, team.key);
    expect(slow.error).toMatchObject({ type: 'Timeout' });
    expect((await ctx.t.call('GET', '/v1/sandboxes', { key: team.key })).body.data).toEqual([]);
    const s = await ctx.t.call('POST', `/v1/workspaces/${mine.id}/sessions`, { key: team.key, body: {} });
    const r = await ctx.t.call('POST', `/v1/sessions/${s.body.id}/exec`, {
      key: team.key,
      body: { code: 'print("rest")' },
    });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.stdout).toBe('rest\n');
  });

  it('write_file commits as the key’s user; read_file, list_files and list_commits show it; the write is audited', async () => {
    const content = '# Plan\n\n- ship the MCP server\n';
    const w = await ok('write_file', { workspace: ws.name, path: 'knowledge/plan.md', content });
    expect(w.commit).toMatchObject({ author: 'user', paths: ['knowledge/plan.md'] });
    const r = await ok('read_file', { workspace: ws.id, path: 'knowledge/plan.md' });
    expect(r).toMatchObject({ path: 'knowledge/plan.md', encoding: 'utf-8', content, truncated: false });
    const dir = await ok('list_files', { workspace: ws.id, path: 'knowledge' });
    expect(dir.entries.map((e: any) => e.name)).toContain('plan.md');
    const root = await ok('list_files', { workspace: ws.id });
    expect(root.entries.map((e: any) => e.name)).toEqual(expect.arrayContaining(['MEMORY.md', 'knowledge']));
    const log = await ok('list_commits', { workspace: ws.id });
    expect(log.commits[0]).toMatchObject({ sha: w.commit.sha, author: 'user', paths: ['knowledge/plan.md'] });

    // The audit row is the API's own, by the caller's key, under the id of an /mcp request.
    const audit = await ctx.t.call('GET', `/v1/audit?action=workspace.file.write&resource=${ws.id}`, {
      key: ctx.team.key,
    });
    const row = audit.body.data.find((a: any) => a.after.commit === w.commit.sha);
    expect(row).toMatchObject({ actor_role: 'owner', after: { path: 'knowledge/plan.md' } });
    const mcpRequests = ctx.t.logs.filter((l) => l.path === '/mcp').map((l) => l.request_id);
    expect(mcpRequests).toContain(row.request_id);
    // "As the key's user": the commit names the key that made it.
    const trailers = gitSync(`${ctx.t.workspacesDir}/${ws.id}`, 'log', '-1', '--format=%(trailers)', w.commit.sha);
    expect(row.actor).toMatch(/^key_/);
    expect(trailers).toContain(`Kiln-Actor: ${row.actor}`);
  });

  it('revert_commit reverts with a new commit; the file is gone again', async () => {
    const w = await ok('write_file', { workspace: ws.id, path: 'knowledge/tmp.md', content: 'temporary\n' });
    const rev = await ok('revert_commit', { workspace: ws.id, sha: w.commit.sha });
    expect(rev.commit).toMatchObject({ author: 'user', paths: ['knowledge/tmp.md'] });
    expect(rev.commit.sha).not.toBe(w.commit.sha);
    const gone = await tool('read_file', { workspace: ws.id, path: 'knowledge/tmp.md' });
    expect(gone.isError).toBe(true);
    expect(textOf(gone)).toMatch(/^not_found: /);
    const log = await ok('list_commits', { workspace: ws.id });
    expect(log.commits.slice(0, 2).map((c: any) => c.sha)).toEqual([rev.commit.sha, w.commit.sha]);
  });

  it('memory_search finds what was written to MEMORY.md', async () => {
    await ok('write_file', {
      workspace: ws.id,
      path: 'MEMORY.md',
      content: '# Memory\n\n- The deploy password rotates every quokkaday.\n',
    });
    const found = await ok('memory_search', { workspace: ws.name, query: 'quokkaday' });
    expect(found.hits[0]).toMatchObject({ path: 'MEMORY.md' });
    expect(found.hits[0].snippet).toContain('quokkaday');
  });

  it('resources: MEMORY.md and each skill of each workspace, listed and read', async () => {
    const client = await open();
    const { resourceTemplates } = await client.listResourceTemplates();
    expect(resourceTemplates.map((t) => t.uriTemplate).sort()).toEqual([
      'kiln://workspaces/{workspace}/memory',
      'kiln://workspaces/{workspace}/skills/{skill}',
    ]);
    const { resources } = await client.listResources();
    const uris = resources.map((r) => r.uri);
    expect(uris).toContain(`kiln://workspaces/${ws.id}/memory`);
    expect(uris).toContain(`kiln://workspaces/${ws.id}/skills/memory-keeping`);
    // Only this team's workspaces.
    expect(uris.some((u) => u.includes(otherWs))).toBe(false);
    await ok('write_file', { workspace: ws.id, path: 'MEMORY.md', content: '# Memory\n\n- resources work\n' });
    const memory = await client.readResource({ uri: `kiln://workspaces/${ws.id}/memory` });
    expect(memory.contents[0]).toMatchObject({ mimeType: 'text/markdown', text: '# Memory\n\n- resources work\n' });
    const skill = await client.readResource({ uri: `kiln://workspaces/${ws.id}/skills/memory-keeping` });
    expect((skill.contents[0] as { text: string }).text).toMatch(/^---\nname: memory-keeping/);
    await expect(client.readResource({ uri: `kiln://workspaces/${ws.id}/skills/no-such-skill` })).rejects.toThrow(
      /no skill/,
    );
  });

  it('ask_agent: a finished run returns the answer and the commits it made', async () => {
    const auto = await workspace(ctx.team.key, { approval: { mode: 'auto' } });
    ctx.fake.script(
      { content: '<python>open("/workspace/knowledge/agent-note.md", "w").write("from the agent\\n")</python>' },
      { content: '<finish>I wrote knowledge/agent-note.md.</finish>' },
    );
    const r = await ok('ask_agent', { workspace: auto.name, message: 'write a note' });
    expect(r).toMatchObject({ status: 'completed', answer: 'I wrote knowledge/agent-note.md.', approval: null });
    expect(r.session_id).toMatch(/^ses_/);
    expect(r.commits).toHaveLength(1);
    expect(r.commits[0].paths).toEqual(['knowledge/agent-note.md']);
    const log = await ok('list_commits', { workspace: auto.id });
    expect(log.commits[0]).toMatchObject({ sha: r.commits[0].sha, author: 'agent', run_id: r.run_id });
    // The message is audited as the API audits one, by the key that called the tool.
    const audit = await ctx.t.call('GET', `/v1/audit?action=session.message&resource=${r.run_id}`, {
      key: ctx.team.key,
    });
    expect(audit.body.data).toHaveLength(1);
    expect(audit.body.data[0]).toMatchObject({ actor_role: 'owner', resource_type: 'run' });
    // The same session continues: the model sees the earlier turn.
    ctx.fake.script({ content: '<finish>still here</finish>' });
    const again = await ok('ask_agent', { workspace: auto.id, session: r.session_id, message: 'and now?' });
    expect(again).toMatchObject({ session_id: r.session_id, status: 'completed', answer: 'still here', commits: [] });
    const seen = JSON.stringify(ctx.fake.chats().at(-1).messages);
    expect(seen).toContain('write a note');
  });

  it('ask_agent: a paused run returns the pending approval to decide through the API', async () => {
    ctx.fake.script({ content: '<python>print("needs a person")</python>' });
    const r = await ok('ask_agent', { workspace: ws.id, message: 'run something' });
    expect(r).toMatchObject({ status: 'requires_action', answer: null, commits: [] });
    expect(r.approval).toMatchObject({ status: 'pending', code: 'print("needs a person")', run_id: r.run_id });
    const pending = await ctx.t.call('GET', '/v1/approvals?status=pending', { key: ctx.team.key });
    expect(pending.body.data.map((a: any) => a.id)).toContain(r.approval.id);
    // What the model answers once the run goes on (queued before the decision lets it).
    ctx.fake.script({ content: '<finish>ok, not running it</finish>' });
    const denied = await ctx.t.call('POST', `/v1/approvals/${r.approval.id}`, {
      key: ctx.team.key,
      body: { decision: 'deny' },
    });
    expect(denied.status).toBe(200);
    // Deciding lets the run go on to its end, which the API shows.
    const events = await fetch(`${url}/v1/runs/${r.run_id}/events`, {
      headers: { authorization: `Bearer ${ctx.team.key}` },
    }).then((res) => res.text());
    expect(events).toContain('event: run.completed');
  });

  it('another team’s workspace, session or resource is not found', async () => {
    for (const [name, args] of [
      ['read_file', { workspace: otherWs, path: 'MEMORY.md' }],
      ['write_file', { workspace: otherWs, path: 'x.md', content: 'x' }],
      ['list_commits', { workspace: otherWs }],
      ['run_python', { workspace: otherWs, code: 'print(1)' }],
      ['ask_agent', { workspace: otherWs, message: 'hi' }],
    ] as const) {
      const r = await tool(name, args);
      expect(r.isError, name).toBe(true);
      expect(textOf(r), name).toMatch(/^not_found: no workspace "ws_/);
    }
    const theirSession = (await ctx.t.call('POST', `/v1/workspaces/${otherWs}/sessions`, { key: other.key, body: {} }))
      .body.id;
    const r = await tool('run_python', { workspace: ws.id, session: theirSession, code: 'print(1)' });
    expect(textOf(r)).toMatch(/^not_found: session not found/);
    await expect((await open()).readResource({ uri: `kiln://workspaces/${otherWs}/memory` })).rejects.toThrow(
      /no workspace/,
    );
    // Nothing was written in the other team's workspace.
    const theirs = await ctx.t.call('GET', `/v1/workspaces/${otherWs}/commits`, { key: other.key });
    expect(theirs.body.data.every((c: any) => c.author === 'system')).toBe(true);
  });

  it('a viewer key reads but is refused writes, and nothing is written', async () => {
    const before = await ok('list_commits', { workspace: ws.id }, viewer);
    const read = await ok('read_file', { workspace: ws.id, path: 'MEMORY.md' }, viewer);
    expect(read.content).toContain('# Memory');
    for (const [name, args] of [
      ['write_file', { workspace: ws.id, path: 'knowledge/v.md', content: 'no' }],
      ['revert_commit', { workspace: ws.id, sha: before.commits[0].sha }],
      ['run_python', { workspace: ws.id, code: 'print(1)' }],
      ['ask_agent', { workspace: ws.id, message: 'hi' }],
    ] as const) {
      const r = await tool(name, args, viewer);
      expect(r.isError, name).toBe(true);
      expect(textOf(r), name).toBe('forbidden: viewer keys are read-only');
    }
    const after = await ok('list_commits', { workspace: ws.id }, viewer);
    expect(after.commits[0].sha).toBe(before.commits[0].sha);
    // An org-admin key belongs to no team: it is told to use a team key.
    const admin = await tool('list_commits', { workspace: ws.id }, ctx.t.adminKey);
    expect(textOf(admin)).toMatch(/^forbidden: .*team key/);
  });

  it('bad arguments are tool errors that say what is wrong', async () => {
    const missing = await tool('write_file', { workspace: ws.id, path: 'a.md' });
    expect(missing.isError).toBe(true);
    expect(textOf(missing)).toMatch(/content/);
    const sha = await tool('revert_commit', { workspace: ws.id, sha: 'not-a-sha' });
    expect(sha.isError).toBe(true);
    expect(textOf(sha)).toMatch(/sha.*hex/);
    const session = await tool('run_python', { workspace: ws.id, session: 'nope', code: '1' });
    expect(textOf(session)).toMatch(/session.*ses_/);
    const outside = await tool('read_file', { workspace: ws.id, path: '../../etc/passwd' });
    expect(outside.isError).toBe(true);
    expect(textOf(outside)).toMatch(/^invalid_request: /);
    const dir = await tool('read_file', { workspace: ws.id, path: 'knowledge' });
    expect(textOf(dir)).toBe('invalid_request: knowledge is a directory: use list_files');
    const unknown = await tool('list_commits', { workspace: 'no-such-workspace' });
    expect(textOf(unknown)).toBe('not_found: no workspace "no-such-workspace" (by id or name) in this team');
    const noTool = await (await open()).callTool({ name: 'rm_rf', arguments: {} }).catch((e: Error) => e);
    expect(String((noTool as Result).content ? textOf(noTool as Result) : noTool)).toMatch(/rm_rf/);
  });

  it('no key or a bad key is 401 with the API’s envelope; the SDK client cannot connect', async () => {
    const init = { jsonrpc: '2.0', id: 1, method: 'initialize', params: {} };
    for (const authorization of [undefined, 'Bearer kiln_not_a_key']) {
      const res = await fetch(`${url}/mcp`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...(authorization ? { authorization } : {}),
        },
        body: JSON.stringify(init),
      });
      expect(res.status).toBe(401);
      expect((await res.json()).error.code).toBe('unauthorized');
    }
    await expect(connect(url)).rejects.toThrow(/401|nauthorized/);
    await expect(connect(url, 'kiln_not_a_key')).rejects.toThrow(/401|nauthorized/);
  });

  it('curl-style initialize and tools/call over plain HTTP (the docs example)', async () => {
    const post = (body: unknown) =>
      fetch(`${url}/mcp`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${ctx.team.key}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
        body: JSON.stringify(body),
      });
    const init = await post({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'curl', version: '1' } },
    });
    expect(init.status).toBe(200);
    expect(await init.text()).toContain('"serverInfo":{"name":"kiln"');
    // Stateless: a call needs no session from the initialize before it.
    const call = await post({
      jsonrpc: '2.0',
      id: 2,
      method: 'tools/call',
      params: { name: 'list_commits', arguments: { workspace: ws.name } },
    });
    expect(call.status).toBe(200);
    const frame = /^data: (.*)$/m.exec(await call.text())!;
    const result = JSON.parse(frame[1]!).result;
    expect(result.isError).toBeFalsy();
    expect(result.structuredContent.workspace_id).toBe(ws.id);
    const get = await fetch(`${url}/mcp`, { headers: { authorization: `Bearer ${ctx.team.key}` } });
    expect(get.status).toBe(405);
  });

  it('is in the OpenAPI document with an operationId, bearer security and its 4xx', async () => {
    const doc = (await ctx.t.call('GET', '/openapi.json')).body;
    const op = doc.paths['/mcp'].post;
    expect(op).toMatchObject({ operationId: 'postMcpMessage', security: [{ bearer: [] }] });
    expect(Object.keys(op.responses)).toEqual(expect.arrayContaining(['200', '401', '429']));
  });
});

describe('MCP and the rate limit', () => {
  let t: TestApp;
  let url: string;
  let server: ServerType;
  beforeAll(async () => {
    // A clock that never moves: the bucket never refills.
    t = await createTestApp({ sandbox: false, rateLimit: { perMinute: 1, burst: 12 }, now: () => 0 });
    ({ url, server } = await listen(t));
  });
  afterAll(async () => {
    if (server) await closeServer(server);
    await t?.close();
  });

  it('each MCP request counts once against the team’s bucket, shared with the API; its inner calls do not', async () => {
    const team = await t.team('mcp-limited');
    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'limited' } });
    expect(ws.status).toBe(201);
    const client = await connect(url, team.key);
    let succeeded = 0;
    let refusal: unknown;
    for (let i = 0; i < 20 && !refusal; i++) {
      try {
        const r = (await client.callTool({ name: 'list_files', arguments: { workspace: 'limited' } })) as Result;
        expect(r.isError, textOf(r)).toBeFalsy();
        succeeded++;
      } catch (err) {
        refusal = err;
      }
    }
    await client.close().catch(() => undefined);
    expect(String(refusal)).toMatch(/429|rate/i);
    const lines = t.logs.filter((l) => l.team_id === team.id && typeof l.status === 'number');
    const isOuter = (l: Record<string, unknown>) =>
      l.path === '/mcp' || (l.method === 'POST' && l.path === '/v1/workspaces');
    const outer = lines.filter(isOuter);
    const passed = outer.filter((l) => l.status !== 429);
    // Exactly the burst got through: the workspace, the client's handshake (its GET for a stream
    // is answered 405, after the limiter) and the tool calls.
    expect(passed).toHaveLength(12);
    expect(succeeded).toBeGreaterThan(0);
    // Each tool call made two API calls (the workspace by name, then the listing), none refused.
    const inner = lines.filter((l) => !isOuter(l));
    expect(inner.filter((l) => l.status === 200).length).toBeGreaterThanOrEqual(2 * succeeded);
    expect(inner.some((l) => l.status === 429)).toBe(false);
    // The API shares the bucket: it is empty for this team now.
    expect((await t.call('GET', '/v1/workspaces', { key: team.key })).status).toBe(429);
  });
});

describe('MCP behind a load balancer', () => {
  let a: TestApp;
  let b: TestApp;
  const servers: ServerType[] = [];
  const urls: string[] = [];
  beforeAll(async () => {
    a = await createTestApp({ sandbox: false });
    b = await createTestApp({ sandbox: false, replicaOf: a });
    for (const t of [a, b]) {
      const s = await listen(t);
      servers.push(s.server);
      urls.push(s.url);
    }
  });
  afterAll(async () => {
    await Promise.all(servers.map(closeServer));
    await b?.close();
    await a?.close();
  });

  it('keeps no MCP session: requests spread over two replicas of one database all work', async () => {
    const team = await a.team('mcp-replicas');
    const ws = (await a.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'spread' } })).body;
    let n = 0;
    // Every request of the client goes to the next replica in turn.
    const roundRobin = (input: string | URL | Request, init?: RequestInit) => {
      const u = new URL(input instanceof Request ? input.url : input);
      return fetch(`${urls[n++ % 2]}${u.pathname}${u.search}`, init);
    };
    const client = new Client({ name: 'kiln-test', version: '1' });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(`${urls[0]}/mcp`), {
        fetch: roundRobin,
        requestInit: { headers: { authorization: `Bearer ${team.key}` } },
      }),
    );
    const call = async (name: string, args: Record<string, unknown>) => {
      const r = (await client.callTool({ name, arguments: args })) as Result;
      expect(r.isError, textOf(r)).toBeFalsy();
      return r.structuredContent;
    };
    const w = await call('write_file', { workspace: 'spread', path: 'knowledge/a.md', content: 'from one replica\n' });
    const r = await call('read_file', { workspace: 'spread', path: 'knowledge/a.md' });
    expect(r.content).toBe('from one replica\n');
    const log = await call('list_commits', { workspace: ws.id });
    expect(log.commits[0].sha).toBe(w.commit.sha);
    // Without a model, ask_agent says so, and the session it started is ended again.
    const ask = (await client.callTool({
      name: 'ask_agent',
      arguments: { workspace: 'spread', message: 'hi' },
    })) as Result;
    expect(ask.isError).toBe(true);
    expect(textOf(ask)).toMatch(/^model_unavailable: /);
    const sessions = await a.call('GET', `/v1/workspaces/${ws.id}/sessions`, { key: team.key });
    expect(sessions.body.data.map((s: any) => s.status)).toEqual(['ended']);
    await client.close();
    for (const t of [a, b]) expect(t.logs.some((l) => l.path === '/mcp' && l.status === 200)).toBe(true);
  });
});
