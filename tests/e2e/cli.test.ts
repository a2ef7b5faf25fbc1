import { spawn } from 'node:child_process';
import { createServer as createHttpServer, request as httpRequest } from 'node:http';
import { mkdtempSync, rmSync, statSync, utimesSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { startKiln, type KilnProcess } from '../support/server.ts';

const KILN = fileURLToPath(new URL('../../apps/cli/bin/kiln.js', import.meta.url));

/** Runs the real `kiln` command against the real server process, feeding it `input` on stdin. */
function kiln(
  env: Record<string, string>,
  args: string[],
  input = '',
): Promise<{ code: number; out: string; err: string; raw: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [KILN, ...args], {
      env: { PATH: process.env.PATH!, ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    // biome-ignore lint/suspicious/noControlCharactersInRegex: strips the terminal's colour codes.
    child.on('exit', (code) => resolve({ code: code ?? -1, out: out.replace(/\x1b\[[0-9;]*m/g, ''), err, raw: out }));
    child.stdin.end(input);
  });
}

/**
 * Runs `kiln` in a real pseudo-terminal (util-linux `script`), so readline is in terminal mode
 * as for a person: keys are typed with `type`, `until` waits for text to appear after what an
 * earlier `until` saw.
 */
function kilnInTerminal(env: Record<string, string>, args: string[]) {
  const command = [process.execPath, KILN, ...args].map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(' ');
  const child = spawn('script', ['-q', '-e', '-c', command, '/dev/null'], {
    env: { PATH: process.env.PATH!, TERM: 'xterm', ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let raw = '';
  let seen = 0;
  // biome-ignore lint/suspicious/noControlCharactersInRegex: strips the terminal's colour and cursor codes.
  const text = () => raw.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '').replaceAll('\r', '');
  child.stdout.on('data', (d) => (raw += d));
  const exited = new Promise<number>((resolve) => child.on('exit', (code) => resolve(code ?? -1)));
  return {
    type: (keys: string) => child.stdin.write(keys),
    raw: () => raw,
    until: (wanted: string) =>
      new Promise<void>((resolve, reject) => {
        const check = () => {
          const at = text().indexOf(wanted, seen);
          if (at < 0) return;
          seen = at + wanted.length;
          child.stdout.off('data', check);
          resolve();
        };
        child.stdout.on('data', check);
        exited.then(() => reject(new Error(`kiln exited before printing ${JSON.stringify(wanted)}:\n${text()}`)));
        check();
      }),
    text,
    exited,
  };
}

/**
 * A proxy on 127.0.0.1 in front of the server that can hold back the answer to a posted message
 * (`hold`, until `release`): what a slow network or a loaded server does to the CLI.
 */
async function messageHoldingProxy(target: string) {
  let held: Promise<void> | undefined;
  let release = () => {};
  const server = createHttpServer((req, res) => {
    const up = httpRequest(new URL(req.url!, target), { method: req.method, headers: req.headers }, async (r) => {
      if (held && req.method === 'POST' && req.url!.endsWith('/messages')) await held;
      res.writeHead(r.statusCode!, r.headers);
      r.pipe(res);
    });
    req.pipe(up);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    hold: () => {
      held = new Promise<void>((r) => (release = r));
    },
    release: () => release(),
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('the kiln CLI', () => {
  let fake: FakeOpenAI;
  let server: KilnProcess;
  let dir: string;
  let env: Record<string, string>;
  let wsId: string;
  let teamKey: string;

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    dir = mkdtempSync(join(tmpdir(), 'kiln-cli-'));
    const adminKey = generateKey('admin');
    server = await startKiln({
      KILN_DATA_DIR: dir,
      KILN_ADMIN_KEY: adminKey,
      OPENAI_BASE_URL: fake.url,
      OPENAI_API_KEY: 'k',
      KILN_MODEL: 'fake-model',
    });
    const api = async (key: string, method: string, path: string, body?: unknown) =>
      (
        await fetch(`${server.url}${path}`, {
          method,
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: body === undefined ? undefined : JSON.stringify(body),
        })
      ).json();
    const team = await api(adminKey, 'POST', '/v1/teams', { name: 'cli' });
    const { key } = await api(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'cli', role: 'owner' });
    teamKey = key;
    wsId = (await api(key, 'POST', '/v1/workspaces', { name: 'research' })).id;
    env = { KILN_URL: server.url, KILN_API_KEY: key };
  });
  afterAll(async () => {
    server.child.kill('SIGTERM');
    await server.exited;
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('runs from one bundle of the CLI and the SDK, made again when a source is newer than it', async () => {
    const bundle = fileURLToPath(new URL('../../apps/cli/dist/kiln.mjs', import.meta.url));
    const help = await kiln({}, ['help']);
    expect(help.code).toBe(0);
    expect(help.out).toContain('kiln chat');
    const built = statSync(bundle).mtimeMs;
    // A source edited after the bundle was made (its time moved past the bundle's): the next call rebuilds.
    const source = fileURLToPath(new URL('../../apps/cli/src/errors.ts', import.meta.url));
    const before = statSync(source);
    utimesSync(source, before.atime, new Date(built + 5000));
    try {
      expect((await kiln({}, ['help'])).code).toBe(0);
      expect(statSync(bundle).mtimeMs).toBeGreaterThan(built);
    } finally {
      utimesSync(source, before.atime, before.mtime);
    }
  });

  it('chat: thinking, code, approval y/n/a, output and the finish, then exit', async () => {
    fake.script(
      { content: '<thinking>Multiply.</thinking><python>print(6 * 7)</python>' },
      { content: '<thinking>Write it down.</thinking><python>open("/workspace/result.txt", "w").write("42")</python>' },
      { content: '<finish>The answer is 42.</finish>' },
    );
    const r = await kiln(env, ['chat', 'research'], 'what is six times seven?\ny\na\nexit\n');
    expect(r.code, r.out + r.err).toBe(0);
    expect(r.out, r.out + r.err).toContain('[thinking] Multiply.');
    expect(r.out).toContain('print(6 * 7)');
    expect(r.out).toContain('run this code? (y/n/a');
    expect(r.out).toContain('42\n');
    expect(r.out).toMatch(/\[committed [0-9a-f]{10}: result.txt\]/);
    expect(r.out).toContain('[finished] The answer is 42.');
    expect(r.out.trimEnd().endsWith('bye')).toBe(true);
    // Into a pipe, plain text: no colour codes.
    expect(r.raw).not.toContain('\x1b');
  });

  it('scripting verbs: workspaces, log and revert, exec, with --json', async () => {
    const list = await kiln(env, ['workspaces', '--json']);
    expect(JSON.parse(list.out).data.map((w: { id: string }) => w.id)).toContain(wsId);
    const log = await kiln(env, ['log', 'research']);
    expect(log.out).toMatch(/[0-9a-f]{10}\s+user\s+agent\s+Agent updates result.txt/);
    const sha = JSON.parse((await kiln(env, ['log', 'research', '--json'])).out).data[0].sha;
    const revert = await kiln(env, ['revert', 'research', sha]);
    expect(revert.out).toMatch(/reverted: new commit [0-9a-f]{10} Revert "Agent updates result.txt"/);
    const sessions = JSON.parse((await kiln(env, ['sessions', 'research', '--json'])).out);
    expect(sessions.data.length).toBeGreaterThan(0);
    const bad = await kiln(env, ['revert', 'research']);
    expect(bad.code).toBe(1);
    expect(bad.err).toContain('usage: kiln revert WORKSPACE SHA');
    const noKey = await kiln({ KILN_URL: server.url }, ['workspaces']);
    expect(noKey.code).toBe(2);
  });

  it('chat in a terminal: the approval asked inline, then Ctrl-C cancels a run in flight', async () => {
    fake.script(
      { content: '<python>print(6 * 7)</python>' },
      { content: '<finish>It is 42.</finish>' },
      { hang: true },
    );
    const term = kilnInTerminal(env, ['chat', 'research']);
    await term.until('╰─> ');
    term.type('six times seven?\r');
    await term.until('run this code? (y/n/a');
    term.type('y\r');
    await term.until('[finished] It is 42.');
    await term.until('╰─> ');
    const asked = fake.chats().length;
    term.type('and now wait\r');
    await fake.chatRequests(asked + 1);
    term.type('\x03');
    await term.until('[cancelled]');
    await term.until('╰─> ');
    term.type('exit\r');
    expect(await term.exited, term.text()).toBe(0);
    expect(term.text()).toContain('42\n');
    expect(term.text().trimEnd().endsWith('bye')).toBe(true);
    // In a terminal, colour.
    expect(term.raw()).toContain('\x1b[32m');
    const runs = await (
      await fetch(`${server.url}/v1/runs?limit=1`, { headers: { authorization: `Bearer ${teamKey}` } })
    ).json();
    expect(runs.data[0].status).toBe('cancelled');
  });

  it('Ctrl-C pressed before the answer to the message arrives still cancels the run', async () => {
    // A workspace of its own: the runs of `research` are counted below.
    const made = await fetch(`${server.url}/v1/workspaces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${teamKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'ctrl-c' }),
    });
    expect(made.status).toBe(201);
    const ws = ((await made.json()) as { id: string }).id;
    const proxy = await messageHoldingProxy(server.url);
    try {
      fake.script({ hang: true });
      const term = kilnInTerminal({ ...env, KILN_URL: proxy.url }, ['chat', 'ctrl-c']);
      await term.until('╰─> ');
      proxy.hold();
      const asked = fake.chats().length;
      term.type('think for a while\r');
      // The run is on the server (its model call is waiting) while the CLI still waits for the run's id.
      await fake.chatRequests(asked + 1);
      term.type('\x03');
      await term.until('cancelling…');
      proxy.release();
      await term.until('[cancelled]');
      await term.until('╰─> ');
      term.type('exit\r');
      expect(await term.exited, term.text()).toBe(0);
      const runs = await (
        await fetch(`${server.url}/v1/runs?workspace=${ws}`, { headers: { authorization: `Bearer ${teamKey}` } })
      ).json();
      expect(runs.data.map((r: { status: string }) => r.status)).toEqual(['cancelled']);
    } finally {
      proxy.release();
      await proxy.close();
    }
  });

  it('failures print the API\u2019s code and message (typed SDK errors); exec runs Python in a session', async () => {
    // `kiln runs` lists the team's runs (the chats above made some), of a workspace, by status.
    const listed = await kiln(env, ['runs']);
    expect(listed.code, listed.err).toBe(0);
    expect(listed.out).toMatch(/^run_\w+\s+(completed|cancelled)\s+steps\s+\d+/m);
    const cancelled = await kiln(env, ['runs', 'research', '--status', 'cancelled', '--json']);
    expect(JSON.parse(cancelled.out).data.map((x: { status: string }) => x.status)).toEqual(['cancelled']);
    const one = JSON.parse(cancelled.out).data[0].id as string;
    expect((await kiln(env, ['run', one])).out).toMatch(new RegExp(`^${one}\\s+cancelled`));
    const missing = await kiln(env, ['runs', 'run_nope']);
    expect(missing.code).toBe(1);
    expect(missing.err).toBe('kiln: not_found: run not found\n');
    expect((await kiln(env, ['log', 'nosuch'])).err).toBe('kiln: not_found: no workspace named nosuch\n');
    expect((await kiln(env, ['log', 'research', '--kind', 'bogus'])).err).toMatch(
      /^kiln: invalid_request: query\.kind: /,
    );
    const badKey = await kiln({ ...env, KILN_API_KEY: 'kiln_nope' }, ['workspaces']);
    expect(badKey.code).toBe(1);
    expect(badKey.err).toMatch(/^kiln: unauthorized: /);
    // A port nothing listens on: no answer, said as such.
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const down = await kiln({ ...env, KILN_URL: `http://127.0.0.1:${port}` }, ['workspaces']);
    expect(down.code).toBe(1);
    expect(down.err).toContain(`kiln: no answer from GET http://127.0.0.1:${port}/v1/workspaces`);
    expect(down.err).toContain('ECONNREFUSED');

    // In a workspace of its own: a session in `research` would be the one the review below looks at.
    const post = async (path: string, body: unknown) =>
      (
        await fetch(`${server.url}${path}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${teamKey}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        })
      ).json();
    const scratch = await post('/v1/workspaces', { name: 'scratch' });
    const session = await post(`/v1/workspaces/${scratch.id}/sessions`, {});
    const ok = await kiln(env, ['exec', session.id, 'x = 6 * 7; print(x)']);
    // On a failure, the server's own log says why (an engine's refusal is only named in the answer).
    expect(ok, `${ok.err}\n${server.stdout().slice(-6000)}${server.stderr().slice(-2000)}`).toMatchObject({
      code: 0,
      out: '42\n',
    });
    const failed = await kiln(env, ['exec', session.id, 'print(x + 1); 1/0']);
    expect(failed.code).toBe(1);
    expect(failed.out).toMatch(/^43\nTraceback[\s\S]*\n\[ZeroDivisionError\] division by zero\n$/);
  });

  it('evolution verbs: review, evolutions, undo (the server runs the review as a job)', async () => {
    fake.script({
      content:
        '<write_file path="knowledge/cli.md"># CLI\n\nThe answer was 42.</write_file><finish>Added a knowledge page</finish>',
    });
    const queued = await kiln(env, ['review', 'research', '--json']);
    expect(queued.code, queued.err).toBe(0);
    const evo = JSON.parse(queued.out);
    expect(evo).toMatchObject({ kind: 'review', status: 'queued' });
    const deadline = Date.now() + 30_000;
    let listed = '';
    while (!listed.includes('committed') && Date.now() < deadline)
      listed = (await kiln(env, ['evolutions', 'research'])).out;
    expect(listed).toContain(`${evo.id}  review committed`);
    expect(listed).toContain('knowledge/cli.md');
    const undo = await kiln(env, ['undo', 'research', evo.id]);
    expect(undo.out).toMatch(new RegExp(`undone: ${evo.id} reverted by commit [0-9a-f]{10} \\(knowledge/cli.md\\)`));
    expect((await kiln(env, ['undo', 'research', evo.id])).code).toBe(1);
  });
});
