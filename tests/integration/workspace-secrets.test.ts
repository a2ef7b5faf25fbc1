import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'drizzle-orm';
import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { rowsOf } from '../support/db.ts';
import { callMcpTool } from '../support/mcp.ts';
import { exec, RUNTIMES, sessionIn } from '../support/sandbox.ts';

const VALUE = 'sk-live-Zq8wX3vN7rT2pL5m';
const b64 = (s: string) => Buffer.from(s).toString('base64');

/** Every file of a directory tree, .git included, as one string (to search for a value). */
function treeText(dir: string): string {
  return readdirSync(dir)
    .map((name) => {
      const p = join(dir, name);
      return statSync(p).isDirectory() ? treeText(p) : readFileSync(p).toString('latin1');
    })
    .join('\n');
}

describe('workspace secrets', () => {
  const ctx = useAgentApp('secrets');
  const put = (ws: string, name: string, value: unknown, key = ctx.team.key) =>
    ctx.t.call('PUT', `/v1/workspaces/${ws}/secrets/${name}`, { key, body: { value } });

  it('PUT, GET and DELETE: write-only, validated, team-scoped and audited without the value', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const created = await put(ws, 'API_TOKEN', VALUE);
    expect(created.status).toBe(201);
    expect(created.body).toEqual({ name: 'API_TOKEN', created_at: expect.any(String), updated_at: expect.any(String) });
    expect((await put(ws, 'API_TOKEN', `${VALUE}-2`)).status).toBe(200);
    const list = await ctx.t.call('GET', `/v1/workspaces/${ws}/secrets`, { key: ctx.team.key });
    expect(list.status).toBe(200);
    expect(list.body.data.map((s: { name: string }) => s.name)).toEqual(['API_TOKEN']);
    expect(JSON.stringify(list.body)).not.toContain(VALUE);

    for (const [name, why] of [
      ['lower_case', 'environment variable name'],
      ['1ST', 'environment variable name'],
      ['PATH', 'reserved'],
      ['HOME', 'reserved'],
      ['PYTHONPATH', 'PYTHON'],
      ['LD_PRELOAD', 'LD_'],
      ['KILN_REQ_FD', 'KILN_'],
    ] as const) {
      const r = await put(ws, name, VALUE);
      expect(r.status, name).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
      expect(r.body.error.message).toContain(why);
    }
    const short = await put(ws, 'SHORT', 'abc');
    expect(short.status).toBe(400);
    expect(short.body.error.message).toContain('at least 4 characters');
    expect((await put(ws, 'NOT_A_STRING', 1234)).status).toBe(400);

    const other = await ctx.t.team('secrets-other');
    expect((await put(ws, 'API_TOKEN', VALUE, other.key)).status).toBe(404);
    expect((await ctx.t.call('GET', `/v1/workspaces/${ws}/secrets`, { key: other.key })).status).toBe(404);
    const foreignDelete = await ctx.t.call('DELETE', `/v1/workspaces/${ws}/secrets/API_TOKEN`, { key: other.key });
    expect(foreignDelete.status).toBe(404);
    const viewer = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: ctx.team.key,
      body: { name: 'viewer', role: 'viewer' },
    });
    expect((await put(ws, 'API_TOKEN', VALUE, viewer.body.key)).status).toBe(403);
    expect((await ctx.t.call('GET', `/v1/workspaces/${ws}/secrets`, { key: viewer.body.key })).status).toBe(200);

    const del = await ctx.t.call('DELETE', `/v1/workspaces/${ws}/secrets/API_TOKEN`, { key: ctx.team.key });
    expect(del).toMatchObject({ status: 200, body: { name: 'API_TOKEN', deleted: true } });
    expect((await ctx.t.call('DELETE', `/v1/workspaces/${ws}/secrets/API_TOKEN`, { key: ctx.team.key })).status).toBe(
      404,
    );

    const audit = await ctx.t.call('GET', '/v1/audit?limit=100', { key: ctx.team.key });
    const actions = audit.body.data
      .filter((a: { resource_id: string }) => a.resource_id === ws)
      .map((a: any) => a.action);
    expect(actions).toEqual(
      expect.arrayContaining(['workspace.secret.create', 'workspace.secret.update', 'workspace.secret.delete']),
    );
    const rows = rowsOf(await ctx.t.database.db.execute(sql`select * from audit_events`));
    expect(JSON.stringify(rows)).not.toContain(VALUE);
    expect(ctx.t.logText()).not.toContain(VALUE);
  });

  it('concurrent PUTs of new names never take a workspace past its secret limit', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    for (let i = 0; i < 98; i++) expect((await put(ws, `S${i}`, VALUE)).status).toBe(201);
    const racing = await Promise.all(['R1', 'R2', 'R3', 'R4', 'R5'].map((n) => put(ws, n, VALUE)));
    const statuses = racing.map((r) => r.status).sort();
    expect(statuses).toEqual([201, 201, 409, 409, 409]);
    for (const r of racing.filter((x) => x.status === 409)) expect(r.body.error.message).toContain('at most 100');
    const list = await ctx.t.call('GET', `/v1/workspaces/${ws}/secrets`, { key: ctx.team.key });
    expect(list.body.data).toHaveLength(100);
  });

  it('is sealed in the database, and a row copied to another workspace does not decrypt', async () => {
    const a = await sessionIn(ctx.t, ctx.team);
    const b = await sessionIn(ctx.t, ctx.team);
    expect((await put(a.ws, 'COPIED', VALUE)).status).toBe(201);
    const [row] = rowsOf<{ sealed: string }>(
      await ctx.t.database.db.execute(sql`select sealed from workspace_secrets where workspace_id = ${a.ws}`),
    );
    expect(row!.sealed).not.toContain(VALUE);
    expect(row!.sealed).not.toContain(b64(VALUE).slice(0, 16));
    expect(Buffer.from(row!.sealed, 'base64').toString('latin1')).not.toContain(VALUE);

    await ctx.t.database.db.execute(sql`insert into workspace_secrets (workspace_id, team_id, name, sealed)
      select ${b.ws}, team_id, name, sealed from workspace_secrets where workspace_id = ${a.ws}`);
    const there = await exec(ctx.t, ctx.team.key, b.session, 'print("ran")');
    expect(there.error?.type).toBe('SecretUnreadable');
    expect(there.stdout).toBe('');
    const here = await exec(ctx.t, ctx.team.key, a.session, 'import os\nprint(len(os.environ["COPIED"]))');
    expect(here.stdout).toBe(`${VALUE.length}\n`);
  });

  it('code sees the value in os.environ; every form of it that comes back is masked', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team);
    expect((await put(ws, 'API_TOKEN', VALUE)).status).toBe(201);
    const key = ctx.team.key;
    const seen = await exec(
      ctx.t,
      key,
      session,
      `import os\nv = os.environ["API_TOKEN"]\nprint(v == ${JSON.stringify(VALUE)})`,
    );
    expect(seen.stdout).toBe('True\n');

    const plain = await exec(ctx.t, key, session, 'print("token:", v)');
    expect(plain.stdout).toBe('token: [secret:API_TOKEN]\n');
    const split = await exec(ctx.t, key, session, "print(v[:5], end='', flush=True)\nprint(v[5:])");
    expect(split.stdout).toBe('[secret:API_TOKEN]\n');
    const encoded = await exec(
      ctx.t,
      key,
      session,
      'import base64, sys\nprint(base64.b64encode(v.encode()).decode())\nprint(base64.urlsafe_b64encode(b"x" + v.encode()).decode(), file=sys.stderr)\nv',
    );
    expect(encoded.stdout).not.toContain(b64(VALUE).slice(0, 20));
    expect(encoded.stdout).toContain('[secret:API_TOKEN]');
    expect(encoded.stderr).toContain('[secret:API_TOKEN]');
    expect(encoded.stdout).toContain("'[secret:API_TOKEN]'");
    const raised = await exec(ctx.t, key, session, 'raise ValueError("bad " + v)');
    expect(raised.error?.message).toBe('bad [secret:API_TOKEN]');
    expect(raised.error?.traceback).toContain('[secret:API_TOKEN]');
    // Code runs in the interpreter that exports figures, so it can put any bytes in an artifact:
    // here the value in the PNG's metadata and in the artifact's name.
    const smuggled = await exec(
      ctx.t,
      key,
      session,
      [
        'import sys, matplotlib.pyplot as plt',
        'from matplotlib.figure import Figure',
        'save = Figure.savefig',
        "Figure.savefig = lambda self, *a, **k: save(self, *a, **{**k, 'metadata': {'Comment': v}})",
        "worker = sys.modules['__main__']",
        'export = worker.figures',
        "worker.figures = lambda: [{**x, 'name': v + '.png'} for x in export()]",
        'plt.plot([1, 2])',
      ].join('\n'),
    );
    expect(smuggled.artifacts).toHaveLength(1);
    expect(smuggled.artifacts[0]!.name).toBe('[secret:API_TOKEN].png');
    const png = Buffer.from(smuggled.artifacts[0]!.base64, 'base64').toString('latin1');
    expect(png).not.toContain(VALUE);
    expect(png).toContain('[secret:API_TOKEN]');
    expect(JSON.stringify([seen, plain, split, encoded, raised, smuggled])).not.toContain(VALUE);

    // A subprocess has it too; a changed value takes effect at the next execution, a deleted one is gone.
    await put(ws, 'API_TOKEN', `${VALUE}-rotated`);
    const sub = await exec(
      ctx.t,
      key,
      session,
      'import subprocess\nprint(subprocess.run(["sh", "-c", "echo $API_TOKEN"], capture_output=True, text=True).stdout)',
    );
    expect(sub.stdout).toBe('[secret:API_TOKEN]\n\n');
    await ctx.t.call('DELETE', `/v1/workspaces/${ws}/secrets/API_TOKEN`, { key });
    expect((await exec(ctx.t, key, session, 'import os\nprint(os.environ.get("API_TOKEN"))')).stdout).toBe('None\n');

    const executions = rowsOf(
      await ctx.t.database.db.execute(sql`select * from executions where session_id = ${session}`),
    );
    expect(executions.some((e: any) => e.error === 'ValueError: bad [secret:API_TOKEN]')).toBe(true);
    expect(JSON.stringify(executions)).not.toContain(VALUE);
  });

  it('the agent\u2019s run events, its prompt, the workspace tree and its commits never hold the value', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    expect((await put(ws, 'DB_PASSWORD', VALUE)).status).toBe(201);
    ctx.fake.script(
      {
        content:
          "<python>import os, base64\nv = os.environ['DB_PASSWORD']\nprint(v[:7], end='', flush=True)\nprint(v[7:])\n" +
          "print(base64.b64encode(v.encode()).decode())\nopen('/workspace/leak.txt', 'w').write('pw=' + v + '\\n')\n" +
          "_ = open('/workspace/leak.b64', 'w').write(base64.b64encode(v.encode()).decode())</python>",
      },
      { content: '<finish>done</finish>' },
    );
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'use the password');
    expect(run.status).toBe('completed');
    const output = events
      .filter((e) => e.event === 'exec.output')
      .map((e) => (e.data as { data: string }).data)
      .join('');
    expect(output).toBe('[secret:DB_PASSWORD]\n[secret:DB_PASSWORD]\n');
    const stored = rowsOf(await ctx.t.database.db.execute(sql`select * from run_events where run_id = ${run.id}`));
    expect(JSON.stringify(stored)).not.toContain(VALUE);
    expect(JSON.stringify(stored)).not.toContain(b64(VALUE).slice(0, 20));
    expect(JSON.stringify(ctx.fake.chats())).not.toContain(VALUE);
    // The model is told which names it can use, never their values.
    const system = ctx.fake.chats()[0].messages[0].content as string;
    expect(system).toMatch(
      /^secrets \(environment variables of your code.*\): DB_PASSWORD; their values are never shown/m,
    );

    const dir = ctx.t.workspaces.dirOf(ws);
    expect(readFileSync(join(dir, 'leak.txt'), 'utf8')).toBe('pw=[secret:DB_PASSWORD]\n');
    expect(readFileSync(join(dir, 'leak.b64'), 'utf8')).toContain('[secret:DB_PASSWORD]');
    const history = execFileSync('git', ['-C', dir, 'log', '-p', '--all', '--format=%H %B'], { encoding: 'utf8' });
    expect(history).toContain('leak.txt');
    expect(history).not.toContain(VALUE);
    expect(history).not.toContain(b64(VALUE).slice(0, 20));
    // Loose objects are compressed: the plain search of the tree covers the working files and refs.
    expect(treeText(dir)).not.toContain(VALUE);
    expect(ctx.t.logText()).not.toContain(VALUE);
  });
});

describe.each(RUNTIMES)('secrets in files that leave the sandbox (%s)', (runtime) => {
  const ctx = useAgentApp(`secret-files-${runtime}`);
  // Not shaped like any known key, so only the workspace secret's own masking can catch it.
  const SECRET = 'plum-otter-quarry-7731-velvet';

  it('session file reads, workspace file reads and MCP read_file mask the value; a viewer gets no sandbox file', async () => {
    const key = ctx.team.key;
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { sandbox: { runtime } });
    // A file put before the secret existed holds the value as plain text.
    const early = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/notes.md`, {
      key,
      raw: `the pass phrase is ${SECRET}\n`,
    });
    expect(early.status).toBe(200);
    const named = await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/${SECRET}.md`, {
      key,
      raw: 'x\n',
    });
    expect(named.status).toBe(200);
    const set = await ctx.t.call('PUT', `/v1/workspaces/${ws}/secrets/PASS`, { key, body: { value: SECRET } });
    expect(set.status).toBe(201);
    const wrote = await exec(
      ctx.t,
      key,
      session,
      [
        'import os, base64',
        'v = os.environ["PASS"]',
        'open("/tmp/x.txt", "w").write("value=" + v + "\\n")',
        'open("/tmp/b64.txt", "w").write(base64.b64encode(v.encode()).decode())',
        'open("/tmp/bin.dat", "wb").write(bytes(range(256)) + v.encode() + bytes(range(256)))',
        'print("written")',
      ].join('\n'),
    );
    expect(wrote.stdout).toBe('written\n');
    const read = async (path: string, k = key) => {
      const r = await ctx.t.app.request(`/v1/sessions/${session}/files?path=${encodeURIComponent(path)}`, {
        headers: { authorization: `Bearer ${k}` },
      });
      return { status: r.status, bytes: Buffer.from(await r.arrayBuffer()) };
    };
    const x = await read('/tmp/x.txt');
    expect(x.status).toBe(200);
    expect(x.bytes.toString()).toBe('value=[secret:PASS]\n');
    expect((await read('/tmp/b64.txt')).bytes.toString()).toContain('[secret:PASS]');
    // A binary file keeps every byte but the value's.
    const bin = (await read('/tmp/bin.dat')).bytes;
    expect(bin.includes(Buffer.from(SECRET))).toBe(false);
    expect(bin.subarray(0, 256)).toEqual(Buffer.from(Array.from({ length: 256 }, (_, i) => i)));
    expect(bin.includes(Buffer.from('[secret:PASS]'))).toBe(true);

    // The workspace's own file, read through the session, the files API and MCP read_file.
    expect((await read('/workspace/knowledge/notes.md')).bytes.toString()).toBe('the pass phrase is [secret:PASS]\n');
    const viaApi = await ctx.t.call('GET', `/v1/workspaces/${ws}/files?path=knowledge/notes.md`, { key });
    expect(viaApi.body.content).toBe('the pass phrase is [secret:PASS]\n');
    const listing = await ctx.t.call('GET', `/v1/workspaces/${ws}/files?path=knowledge`, { key });
    expect(listing.body.entries.map((e: { name: string }) => e.name)).toContain('[secret:PASS].md');
    expect(JSON.stringify(listing.body)).not.toContain(SECRET);
    const raw = await ctx.t.app.request(`/v1/workspaces/${ws}/files?path=knowledge/notes.md&raw=true`, {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(await raw.text()).toBe('the pass phrase is [secret:PASS]\n');
    const mcp = await callMcpTool(ctx.t.app, key, 'read_file', { workspace: ws, path: 'knowledge/notes.md' });
    const answer = await mcp.text();
    expect(answer).toContain('[secret:PASS]');
    expect(answer).not.toContain(SECRET);

    // A viewer may not run code, so it reads no file code made; /workspace as committed it may.
    const made = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key,
      body: { name: 'viewer', role: 'viewer' },
    });
    const viewer = made.body.key as string;
    const denied = await read('/tmp/x.txt', viewer);
    expect(denied.status).toBe(403);
    expect(denied.bytes.toString()).toContain('viewer keys read only /workspace');
    const committed = await read('/workspace/knowledge/notes.md', viewer);
    expect(committed.status).toBe(200);
    expect(committed.bytes.toString()).toBe('the pass phrase is [secret:PASS]\n');
  });
});
