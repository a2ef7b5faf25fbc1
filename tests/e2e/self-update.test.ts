import { execFile, execFileSync } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { alive } from '../../apps/relay/src/relay.ts';
import { cloneProject, freePort, gitSync as git } from '../support/checkout.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { startKiln, type KilnProcess } from '../support/server.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const docker = connectDocker(process.env.DOCKER_HOST);
/** The servers' sandbox image: a name of this file's, so that the restarts' builds of it touch no other suite's. */
const IMAGE_REPO = `kiln-selfupdate-${process.pid}`;
const IMAGE = `${IMAGE_REPO}:latest`;
const imageId = async () => (await docker.getImage(IMAGE).inspect()).Id;

/** Polls until `fn` gives a value (not undefined) or the deadline passes; then fails with what it last saw. */
async function waitFor<T>(what: string, fn: () => Promise<T | undefined>, ms = 240_000): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  for (;;) {
    const v = await fn().catch((err: Error) => {
      last = err.message;
      return undefined;
    });
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (last: ${String(last)})`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * Layer 5 end to end: a real git checkout of this project in a temporary directory, the real
 * server started from it as a child process, patches submitted over HTTP, the self-check's real
 * tsc / vitest / server boot, and the detached relay restarting the server into the new commit.
 */
describe('platform self-update', { timeout: 420_000 }, () => {
  const temp: string[] = [];
  /** Every server pid seen (the relay's servers are not our children), killed in afterAll. */
  const pids = new Set<number>();
  let checkout: string;
  let dataDir: string;
  let first: KilnProcess;
  let url: string;
  const adminKey = generateKey('admin');
  let teamKey: string;
  let fake: FakeOpenAI;

  const mkTemp = (prefix: string) => {
    const d = mkdtempSync(join(tmpdir(), prefix));
    temp.push(d);
    return d;
  };
  const api = async (path: string, init: RequestInit & { key?: string } = {}) => {
    const res = await fetch(`${url}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${init.key ?? adminKey}`, 'content-type': 'application/json', ...init.headers },
    });
    return { status: res.status, body: await res.json(), headers: res.headers };
  };
  const submit = (patch: string, reason: string) =>
    api('/v1/system/updates', { method: 'POST', body: JSON.stringify({ patch, reason }) });
  const settled = (id: string, from: string[]) =>
    waitFor(`update ${id} to leave ${from.join('/')}`, async () => {
      const r = await api(`/v1/system/updates/${id}`);
      return from.includes(r.body.status) ? undefined : r.body;
    });
  /** The server answering now: waits until it is one we have not seen before, with the expected commit. */
  const nextServer = (oldPid: number, commit: string) =>
    waitFor(`a new server on ${commit.slice(0, 10)}`, async () => {
      const v = await api('/v1/system/version');
      return v.status === 200 && v.body.pid !== oldPid && v.body.commit === commit ? v.body : undefined;
    });
  const worktrees = () => git(checkout, 'worktree', 'list').split('\n').length;
  const head = () => git(checkout, 'rev-parse', 'HEAD');

  /** A unified diff made the way a person makes one: edit a clone of the checkout, `git diff`. */
  const patchOf = (edits: Record<string, (text: string) => string>) => {
    const scratch = mkTemp('kiln-patch-');
    execFileSync('git', ['clone', '-q', checkout, scratch]);
    for (const [path, edit] of Object.entries(edits)) {
      const file = join(scratch, path);
      writeFileSync(file, edit(existsSync(file) ? readFileSync(file, 'utf8') : ''));
    }
    git(scratch, 'add', '-A');
    return `${git(scratch, 'diff', '--cached')}\n`;
  };

  // A team's webhook receiver for update.applied (the one platform-wide event).
  const received: {
    headers: Record<string, unknown>;
    body: { type: string; team_id: string; data: Record<string, unknown> };
  }[] = [];
  let receiver: Server;

  beforeAll(async () => {
    // The project as it is now (uncommitted changes too), as a git checkout of its own.
    checkout = mkTemp('kiln-src-');
    cloneProject(ROOT, checkout);

    fake = await startFakeOpenAI();
    receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        received.push({ headers: req.headers, body: JSON.parse(body) });
        res.end();
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    dataDir = mkTemp('kiln-selfupdate-data-');
    await docker.getImage('kiln-sandbox:latest').tag({ repo: IMAGE_REPO, tag: 'latest' });
    const port = await freePort();
    first = await startKiln(
      {
        KILN_DATA_DIR: dataDir,
        KILN_ADMIN_KEY: adminKey,
        KILN_PORT: String(port),
        KILN_SOURCE_DIR: checkout,
        KILN_RESTART_READY_TIMEOUT_S: '30',
        KILN_SANDBOX_IMAGE: IMAGE,
        // The check's test step: the smoke suite and the docs' test (the unit tests run in this
        // suite anyway; all of them in each of this file's seven checks took 2 minutes each).
        KILN_SELF_CHECK_TESTS: 'tests/smoke tests/unit/docs.test.ts',
        KILN_RESTART_STOP_TIMEOUT_S: '30',
        // How long a stopping server waits for HTTP requests, then for runs in flight.
        KILN_SHUTDOWN_GRACE_MS: '5000',
        OPENAI_BASE_URL: fake.url,
        OPENAI_API_KEY: 'test-key',
        KILN_MODEL: 'fake-model',
        // The webhook receiver is on loopback; deliveries are looked for often.
        KILN_OUTBOUND_ALLOW: '127.0.0.1',
        KILN_JOBS_POLL_MS: '200',
      },
      checkout,
    );
    pids.add(first.child.pid!);
    url = first.url;
    const team = await api('/v1/teams', { method: 'POST', body: JSON.stringify({ name: 'live' }) });
    const key = await api(`/v1/teams/${team.body.id}/keys`, {
      method: 'POST',
      body: JSON.stringify({ name: 'o', role: 'owner' }),
    });
    teamKey = key.body.key;
    const hook = await fetch(`${url}/v1/webhooks`, {
      method: 'POST',
      headers: { authorization: `Bearer ${teamKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/kiln`,
        events: ['update.applied'],
      }),
    });
    expect(hook.status).toBe(201);
  });

  afterAll(async () => {
    // The relay's status files name every server and relay it started.
    const updates = existsSync(join(dataDir, 'self-update')) ? readdirSync(join(dataDir, 'self-update')) : [];
    for (const id of updates) {
      const file = join(dataDir, 'self-update', id, 'status.json');
      if (!existsSync(file)) continue;
      const s = JSON.parse(readFileSync(file, 'utf8')) as { pid?: number; relayPid?: number };
      for (const p of [s.relayPid, s.pid]) if (p) pids.add(p);
    }
    const v = await api('/v1/system/version').catch(() => null);
    if (v?.status === 200) pids.add(v.body.pid);
    for (const p of pids) if (alive(p)) process.kill(p, 'SIGKILL');
    await waitFor('every server to be gone', async () => ([...pids].some(alive) ? undefined : true), 10_000);
    await fake?.close();
    await new Promise((r) => (receiver ? receiver.close(r) : r(undefined)));
    for (const d of temp) rmSync(d, { recursive: true, force: true });
    for (const i of await docker.listImages({ filters: { reference: [`${IMAGE_REPO}:*`] } }))
      for (const tag of i.RepoTags ?? [])
        await docker
          .getImage(tag)
          .remove({ force: true })
          .catch(() => undefined);
  });

  /** What a new sandbox of the team's runs: how often `marker` is in its runner's source. */
  const runnerHas = async (marker: string) => {
    const ws = await api('/v1/workspaces', {
      method: 'POST',
      key: teamKey,
      body: JSON.stringify({ name: `runner-${Date.now()}` }),
    });
    const session = (await api(`/v1/workspaces/${ws.body.id}/sessions`, { method: 'POST', key: teamKey, body: '{}' }))
      .body.id as string;
    try {
      const r = await api(`/v1/sessions/${session}/exec`, {
        method: 'POST',
        key: teamKey,
        body: JSON.stringify({
          code: `print(open('/opt/kiln/kiln_runner.py').read().count(${JSON.stringify(marker)}))`,
        }),
      });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      return Number(r.body.stdout);
    } finally {
      await api(`/v1/sessions/${session}`, { method: 'DELETE', key: teamKey });
    }
  };

  it('refuses malformed and unsafe patches with 400 and leaves nothing behind; only org admins may submit', async () => {
    const before = head();
    const good = patchOf({ 'README.md': (t) => `${t}\nA line.\n` });
    const bad = {
      'not a patch': 'this is not a patch at all',
      'outside the repo': good.replaceAll('README.md', '../outside.md'),
      'into .git': good.replaceAll('a/README.md', 'a/.git/config').replaceAll('b/README.md', 'b/.git/config'),
      'does not apply': good.replace(/^ .*$/m, ' a context line that is not in the file'),
      'a symbolic link':
        'diff --git a/link b/link\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n',
    };
    for (const [what, patch] of Object.entries(bad)) {
      const r = await submit(patch, `malformed: ${what}`);
      expect(r.status, what).toBe(400);
      expect(r.body.error, what).toMatchObject({
        type: 'invalid_request_error',
        code: 'invalid_request',
        request_id: expect.any(String),
      });
    }
    expect(
      (await api('/v1/system/updates', { method: 'POST', body: JSON.stringify({ patch: '', reason: 'x' }) })).status,
    ).toBe(400);
    expect(
      (
        await api('/v1/system/updates', {
          method: 'POST',
          body: JSON.stringify({ patch: good, reason: 'x' }),
          key: teamKey,
        })
      ).status,
    ).toBe(403);
    expect((await api('/v1/system/version', { key: teamKey })).status).toBe(403);

    expect((await api('/v1/system/updates')).body.data).toEqual([]);
    expect(head()).toBe(before);
    expect(worktrees()).toBe(1);
    expect(git(checkout, 'for-each-ref', 'refs/kiln')).toBe('');
    expect(existsSync(join(checkout, '..', 'outside.md'))).toBe(false);
    expect(git(checkout, 'status', '--porcelain')).toBe('');
  });

  it('rejects a patch that breaks type-checking: status failed with the tsc log, the server untouched', async () => {
    const before = head();
    const version = (await api('/v1/system/version')).body;
    expect(version).toMatchObject({ commit: before, pid: first.child.pid, branch: expect.any(String) });
    // The dashboard is type-checked too (its own tsconfig), after the API. A new file nothing
    // imports: the API's check passes and keeps its state, from which the next check starts
    // (a broken dom.ts, which the API's tests import, made the next check re-check what uses it).
    const patch = patchOf({
      'apps/dashboard/src/broken.ts': () => "export const broken: number = 'not a number';\n",
    });
    const r = await submit(patch, 'A change that does not type-check');
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ status: 'checking', changed_paths: ['apps/dashboard/src/broken.ts'] });
    // One update at a time.
    expect((await submit(patch, 'again')).status).toBe(409);

    const done = await settled(r.body.id, ['checking']);
    expect(done.status).toBe('failed');
    expect(done.checks.map((c: { name: string; ok: boolean }) => [c.name, c.ok])).toEqual([
      ['install', true],
      ['typecheck', false],
    ]);
    expect(done.checks[1].log).toContain("error TS2322: Type 'string' is not assignable to type 'number'");
    expect(done.checks[1].log).toContain('-p tsconfig.json --noEmit false --declaration --emitDeclarationOnly');
    expect(done.checks[1].log).toContain('-p apps/dashboard/tsconfig.json');
    expect(done.checks[1].log).toContain('apps/dashboard/src/broken.ts');
    expect(done.error).toMatch(/typecheck/);
    expect((await api(`/v1/system/updates/${r.body.id}/apply`, { method: 'POST' })).status).toBe(409);

    expect(head()).toBe(before);
    expect(worktrees()).toBe(1);
    expect(alive(first.child.pid!)).toBe(true);
    expect((await api('/v1/system/version')).body).toEqual(version);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
  });

  const agentRun = { ws: '', run: '', approval: '' };

  it('lets the agent of a workspace an org admin enabled propose a source update, which waits for an org admin even in auto mode', async () => {
    const ws = (
      await api('/v1/workspaces', {
        method: 'POST',
        key: teamKey,
        body: JSON.stringify({ name: 'evolver', settings: { approval: { mode: 'auto' } } }),
      })
    ).body;
    expect(ws.settings.source_updates).toBe(false);
    // Team keys cannot turn it on, neither through the workspace's settings nor the system route.
    expect(
      (
        await api(`/v1/workspaces/${ws.id}`, {
          method: 'PATCH',
          key: teamKey,
          body: JSON.stringify({ settings: { source_updates: true } }),
        })
      ).status,
    ).toBe(400);
    const enable = (key?: string) =>
      api(`/v1/system/workspaces/${ws.id}/source-updates`, {
        method: 'PUT',
        key,
        body: JSON.stringify({ enabled: true }),
      });
    expect((await enable(teamKey)).status).toBe(403);
    expect((await enable()).body).toEqual({ workspace_id: ws.id, enabled: true });
    expect((await api(`/v1/workspaces/${ws.id}`, { key: teamKey })).body.settings.source_updates).toBe(true);

    // It type-checks, and its own test (in the check's test set) fails: the test step refuses it.
    // (A module of its own: a new export of ids.ts, which most of the API imports, re-checked all of it.)
    const patch = patchOf({
      'apps/api/src/lib/id-length.ts': () => 'export const ID_RANDOM_CHARS = 8;\n',
      'tests/smoke/ids-constant.test.ts': () =>
        "import { expect, it } from 'vitest';\nimport { ID_RANDOM_CHARS } from '../../apps/api/src/lib/id-length.ts';\n\nit('ids carry nine random characters', () => {\n  expect(ID_RANDOM_CHARS).toBe(9);\n});\n",
    });
    fake.script(
      {
        content: `<thinking>The id helper needs a constant.</thinking>\n<propose_source_update><reason>Add a constant to the id helper</reason><patch>\n${patch}</patch></propose_source_update>`,
      },
      { content: '<thinking>It is submitted.</thinking><finish>I proposed a platform update.</finish>' },
    );
    const ses = (await api(`/v1/workspaces/${ws.id}/sessions`, { method: 'POST', key: teamKey, body: '{}' })).body;
    const posted = await api(`/v1/sessions/${ses.id}/messages`, {
      method: 'POST',
      key: teamKey,
      body: JSON.stringify({ content: 'Improve the platform' }),
    });
    expect(posted.status).toBe(202);
    const runId = posted.body.run.id as string;
    await waitFor('the run to wait for an approval', async () =>
      (await api(`/v1/runs/${runId}`, { key: teamKey })).body.status === 'requires_action' ? true : undefined,
    );
    const pending = (await api('/v1/approvals?status=pending', { key: teamKey })).body.data;
    expect(pending).toHaveLength(1);
    expect(pending[0]).toMatchObject({ run_id: runId, requires_org_admin: true });
    expect(pending[0].code).toContain(
      'Reason: Add a constant to the id helper\n\ndiff --git a/apps/api/src/lib/id-length.ts',
    );
    const byOwner = await api(`/v1/approvals/${pending[0].id}`, {
      method: 'POST',
      key: teamKey,
      body: JSON.stringify({ decision: 'approve' }),
    });
    expect(byOwner.status).toBe(403);
    expect((await api('/v1/approvals?status=pending')).body.data.map((a: { id: string }) => a.id)).toEqual([
      pending[0].id,
    ]);
    expect((await api('/v1/system/updates')).body.data).toHaveLength(1);
    Object.assign(agentRun, { ws: ws.id, run: runId, approval: pending[0].id });
  });

  let applied: { id: string; commit: string; before: string };
  /** What the applied patch writes into the runner's source, and the sandbox image before it. */
  const MARKER = 'patched by a self-update';
  let imageBefore: string;

  it('applies a good patch: self-check passes, one of two concurrent applies wins, the relay restarts into the new commit', async () => {
    const before = head();
    const patch = patchOf({
      'apps/api/src/routes/health/health.index.ts': (t) =>
        t.replace(
          ".openapi(healthz, (c) => c.json({ status: 'ok' as const }, 200))",
          ".openapi(healthz, (c) => {\n      c.header('x-kiln-patched', 'yes');\n      return c.json({ status: 'ok' as const }, 200);\n    })",
        ),
      // A dashboard change too: the new server must serve a new build of it.
      'apps/dashboard/index.html': (t) => t.replace('<title>Kiln ops</title>', '<title>Kiln ops (patched)</title>'),
      // And the sandbox runner's: the new server's sandboxes must run a new build of the image.
      'sandbox-image/runner/kiln_runner.py': (t) => `${t}# ${MARKER}\n`,
    });
    expect(patch).toContain('x-kiln-patched');
    expect(patch).toContain('Kiln ops (patched)');
    const r = await submit(patch, 'Say which build answers /healthz');
    expect(r.status).toBe(202);
    const ready = await settled(r.body.id, ['checking']);
    expect(ready.status, JSON.stringify(ready.checks.at(-1))).toBe('ready');
    expect(ready.checks.map((c: { name: string }) => c.name)).toEqual([
      'install',
      'typecheck',
      'dashboard',
      'smoke',
      'boot',
      'readyz',
    ]);
    expect(ready.checks.every((c: { ok: boolean }) => c.ok)).toBe(true);
    // The patch changes the dashboard: it is type-checked and built anew.
    expect(ready.checks[2].log).toContain('vite.js build apps/dashboard');
    expect(JSON.stringify(ready.checks)).not.toMatch(/kiln_admin_[A-Za-z0-9_-]{20}/);
    const commit = ready.commit_sha as string;
    expect(head()).toBe(before);
    expect(worktrees()).toBe(1);

    imageBefore = await imageId();
    expect(await runnerHas(MARKER)).toBe(0);
    const [a, b] = await Promise.all(
      [1, 2].map(() => api(`/v1/system/updates/${r.body.id}/apply`, { method: 'POST' })),
    );
    expect([a!.status, b!.status].sort()).toEqual([202, 409]);
    expect([a, b].find((x) => x!.status === 409)!.body.error.code).toBe('conflict');
    expect([a, b].find((x) => x!.status === 202)!.body.status).toBe('applying');

    // The old process drains and exits by itself (SIGTERM from the relay).
    expect(await first.exited).toBe(0);
    const v = await nextServer(first.child.pid!, commit);
    pids.add(v.pid);
    expect(head()).toBe(commit);
    expect(git(checkout, 'log', '-1', '--format=%B')).toMatch(
      new RegExp(`Kiln-Kind: source\\nKiln-Update: ${r.body.id}\\nKiln-Author: user`),
    );
    expect((await fetch(`${url}/healthz`)).headers.get('x-kiln-patched')).toBe('yes');
    expect(await (await fetch(`${url}/`)).text()).toContain('<title>Kiln ops (patched)</title>');
    // The relay built the servers' sandbox image from the new runner before starting the new server.
    expect(await imageId()).not.toBe(imageBefore);
    expect(await runnerHas(MARKER)).toBe(1);
    const fin = await settled(r.body.id, ['applying']);
    expect(fin.status).toBe('applied');
    expect(fin.checks.at(-1)).toMatchObject({ name: 'restart', ok: true });
    expect(
      (await api('/v1/system/updates')).body.data.map((u: { id: string; status: string }) => [u.id, u.status]),
    ).toEqual([
      [r.body.id, 'applied'],
      [expect.any(String), 'failed'],
    ]);
    const audit = await api('/v1/audit?limit=100');
    const actions = audit.body.data
      .filter((e: { resource_id: string }) => e.resource_id === r.body.id)
      .map((e: { action: string }) => e.action);
    expect(actions).toEqual(
      expect.arrayContaining([
        'system.update.submit',
        'system.update.check',
        'system.update.apply',
        'system.update.applied',
      ]),
    );
    // The team's webhook hears of it: owed in the transaction that marked it applied, delivered
    // by the server running the new code.
    const heard = await waitFor('the update.applied delivery', async () =>
      received.find((d) => d.body.type === 'update.applied' && d.body.data.update_id === r.body.id),
    );
    expect(heard.body.data).toMatchObject({ status: 'applied' });
    expect(heard.headers['webhook-signature']).toMatch(/^v1,/);
    expect(JSON.stringify(heard.body)).not.toContain(commit);
    applied = { id: r.body.id, commit, before };
  });

  it('keeps the pending approval across the restart; once an org admin approves, the patch is submitted and self-checked', async () => {
    expect((await api(`/v1/runs/${agentRun.run}`, { key: teamKey })).body.status).toBe('requires_action');
    expect((await api('/v1/approvals?status=pending')).body.data.map((a: { id: string }) => a.id)).toEqual([
      agentRun.approval,
    ]);
    expect(
      (
        await api(`/v1/approvals/${agentRun.approval}`, {
          method: 'POST',
          body: JSON.stringify({ decision: 'approve' }),
        })
      ).status,
    ).toBe(200);
    await waitFor('the run to complete', async () =>
      (await api(`/v1/runs/${agentRun.run}`, { key: teamKey })).body.status === 'completed' ? true : undefined,
    );
    const told = fake.chats()[1].messages.at(-1).content as string;
    expect(told).toContain('[Source update submitted]');
    const id = /update (evo_[0-9a-z]+)/.exec(told)![1]!;
    const done = await settled(id, ['checking']);
    expect(done).toMatchObject({
      status: 'failed',
      reason: 'Add a constant to the id helper',
      changed_paths: ['apps/api/src/lib/id-length.ts', 'tests/smoke/ids-constant.test.ts'],
    });
    expect(done.checks.map((c: { name: string; ok: boolean }) => [c.name, c.ok])).toEqual([
      ['install', true],
      ['typecheck', true],
      ['dashboard', true],
      ['smoke', false],
    ]);
    // The server's test set, the patch's own test among them.
    expect(done.checks[3].log).toContain('vitest.mjs run tests/smoke tests/unit/docs.test.ts');
    expect(done.checks[3].log).toContain('ids carry nine random characters');
    expect(done.checks[3].log).toContain('expected 8 to be 9');
    expect(git(checkout, 'log', '-1', '--format=%B', `refs/kiln/updates/${id}`)).toContain('Kiln-Author: agent');
  });

  it('rolls back a patch that boots but is not ready on the live data: the commit reverted, the old version serving again', async () => {
    const before = head();
    const tree = git(checkout, 'rev-parse', 'HEAD^{tree}');
    const oldPid = (await api('/v1/system/version')).body.pid as number;
    // A bug that only shows on real data: /readyz fails as soon as a team exists. The
    // self-check boots on a throwaway empty database, so it passes there; the live database
    // has the team made in beforeAll, so the restarted server never becomes ready.
    const patch = patchOf({
      'apps/api/src/db/health.ts': (t) =>
        t.replace(
          'await db.execute(sql`select 1`);',
          "const r = await db.execute(sql`select count(*)::int as n from teams`);\n  if (JSON.stringify(r).includes('\"n\":0') === false) throw new Error('teams exist');",
        ),
    });
    expect(patch).toContain('teams exist');
    const r = await submit(patch, 'A readiness check that breaks on real data');
    const ready = await settled(r.body.id, ['checking']);
    expect(ready.status, JSON.stringify(ready.checks.at(-1))).toBe('ready');
    // Nothing the dashboard is made of changed: the running build stands, linked, not rebuilt.
    expect(ready.checks[2]).toMatchObject({ name: 'dashboard', ok: true });
    expect(ready.checks[2].log).toMatch(/are as in the running commit [0-9a-f]{12}: linked its build/);
    expect((await api(`/v1/system/updates/${r.body.id}/apply`, { method: 'POST' })).status).toBe(202);

    // The server that finishes the row is the one the relay kept: the previous version, restarted.
    const done = await settled(r.body.id, ['applying']);
    expect(done.status).toBe('rolled_back');
    const v = (await api('/v1/system/version')).body;
    pids.add(v.pid);
    expect(v.pid).not.toBe(oldPid);
    expect(v.commit).toBe(head());
    expect(alive(oldPid)).toBe(false);
    expect(done.error).toMatch(/readyz/);
    expect(done.checks.at(-1)).toMatchObject({ name: 'restart', ok: false });
    // The branch: the update's commit, then its revert; the tree is the one from before.
    expect(git(checkout, 'rev-parse', 'HEAD~1')).toBe(ready.commit_sha);
    expect(git(checkout, 'rev-parse', 'HEAD~2')).toBe(before);
    expect(git(checkout, 'rev-parse', 'HEAD^{tree}')).toBe(tree);
    expect(git(checkout, 'log', '-1', '--format=%B')).toContain(`Kiln-Update: ${r.body.id}`);
    expect(v.tree).toBe(tree);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    expect((await fetch(`${url}/healthz`)).headers.get('x-kiln-patched')).toBe('yes');
  });

  it('reverts an applied update through the same flow; runs in flight at the restart finish while it drains or are marked interrupted', async () => {
    const oldPid = (await api('/v1/system/version')).body.pid as number;
    const r = await api(`/v1/system/updates/${applied.id}/revert`, { method: 'POST' });
    expect(r.status).toBe(202);
    expect(r.body.changed_paths).toEqual([
      'apps/api/src/routes/health/health.index.ts',
      'apps/dashboard/index.html',
      'sandbox-image/runner/kiln_runner.py',
    ]);
    const ready = await settled(r.body.id, ['checking']);
    expect(ready.status, JSON.stringify(ready.checks.at(-1))).toBe('ready');

    // Two runs waiting on the model when the restart begins: one answer comes once the old
    // server has been told to stop (it drains and finishes that run), the other never comes.
    const ws = (await api('/v1/workspaces', { method: 'POST', key: teamKey, body: JSON.stringify({ name: 'busy' }) }))
      .body;
    const session = async () =>
      (await api(`/v1/workspaces/${ws.id}/sessions`, { method: 'POST', key: teamKey, body: '{}' })).body.id as string;
    const [s1, s2] = [await session(), await session()];
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    fake.script({ content: '<finish>finished while the server drained</finish>', until: released }, { hang: true });
    const asked = fake.chats().length;
    const post = async (s: string) =>
      (
        await api(`/v1/sessions/${s}/messages`, {
          method: 'POST',
          key: teamKey,
          body: JSON.stringify({ content: 'work' }),
        })
      ).body.run.id as string;
    const run1 = await post(s1);
    await fake.chatRequests(asked + 1);
    const run2 = await post(s2);
    await fake.chatRequests(asked + 2);

    expect((await api(`/v1/system/updates/${r.body.id}/apply`, { method: 'POST' })).status).toBe(202);
    const relayLog = join(dataDir, 'self-update', r.body.id, 'relay.log');
    await waitFor('the relay to send SIGTERM', async () =>
      existsSync(relayLog) && readFileSync(relayLog, 'utf8').includes(`SIGTERM ${oldPid}`) ? true : undefined,
    );
    release();

    const v = await nextServer(oldPid, ready.commit_sha);
    pids.add(v.pid);
    expect((await settled(r.body.id, ['applying'])).status).toBe('applied');
    expect((await fetch(`${url}/healthz`)).headers.get('x-kiln-patched')).toBeNull();
    // The dashboard was rebuilt from the reverted sources.
    expect(await (await fetch(`${url}/`)).text()).toContain('<title>Kiln ops</title>');
    // And the sandbox image from the reverted runner.
    expect(await runnerHas(MARKER)).toBe(0);
    expect(git(checkout, 'rev-parse', 'HEAD^{tree}')).toBe(git(checkout, 'rev-parse', `${applied.before}^{tree}`));
    // Only the draining old server can have completed run 1: the new one fails what it finds in flight.
    expect((await api(`/v1/runs/${run1}`, { key: teamKey })).body).toMatchObject({ status: 'completed' });
    expect((await api(`/v1/runs/${run2}`, { key: teamKey })).body).toMatchObject({
      status: 'failed',
      error: { code: 'interrupted' },
    });
  });
  it('a patch to the relay takes effect at the next update; a relay that never starts gets that update (one that changes package-lock.json, installed before type-checking) reverted while the server keeps running', async () => {
    const oldPid = (await api('/v1/system/version')).body.pid as number;
    const broken = patchOf({
      'apps/relay/src/relay.ts': (t) =>
        t.replace(
          '  async main(): Promise<void> {\n',
          '  async main(): Promise<void> {\n    // Broken on purpose: gone before it stops anything.\n    if (process.pid > 0) process.exit(3);\n',
        ),
    });
    expect(broken).toContain('process.exit(3)');
    const u1 = await submit(broken, 'Break the relay');
    const ready1 = await settled(u1.body.id, ['checking']);
    expect(ready1.status, JSON.stringify(ready1.checks.at(-1))).toBe('ready');
    expect((await api(`/v1/system/updates/${u1.body.id}/apply`, { method: 'POST' })).status).toBe(202);
    // The relay that applies it is the running version's, which works.
    const v1 = await nextServer(oldPid, ready1.commit_sha);
    pids.add(v1.pid);
    expect((await settled(u1.body.id, ['applying'])).status).toBe('applied');

    const tree = git(checkout, 'rev-parse', 'HEAD^{tree}');
    // A patch that adds a dependency, made the way a person would: npm resolves it into the lockfile.
    const scratch = mkTemp('kiln-patch-dep-');
    execFileSync('git', ['clone', '-q', checkout, scratch]);
    // Awaited, not synchronous: a test process stopped for the seconds npm takes keeps a socket the
    // server has closed meanwhile (its keep-alive is 5 s), and the next request fails on it with
    // "other side closed" (seen on a loaded machine).
    await promisify(execFile)(
      'npm',
      ['install', '--package-lock-only', '--no-audit', '--no-fund', '--save-dev', 'is-number@7.0.0'],
      { cwd: scratch },
    );
    git(scratch, 'add', '-A');
    const patch = `${git(scratch, 'diff', '--cached')}\n`;
    expect(patch).toContain('package-lock.json');
    const u2 = await submit(patch, 'Add is-number as a dev dependency');
    expect(u2.status).toBe(202);
    const ready2 = await settled(u2.body.id, ['checking']);
    expect(ready2.checks.map((c: { name: string; ok: boolean }) => [c.name, c.ok])).toEqual([
      ['install', true],
      ['typecheck', true],
      ['dashboard', true],
      ['smoke', true],
      ['boot', true],
      ['readyz', true],
    ]);
    // npm ci ran in the worktree (the unchanged-lockfile path only links node_modules).
    expect(ready2.checks[0].log).not.toContain('linked the running checkout');
    expect(ready2.checks[0].log).toMatch(/added \d+ packages/);
    // Its type-check ran with a compiler of its own: its state is not kept for later checks, while
    // those of earlier checks that passed are (the last applied update's included).
    const states = readdirSync(join(checkout, '.git', 'kiln-check'));
    expect(states).toContain(`${ready1.commit_sha}.api.tsbuildinfo`);
    expect(states.filter((f) => f.startsWith(ready2.commit_sha))).toEqual([]);
    expect(ready2.status).toBe('ready');
    expect((await api(`/v1/system/updates/${u2.body.id}/apply`, { method: 'POST' })).status).toBe(202);
    const done = await settled(u2.body.id, ['applying']);
    expect(done.status).toBe('failed');
    expect(done.error).toMatch(/relay did not start/);
    expect((await api('/v1/system/version')).body).toMatchObject({ pid: v1.pid, commit: ready1.commit_sha });
    expect(git(checkout, 'rev-parse', 'HEAD~1')).toBe(ready2.commit_sha);
    expect(git(checkout, 'rev-parse', 'HEAD^{tree}')).toBe(tree);
    expect(git(checkout, 'log', '-1', '--format=%B')).toContain(`Kiln-Update: ${u2.body.id}`);
    // The lock is free again: the next patch is looked at (and this one refused), not turned away with 409.
    expect((await submit('not a patch', 'after the failed relay')).status).toBe(400);
  });
});
