import { execFileSync } from 'node:child_process';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { commits } from '../../apps/api/src/db/schema/index.ts';
import { createTestApp, type TestApp } from '../support/app.ts';

const git = (dir: string, ...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });

/**
 * Two replicas on one Postgres database and one workspaces directory, as docs/configuration.md
 * describes them: a workspace's writes are serialised across both by the database's lock.
 */
describe('two replicas writing to one workspace', () => {
  let a: TestApp;
  let b: TestApp;
  let team: { id: string; key: string };

  beforeAll(async () => {
    a = await createTestApp({ sandbox: false });
    b = await createTestApp({ sandbox: false, replicaOf: a });
    team = await a.team('replica-writes');
  });
  afterAll(async () => {
    await b?.close();
    await a?.close();
  });

  it('accepts 40 writes through each at once, and every one is in HEAD and the commit list', async () => {
    const ws = (await a.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'shared' } })).body.id;
    const writes = Array.from({ length: 80 }, (_, i) => ({ via: i % 2 ? b : a, path: `knowledge/w${i}.md` }));
    const answers = await Promise.all(
      writes.map(({ via, path }) =>
        via.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, {
          key: team.key,
          raw: `written as ${path}\n`,
        }),
      ),
    );
    expect(answers.map((r) => r.status)).toEqual(writes.map(() => 200));

    const dir = a.workspaces.dirOf(ws);
    const head = git(dir, 'ls-tree', '-r', '--name-only', 'HEAD').split('\n');
    for (const { path } of writes) expect(head, path).toContain(path);
    const shas = answers.map((r) => r.body.commit.sha as string);
    expect(new Set(shas).size).toBe(80);
    // Each answered commit is on main's history, in the table, and the workspace head is the last.
    const history = git(dir, 'rev-list', 'HEAD').trim().split('\n');
    for (const sha of shas) expect(history).toContain(sha);
    const rows = await a.database.db.select().from(commits).where(eq(commits.workspaceId, ws));
    expect(rows.map((r) => r.sha).sort()).toEqual([...history].sort());
    const listed = await b.call('GET', `/v1/workspaces/${ws}`, { key: team.key });
    expect(listed.body.head).toBe(history[0]);
    // Nothing stranded: a clean working tree and a consistent repository.
    expect(git(dir, 'status', '--porcelain')).toBe('');
    git(dir, 'fsck', '--no-progress');
  });

  it('serialises a revert on one replica with a write on the other', async () => {
    const ws = (await a.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'revert-race' } })).body.id;
    const put = (t: TestApp, path: string, text: string) =>
      t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key: team.key, raw: text });
    const first = await put(a, 'knowledge/x.md', 'one\n');
    expect(first.status).toBe(200);
    const [revert, write] = await Promise.all([
      a.call('POST', `/v1/workspaces/${ws}/commits/${first.body.commit.sha}/revert`, { key: team.key }),
      put(b, 'knowledge/y.md', 'two\n'),
    ]);
    expect([revert.status, write.status]).toEqual([201, 200]);
    const dir = a.workspaces.dirOf(ws);
    const head = git(dir, 'ls-tree', '-r', '--name-only', 'HEAD').split('\n');
    expect(head).toContain('knowledge/y.md');
    expect(head).not.toContain('knowledge/x.md');
    expect(git(dir, 'status', '--porcelain')).toBe('');
  });
});

/** Resolves when `t` hears news of `id` on `topic` (from its own replica or another). */
const heard = (t: TestApp, topic: 'key' | 'session' | 'workspace', id: string) =>
  new Promise<void>((resolve) => t.news.on(topic, (got) => got === id && resolve()));

describe("what one replica caches of another's writes", () => {
  let a: TestApp;
  let b: TestApp;
  beforeAll(async () => {
    a = await createTestApp({ sandbox: false });
    b = await createTestApp({ sandbox: false, replicaOf: a });
  });
  afterAll(async () => {
    await b?.close();
    await a?.close();
  });

  it('a key revoked on one replica is refused by the other as soon as the notification arrives', async () => {
    const team = await a.team('revoke-news');
    const made = await a.call('POST', `/v1/teams/${team.id}/keys`, {
      key: team.key,
      body: { name: 'short-lived', role: 'member' },
    });
    // B has the key in its cache.
    expect((await b.call('GET', '/v1/workspaces', { key: made.body.key })).status).toBe(200);
    const news = heard(b, 'key', made.body.id);
    expect((await a.call('DELETE', `/v1/teams/${team.id}/keys/${made.body.id}`, { key: team.key })).status).toBe(200);
    await news;
    expect((await b.call('GET', '/v1/workspaces', { key: made.body.key })).status).toBe(401);
  });

  it('a session ended on one replica is ended for the other as soon as the notification arrives', async () => {
    const team = await a.team('session-news');
    const ws = (await a.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'w' } })).body.id;
    const session = (await a.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id;
    const exec = () => b.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(1)' } });
    // B has the session in its cache as active (no container runtime here, so its exec answers 503).
    expect((await exec()).status).toBe(503);
    const news = heard(b, 'session', session);
    expect((await a.call('DELETE', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    await news;
    const after = await exec();
    expect(after.status).toBe(409);
    expect(after.body.error.message).toMatch(/ended/);
  });
});
