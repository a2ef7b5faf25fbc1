import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, Socket } from 'node:net';
import { createServer as createHttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serve, type ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, type ErrorCode as ApiErrorCode } from '../../apps/api/src/lib/errors.ts';
import { generateTypes, liveDocument, TYPES_FILE } from '../../apps/sdk/scripts/generate.ts';
import {
  AuthenticationError,
  createKiln,
  ERROR_STATUS,
  type ErrorCode,
  InvalidRequestError,
  KilnConnectionError,
  KilnError,
  NotFoundError,
  type RunEvent,
} from '../../apps/sdk/src/index.ts';
import { useAgentApp } from '../support/agent-app.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const SDK = join(ROOT, 'apps/sdk/src/index.ts');

/** Type-level: the SDK's code union is exactly the API's (tsc fails the build otherwise). */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const codesAgree: Same<ErrorCode, ApiErrorCode> = true;

/**
 * A TCP relay between the SDK and the server that cuts the first event stream it carries after
 * `cutAfter` whole SSE frames and half of the next (a dropped connection mid-event), and records
 * the head of every request it relays.
 */
function cuttingProxy(target: number, cutAfter: number) {
  const requests: string[] = [];
  let cuts = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = new Socket();
    sockets.add(client).add(upstream);
    upstream.connect(target, '127.0.0.1');
    client.on('data', (d: Buffer) => {
      const text = d.toString('latin1');
      if (/^[A-Z]+ \//.test(text)) requests.push(text.slice(0, text.indexOf('\r\n\r\n')));
      upstream.write(d);
    });
    let seen = '';
    let streaming = false;
    upstream.on('data', (d: Buffer) => {
      if (cuts > 0 || !(streaming ||= d.toString('latin1').includes('text/event-stream'))) return void client.write(d);
      const before = seen.length;
      seen += d.toString('latin1');
      // hono ends each event's frame with "id: N" and a blank line (pings carry no id): once the
      // frame after the first `cutAfter` is complete, forward only half of it and cut.
      const ends = [...seen.matchAll(/\nid: \d+\n\n/g)].map((m) => m.index! + m[0].length);
      if (ends.length <= cutAfter) return void client.write(d);
      const cutAt = Math.floor((ends[cutAfter - 1]! + ends[cutAfter]!) / 2);
      cuts++;
      client.write(d.subarray(0, Math.max(0, cutAt - before)));
      client.destroy();
      upstream.destroy();
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
  });
  return {
    requests,
    cuts: () => cuts,
    listen: () =>
      new Promise<number>((resolve) =>
        server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)),
      ),
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

describe('@kiln/sdk against the real server over HTTP', () => {
  const ctx = useAgentApp('sdk', { selfUpdate: true, env: { KILN_OUTBOUND_ALLOW: '127.0.0.1' } });
  let server: ServerType;
  let url: string;
  let port: number;
  let kiln: ReturnType<typeof createKiln>;

  beforeAll(async () => {
    server = await new Promise<ServerType>((resolve) => {
      const s = serve({ fetch: ctx.t.app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s));
    });
    port = (server.address() as AddressInfo).port;
    url = `http://127.0.0.1:${port}`;
    kiln = createKiln({ baseUrl: url, apiKey: ctx.team.key });
  });
  afterAll(async () => {
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  });

  it('the committed types are those of the live document (else: npm run sdk:generate)', async () => {
    const live = await liveDocument();
    // The generator's document is what this server serves at GET /openapi.json, but for its origin.
    const served = await (await fetch(`${url}/openapi.json`)).json();
    expect(served.servers).toEqual([{ url, description: 'this Kiln server' }]);
    expect({ ...live, servers: served.servers }).toEqual(served);
    expect(Object.keys(live.paths ?? {})).toContain('/v1/system/updates');
    const fresh = await generateTypes(live);
    const committed = readFileSync(TYPES_FILE, 'utf8');
    if (fresh !== committed)
      expect.fail(
        'apps/sdk/src/openapi.ts is stale against the live /openapi.json: run `npm run sdk:generate` and commit the result',
      );
    expect(committed).not.toMatch(/127\.0\.0\.1|localhost|kiln\.invalid/);
  });

  it('webhooks: create (the secret once), test ping delivered and logged, replay, rotate, update, delete', async () => {
    const got: { id: string; body: string }[] = [];
    const receiver = createHttpServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        got.push({ id: String(req.headers['webhook-id']), body });
        res.end('ok');
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    try {
      const target = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
      const hook = await kiln.webhooks.create({ url: target, events: ['run.completed'] });
      expect(hook.secret).toMatch(/^whsec_/);
      const listed = await kiln.webhooks.get(hook.id);
      expect(listed).not.toHaveProperty('secret');
      expect((await kiln.webhooks.list()).data.map((w) => w.id)).toContain(hook.id);

      await kiln.webhooks.test(hook.id);
      while ((await ctx.t.evolution.jobs.drain()) > 0);
      expect(got).toHaveLength(1);
      const [first] = (await kiln.webhooks.deliveries.list(hook.id)).data;
      expect(first).toMatchObject({ status: 'succeeded' });
      const again = await kiln.webhooks.deliveries.replay(hook.id, first!.id);
      expect(again.id).not.toBe(first!.id);
      while ((await ctx.t.evolution.jobs.drain()) > 0);
      expect(got).toHaveLength(2);
      expect(got[1]!.body).toBe(got[0]!.body);
      expect(got[1]!.id).not.toBe(got[0]!.id);
      expect((await kiln.webhooks.deliveries.get(hook.id, again.id)).status).toBe('succeeded');

      const rotated = await kiln.webhooks.rotateSecret(hook.id);
      expect(rotated.secret).toMatch(/^whsec_/);
      expect(rotated.secret).not.toBe(hook.secret);
      expect((await kiln.webhooks.update(hook.id, { enabled: false })).enabled).toBe(false);
      await kiln.webhooks.delete(hook.id);
      await expect(kiln.webhooks.get(hook.id)).rejects.toBeInstanceOf(NotFoundError);
      // A private address literal is refused at the edge with the envelope's code.
      const refused = await kiln.webhooks.create({ url: 'http://10.0.0.1/x', events: ['run.failed'] }).catch((e) => e);
      expect(refused).toBeInstanceOf(KilnError);
      expect((refused as KilnError).code).toBe('invalid_request');
    } finally {
      await new Promise<void>((r) => receiver.close(() => r()));
    }
  });

  it('workspaces, files and commits round trip; byName; update', async () => {
    const ws = await kiln.workspaces.create({ name: 'sdk-files', settings: { approval: { mode: 'auto' } } });
    expect(ws).toMatchObject({ name: 'sdk-files' });
    expect((await kiln.workspaces.byName('sdk-files')).id).toBe(ws.id);
    expect((await kiln.workspaces.get(ws.id)).name).toBe('sdk-files');
    const updated = await kiln.workspaces.update(ws.id, { settings: { max_steps: 7 } });
    expect(updated.settings.max_steps).toBe(7);

    const written = await kiln.files.write(ws.id, 'notes/hello.md', '# Hello\n\nfrom the SDK\n');
    expect(written.commit?.paths).toEqual(['notes/hello.md']);
    const again = await kiln.files.write(ws.id, 'notes/hello.md', '# Hello\n\nfrom the SDK\n');
    expect(again.commit).toBeNull();
    const bytes = new Uint8Array([0, 1, 2, 255]);
    await kiln.files.write(ws.id, 'data.bin', bytes);
    expect(await kiln.files.bytes(ws.id, 'data.bin')).toEqual(bytes);
    expect((await kiln.files.read(ws.id, 'data.bin')).encoding).toBe('base64');
    expect(await kiln.files.read(ws.id, 'notes/hello.md')).toMatchObject({
      type: 'file',
      encoding: 'utf-8',
      content: '# Hello\n\nfrom the SDK\n',
    });
    expect((await kiln.files.list(ws.id, 'notes')).map((e) => e.name)).toEqual(['hello.md']);

    const log = await kiln.commits.list(ws.id, { limit: 10 });
    expect(log.data[0]!.paths).toEqual(['data.bin']);
    const hello = log.data.find((c) => c.paths.includes('notes/hello.md'))!;
    const reverted = await kiln.commits.revert(ws.id, hello.sha);
    expect(reverted.commit?.summary).toContain('Revert');
    await expect(kiln.files.read(ws.id, 'notes/hello.md')).rejects.toBeInstanceOf(NotFoundError);
  });

  it('typed errors: 404 not_found, 400 invalid_request with details, 401, and no answer at all', async () => {
    const missing = await kiln.workspaces.get('ws_doesnotexist').catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect(missing).toMatchObject({ status: 404, code: 'not_found' });
    expect((missing as KilnError).requestId).toMatch(/^req_/);
    expect(KilnError.is(missing, 'not_found')).toBe(true);

    const bad = await kiln.workspaces.list({ limit: 1000 }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(InvalidRequestError);
    expect(bad).toMatchObject({ status: 400, code: 'invalid_request' });
    expect((bad as KilnError).details).toEqual([expect.objectContaining({ path: 'query.limit' })]);
    const badBody = await kiln.workspaces.create({ name: '' }).catch((e: unknown) => e);
    expect((badBody as KilnError).details.map((d) => d.path)).toContain('body.name');

    const stranger = createKiln({ baseUrl: url, apiKey: 'kiln_nope' });
    const unauth = await stranger.workspaces.list().catch((e: unknown) => e);
    expect(unauth).toBeInstanceOf(AuthenticationError);
    expect(unauth).toMatchObject({ status: 401, code: 'unauthorized' });

    // Another team's workspace is not found, not forbidden.
    const other = createKiln({ baseUrl: url, apiKey: (await ctx.t.team('sdk-other')).key });
    const theirs = await other.workspaces.create({ name: 'theirs' });
    await expect(kiln.workspaces.get(theirs.id)).rejects.toMatchObject({ code: 'not_found' });

    // A port nothing listens on (this server's, once closed): a connection error, not a KilnError.
    const gone = serve({ fetch: ctx.t.app.fetch, port: 0, hostname: '127.0.0.1' });
    await new Promise((resolve) => gone.once('listening', resolve));
    const deadPort = (gone.address() as AddressInfo).port;
    await new Promise((resolve) => gone.close(resolve));
    const down = await createKiln({ baseUrl: `http://127.0.0.1:${deadPort}`, apiKey: ctx.team.key })
      .workspaces.list()
      .catch((e: unknown) => e);
    expect(down).toBeInstanceOf(KilnConnectionError);
    expect(down).not.toBeInstanceOf(KilnError);

    // Every code of the API maps to the status the SDK documents for it.
    expect(codesAgree).toBe(true);
    for (const code of Object.keys(ERROR_STATUS) as ErrorCode[])
      expect(new ApiError(code, 'x').status, code).toBe(ERROR_STATUS[code]);
  });

  it('pagination follows the cursor through every page', async () => {
    const team = await ctx.t.team('sdk-pages');
    const pages: string[] = [];
    const counted = createKiln({
      baseUrl: url,
      apiKey: team.key,
      fetch: (req) => {
        if (req.url.includes('/v1/workspaces?')) pages.push(new URL(req.url).searchParams.get('after') ?? '');
        return fetch(req);
      },
    });
    const made: string[] = [];
    for (let i = 0; i < 5; i++) made.push((await counted.workspaces.create({ name: `page-${i}` })).id);
    const seen: string[] = [];
    for await (const w of counted.workspaces.all({ limit: 2 })) seen.push(w.id);
    expect(seen.sort()).toEqual([...made].sort());
    expect(pages).toHaveLength(3);
    expect(pages[0]).toBe('');
    const viaHelper: string[] = [];
    for await (const w of counted.paginate(counted.workspaces.list, { limit: 4, order: 'asc' })) viaHelper.push(w.id);
    expect(viaHelper).toEqual(made);
  });

  it('sessions.exec runs Python in a sandbox and keeps variables', async () => {
    const ws = await kiln.workspaces.create({ name: 'sdk-exec' });
    const session = await kiln.sessions.create(ws.id, { title: 'sdk' });
    const first = await kiln.sessions.exec(session.id, 'x = 6 * 7\nprint(x)');
    expect(first).toMatchObject({ stdout: '42\n', exit_code: 0 });
    const second = await kiln.sessions.exec(session.id, 'print(x + 1)\n1/0');
    expect(second.stdout).toBe('43\n');
    expect(second.error?.type).toBe('ZeroDivisionError');
    await kiln.sessions.end(session.id);
  });

  it('runs.stream resumes after the connection is cut mid-event: no event lost or repeated', async () => {
    const ws = await kiln.workspaces.create({ name: 'sdk-stream', settings: { approval: { mode: 'auto' } } });
    const session = await kiln.sessions.create(ws.id);
    ctx.fake.script(
      { content: '<thinking>One.</thinking><python>print(1)</python>' },
      { content: '<thinking>Two.</thinking><python>print(2)</python>' },
      { content: '<finish>done</finish>' },
    );
    const proxy = cuttingProxy(port, 3);
    const viaProxy = createKiln({ baseUrl: `http://127.0.0.1:${await proxy.listen()}`, apiKey: ctx.team.key });
    try {
      const { run } = await viaProxy.messages.send(session.id, 'count');
      const got: RunEvent[] = [];
      for await (const ev of viaProxy.runs.stream(run.id)) got.push(ev);
      expect(proxy.cuts()).toBe(1);
      const stored = await kiln.runs.events(run.id);
      expect(got.map((e) => [e.id, e.event])).toEqual(stored.map((e) => [e.id, e.event]));
      expect(got.map((e) => e.id)).toEqual(stored.map((_, i) => i + 1));
      expect(got.at(-1)!.event).toBe('run.completed');
      // The second request asked for what followed the third event.
      const streams = proxy.requests.filter((r) => r.includes('/events'));
      expect(streams).toHaveLength(2);
      expect(streams[1]).toMatch(/last-event-id: 3\r\n/i);
      expect((await kiln.runs.get(run.id)).status).toBe('completed');
    } finally {
      await proxy.close();
    }
  });

  it('runs.stream from `after`, and an aborted stream ends quietly', async () => {
    const ws = await kiln.workspaces.create({ name: 'sdk-after', settings: { approval: { mode: 'auto' } } });
    const session = await kiln.sessions.create(ws.id);
    ctx.fake.script({ content: '<finish>hi</finish>' });
    const { run } = await kiln.messages.send(session.id, 'hi');
    const all: RunEvent[] = [];
    for await (const ev of kiln.runs.stream(run.id)) all.push(ev);
    const tail: RunEvent[] = [];
    for await (const ev of kiln.runs.stream(run.id, { after: 1 })) tail.push(ev);
    expect(tail).toEqual(all.slice(1));
    const abort = new AbortController();
    abort.abort();
    const none: RunEvent[] = [];
    for await (const ev of kiln.runs.stream(run.id, { signal: abort.signal })) none.push(ev);
    expect(none).toEqual([]);
    await expect(kiln.runs.stream('run_doesnotexist').next()).rejects.toBeInstanceOf(NotFoundError);
  });

  it('approvals.decide lets a paused run go on; a second decision is a ConflictError', async () => {
    const ws = await kiln.workspaces.create({ name: 'sdk-approve' });
    const session = await kiln.sessions.create(ws.id);
    ctx.fake.script({ content: '<python>print("approved")</python>' }, { content: '<finish>ran it</finish>' });
    const { run } = await kiln.messages.send(session.id, 'run it');
    const names: string[] = [];
    let approvalId = '';
    let output = '';
    for await (const ev of kiln.runs.stream(run.id)) {
      names.push(ev.event);
      if (ev.event === 'approval.requested') {
        approvalId = ev.data.approval_id!;
        expect((await kiln.runs.get(run.id)).status).toBe('requires_action');
        const pending = await kiln.approvals.list({ status: 'pending', workspace: ws.id });
        expect(pending.data.map((a) => a.id)).toEqual([approvalId]);
        expect(await kiln.approvals.decide(approvalId, 'approve', 'looks fine')).toMatchObject({
          status: 'approved',
          reason: 'looks fine',
        });
      }
      if (ev.event === 'exec.output') output += ev.data.data;
    }
    expect(names).toEqual(expect.arrayContaining(['approval.requested', 'approval.resolved', 'exec.completed']));
    expect(names.at(-1)).toBe('run.completed');
    expect(output).toBe('approved\n');
    await expect(kiln.approvals.decide(approvalId, 'reject')).rejects.toMatchObject({ status: 409, code: 'conflict' });
  });

  it('the README example runs as written (but for the server address)', async () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const block = /## TypeScript SDK\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
    expect(block, 'README.md has a "## TypeScript SDK" section with a ts block').toBeTruthy();
    expect(block!.split('\n').filter(Boolean).length).toBeLessThanOrEqual(12);
    expect(block).toContain("from '@kiln/sdk'");
    expect(block).toContain('http://localhost:7700');
    const dir = mkdtempSync(join(tmpdir(), 'kiln-sdk-readme-'));
    try {
      const file = join(dir, 'example.mts');
      writeFileSync(file, block!.replace("'@kiln/sdk'", JSON.stringify(SDK)).replace('http://localhost:7700', url));
      const team = await ctx.t.team('sdk-readme');
      // Run twice, as a reader trying it again would: the second run must not trip on the first's workspace.
      for (let i = 0; i < 2; i++) {
        ctx.fake.script(
          { content: '<python>open("/workspace/answer.txt", "w").write(str(6 * 7))</python>' },
          { content: '<finish>The answer is 42.</finish>' },
        );
        const out = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
          execFile(
            join(ROOT, 'node_modules/.bin/tsx'),
            [file],
            { cwd: dir, env: { PATH: process.env.PATH!, KILN_API_KEY: team.key }, timeout: 60_000 },
            (err, stdout, stderr) => resolve({ code: err ? 1 : 0, stdout, stderr }),
          ),
        );
        expect(out.stderr).toBe('');
        expect(out.code).toBe(0);
        expect(out.stdout).toBe('42\n\nThe answer is 42.\n');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
