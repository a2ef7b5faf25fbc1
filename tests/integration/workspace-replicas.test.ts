import { execFileSync } from 'node:child_process';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { commits } from '../../apps/api/src/db/schema/index.ts';
import { converse } from '../support/agent.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { writeAtOnceThrough } from '../support/replicas.ts';
import { type FakeOpenAI, startFakeOpenAI } from '../support/fake-openai.ts';

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
    const { history, git } = await writeAtOnceThrough([a, b], team.key, ws, 80);
    // Each answered commit is on main's history, in the table, and the workspace head is the last.
    const rows = await a.database.db.select().from(commits).where(eq(commits.workspaceId, ws));
    expect(rows.map((r) => r.sha).sort()).toEqual([...history].sort());
    const listed = await b.call('GET', `/v1/workspaces/${ws}`, { key: team.key });
    expect(listed.body.head).toBe(history[0]);
    git('fsck', '--no-progress');
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

describe('a review on one replica racing a revert on the other', () => {
  let fake: FakeOpenAI;
  let a: TestApp;
  let b: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    fake = await startFakeOpenAI();
    const model = { baseURL: fake.url, model: 'fake-model' };
    a = await createTestApp({ sandbox: false, model });
    b = await createTestApp({ sandbox: false, model, replicaOf: a });
    team = await a.team('replica-review');
  });
  afterAll(async () => {
    await b?.close();
    await a?.close();
    await fake?.close();
  });

  it("both land: the review's commit (its job run by B) and the revert (on A), in one consistent history", async () => {
    const ws = (
      await a.call('POST', '/v1/workspaces', {
        key: team.key,
        body: { name: 'review-race', settings: { approval: { mode: 'auto' } } },
      })
    ).body.id;
    const first = await a.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/x.md`, {
      key: team.key,
      raw: 'one\n',
    });
    expect(first.status).toBe(200);
    const session = (await a.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id;
    fake.script({ content: '<finish>Noted: the answer is 42.</finish>' });
    expect((await converse(a, team.key, session, 'Remember that the answer is 42')).run.status).toBe('completed');
    const review = await a.call('POST', `/v1/workspaces/${ws}/review`, {
      key: team.key,
      body: { session_id: session },
    });
    expect(review.status).toBe(202);
    fake.script({
      content:
        '<write_file path="knowledge/answer.md"># Answer\n\nIt is 42.</write_file><finish>Saved the answer</finish>',
    });
    // B's job runner takes the review while A reverts the first commit and keeps writing, one
    // write after another until the review is done: whenever the review commits, A is committing.
    let reviewing = true;
    const drained = b.evolution.jobs.drain().finally(() => {
      reviewing = false;
    });
    const reverting = a.call('POST', `/v1/workspaces/${ws}/commits/${first.body.commit.sha}/revert`, {
      key: team.key,
    });
    const written: { status: number; body: { commit: { sha: string } } }[] = [];
    for (let i = 0; reviewing && i < 500; i++)
      written.push(
        await a.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/a${i}.md`, { key: team.key, raw: `a${i}\n` }),
      );
    const [ran, revert] = await Promise.all([drained, reverting]);
    expect(ran).toBe(1);
    expect(revert.status).toBe(201);
    expect(written.length).toBeGreaterThan(0);
    expect(written.map((w) => w.status)).toEqual(written.map(() => 200));
    const evo = await b.call('GET', `/v1/workspaces/${ws}/evolutions/${review.body.id}`, { key: team.key });
    expect(evo.body).toMatchObject({ status: 'committed', changed_paths: ['knowledge/answer.md'] });

    const dir = a.workspaces.dirOf(ws);
    const tree = git(dir, 'ls-tree', '-r', '--name-only', 'HEAD').split('\n');
    expect(tree).toContain('knowledge/answer.md');
    expect(tree).not.toContain('knowledge/x.md');
    for (let i = 0; i < written.length; i++) expect(tree).toContain(`knowledge/a${i}.md`);
    const history = git(dir, 'rev-list', 'HEAD').trim().split('\n');
    expect(history).toContain(evo.body.commit_sha);
    for (const w of written) expect(history).toContain(w.body.commit.sha);
    expect(history).toContain(revert.body.commit.sha);
    const rows = await a.database.db.select().from(commits).where(eq(commits.workspaceId, ws));
    expect(rows.map((r) => r.sha).sort()).toEqual([...history].sort());
    expect(git(dir, 'status', '--porcelain')).toBe('');
    git(dir, 'fsck', '--no-progress');
    expect(fake.refusals).toEqual([]);
  });
});
