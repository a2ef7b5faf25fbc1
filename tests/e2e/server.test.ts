import { mkdtempSync, readFileSync, rmSync, statSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { Agent, get } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { createPgDatabase, dropPgDatabase } from '../support/db.ts';
import { launchKiln, startKiln, type KilnProcess } from '../support/server.ts';

const docker = connectDocker(process.env.DOCKER_HOST);

/**
 * The real server as a child process, the way `npm start` runs it. A case starts one or two of
 * them, each 5–8 s alone (a new PGlite, tsx, the checks of Docker) and 20–25 s beside the rest
 * of the suite (2026-12-04): the kill -9 case took 44 s there, too near vitest's default minute.
 */
describe('the server process', { timeout: 120_000 }, () => {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  const dataDir = () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-e2e-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    return dir;
  };
  const track = (p: KilnProcess) => {
    cleanups.push(async () => {
      if (p.child.exitCode === null && p.child.signalCode === null) {
        p.child.kill('SIGKILL');
        await p.exited;
      }
    });
    return p;
  };
  const api = (p: KilnProcess, key: string, path: string, init: RequestInit = {}) =>
    fetch(`${p.url}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...init.headers },
    });
  /** A new team on the server and the key of its owner. */
  const ownerKey = async (p: KilnProcess, adminKey: string, name: string): Promise<string> => {
    const post = (path: string, body: unknown) =>
      api(p, adminKey, path, { method: 'POST', body: JSON.stringify(body) });
    const team = await (await post('/v1/teams', { name })).json();
    return (await (await post(`/v1/teams/${team.id}/keys`, { name: 'o', role: 'owner' })).json()).key;
  };

  it('first start on PGlite prints the URL and a new org-admin key (saved 0600); later starts do not', async () => {
    const dir = dataDir();
    const first = track(await startKiln({ KILN_DATA_DIR: dir }));
    expect(first.stdout()).toContain('database: pglite');
    const key = /(kiln_admin_\S+)/.exec(first.stdout())![1]!;
    const file = join(dir, 'admin.key');
    expect(readFileSync(file, 'utf8').trim()).toBe(key);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect((await fetch(`${first.url}/readyz`)).status).toBe(200);
    const team = await api(first, key, '/v1/teams', { method: 'POST', body: JSON.stringify({ name: 'persisted' }) });
    expect(team.status).toBe(201);
    first.child.kill('SIGTERM');
    expect(await first.exited).toBe(0);

    const second = track(await startKiln({ KILN_DATA_DIR: dir }));
    expect(second.stdout()).not.toContain('kiln_admin_');
    const teams = await (await api(second, key, '/v1/teams')).json();
    expect(teams.data.map((t: { name: string }) => t.name)).toEqual(['persisted']);
  });

  it('restarts cleanly after kill -9 in the middle of a burst of writes', async () => {
    const dir = dataDir();
    const adminKey = generateKey('admin');
    const first = track(await startKiln({ KILN_DATA_DIR: dir, KILN_ADMIN_KEY: adminKey }));
    const key = await ownerKey(first, adminKey, 'k9');

    // One request provably mid-flight: the server has parsed its headers (it answered
    // 100 Continue) and is waiting for the rest of the body.
    const { hostname: host, port } = new URL(first.url);
    const socket = connect(Number(port), host);
    const body = JSON.stringify({ name: 'half-sent' });
    socket.write(
      `POST /v1/workspaces HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${body.length}\r\nExpect: 100-continue\r\n\r\n`,
    );
    await new Promise<void>((resolve) =>
      socket.once('data', (d) => (String(d).includes('100 Continue') ? resolve() : undefined)),
    );
    socket.write(body.slice(0, 5));
    const closed = new Promise<string>((resolve) => {
      let got = '';
      socket.on('data', (d) => (got += d));
      socket.on('close', () => resolve(got));
      socket.on('error', () => undefined);
    });
    // And a burst of writes racing the kill. Ten: on the embedded database they take turns, so
    // the first answer comes once nearly all are done (40 took 9 s alone and 25 s beside the
    // rest of the suite, then as long again to replay at the restart, past the test's minute).
    const inflight = Array.from({ length: 10 }, (_, i) =>
      api(first, key, '/v1/workspaces', { method: 'POST', body: JSON.stringify({ name: `w${i}` }) }).then(
        (r) => r.status,
        () => 'aborted' as const,
      ),
    );
    await Promise.race(inflight);
    first.child.kill('SIGKILL');
    const outcomes = await Promise.all(inflight);
    expect(await closed).toBe('');
    await first.exited;

    const second = track(await startKiln({ KILN_DATA_DIR: dir, KILN_ADMIN_KEY: adminKey }));
    expect((await fetch(`${second.url}/readyz`)).status).toBe(200);
    const listed = await (await api(second, key, '/v1/workspaces?limit=100')).json();
    const created = outcomes.filter((o) => o === 201).length;
    expect(listed.data.length).toBeGreaterThanOrEqual(created);
    expect(listed.data.map((w: { name: string }) => w.name)).not.toContain('half-sent');
    for (const w of listed.data) expect((await api(second, key, `/v1/workspaces/${w.id}`)).status).toBe(200);
    const again = await api(second, key, '/v1/workspaces', {
      method: 'POST',
      body: JSON.stringify({ name: 'after-crash' }),
    });
    expect(again.status).toBe(201);
  });

  it('runs the same code on Postgres when DATABASE_URL is set', async () => {
    const url = await createPgDatabase();
    cleanups.push(() => dropPgDatabase(url));
    const dir = dataDir();
    const p = track(await startKiln({ KILN_DATA_DIR: dir, DATABASE_URL: url }));
    expect(p.stdout()).toContain('database: postgres');
    const key = /(kiln_admin_\S+)/.exec(p.stdout())![1]!;
    const ready = await (await fetch(`${p.url}/readyz`)).json();
    expect(ready.checks).toEqual({ database: { ok: true }, sandboxes: { ok: true }, docker: { ok: true } });
    expect((await api(p, key, '/v1/teams', { method: 'POST', body: JSON.stringify({ name: 'pg' }) })).status).toBe(201);
    expect(existsSync(join(dir, 'pglite'))).toBe(false);
  });

  it('with KILN_ADMIN_KEY set, uses that key and prints none', async () => {
    const dir = dataDir();
    const adminKey = generateKey('admin');
    const p = track(await startKiln({ KILN_DATA_DIR: dir, KILN_ADMIN_KEY: adminKey }));
    expect(p.stdout()).not.toContain('kiln_admin_');
    expect(existsSync(join(dir, 'admin.key'))).toBe(false);
    expect((await api(p, adminKey, '/v1/teams')).status).toBe(200);
    // An idle connection is kept 65 s, longer than a load balancer keeps its own, so the
    // balancer closes first (Node's default is 5 s).
    const keepAlive = await new Promise<string | undefined>((resolve, reject) =>
      get(`${p.url}/healthz`, { agent: new Agent({ keepAlive: true }) }, (res) => {
        res.resume();
        resolve(String(res.headers['keep-alive']));
      }).on('error', reject),
    );
    expect(keepAlive).toBe('timeout=65');
  });

  it('refuses to start on bad configuration, one line per problem, secrets hidden', async () => {
    const p = launchKiln({ KILN_PORT: 'abc', KILN_LOG_LEVEL: 'loud', KILN_ADMIN_KEY: 'short-secret' });
    expect(await p.exited).toBe(2);
    const lines = p.stderr().trim().split('\n');
    expect(lines[0]).toMatch(/3 problem/);
    expect(lines.slice(1).map((l) => l.trim().split(':')[0])).toEqual(
      expect.arrayContaining(['KILN_PORT', 'KILN_LOG_LEVEL', 'KILN_ADMIN_KEY']),
    );
    expect(p.stderr()).not.toContain('short-secret');
  });

  it('after kill -9, the next start removes the sandboxes the dead process left behind', async () => {
    const dir = dataDir();
    const adminKey = generateKey('admin');
    const instance = `e2e-${Date.now().toString(36)}`;
    const env = {
      KILN_DATA_DIR: dir,
      KILN_ADMIN_KEY: adminKey,
      KILN_INSTANCE_ID: instance,
      KILN_SANDBOX_POOL_SIZE: '1',
    };
    const first = track(await startKiln(env));
    const key = await ownerKey(first, adminKey, 'reap');
    const ws = await (
      await api(first, key, '/v1/workspaces', { method: 'POST', body: JSON.stringify({ name: 'w' }) })
    ).json();
    const ses = await (
      await api(first, key, `/v1/workspaces/${ws.id}/sessions`, { method: 'POST', body: '{}' })
    ).json();
    const result = await (
      await api(first, key, `/v1/sessions/${ses.id}/exec`, { method: 'POST', body: JSON.stringify({ code: 'x = 1' }) })
    ).json();
    const mine = () => docker.listContainers({ all: true, filters: { label: [`kiln.owner=${instance}`] } });
    expect((await mine()).map((c) => c.Labels['kiln.sandbox'])).toContain(result.sandbox_id);
    first.child.kill('SIGKILL');
    await first.exited;
    expect((await mine()).length).toBeGreaterThanOrEqual(1);

    const second = track(await startKiln(env));
    const left = await mine();
    expect(left.map((c) => c.Labels['kiln.sandbox'])).not.toContain(result.sandbox_id);
    // Whatever is there now is the new process's warm pool.
    for (const c of left) expect(c.Labels['kiln.session']).toBe('');
    const listed = await (await api(second, key, '/v1/sandboxes')).json();
    expect(listed.data).toEqual([]);
    const next = await (
      await api(second, key, `/v1/sessions/${ses.id}/exec`, {
        method: 'POST',
        body: JSON.stringify({ code: '"x" in dir()' }),
      })
    ).json();
    expect(next).toMatchObject({ stdout: 'False\n', restarted: true });
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
    expect(await mine()).toEqual([]);
  });
});
