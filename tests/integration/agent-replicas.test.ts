import { execFileSync } from 'node:child_process';
import { eq, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { commits, runs } from '../../apps/api/src/db/schema/index.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { eventsUntil } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const gitOut = (dir: string, ...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });

/** Two API replicas on one Postgres database and one workspaces directory. */
describe('agent runs across replicas', () => {
  const ctx = useAgentApp('replicas');
  let b: TestApp;

  beforeAll(async () => {
    b = await createTestApp({ model: { baseURL: ctx.fake.url, model: 'fake-model' }, replicaOf: ctx.t });
  });
  afterAll(async () => {
    await b.close();
  });

  it('a cancel sent to the other replica stops the run where it runs: the model call is abandoned, one run.cancelled', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ hang: true });
    const asked = ctx.fake.chats().length;
    const posted = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'think forever' },
    });
    expect(posted.status).toBe(202);
    const runId = posted.body.run.id as string;
    await ctx.fake.chatRequests(asked + 1);

    const cancelled = await b.call('POST', `/v1/runs/${runId}/cancel`, { key: ctx.team.key });
    expect(cancelled.status).toBe(200);
    expect(cancelled.body.status).toBe('cancelled');
    // Replica A, which runs it, let go of the model call and recorded the end itself.
    await ctx.fake.hangsClosed(1);
    const events = await eventsUntil(ctx.t, runId, ['run.cancelled']);
    expect(events.filter((e) => ['run.completed', 'run.failed', 'run.cancelled'].includes(e.event))).toHaveLength(1);

    // The session is free again, on either replica.
    ctx.fake.script({ content: '<finish>ok</finish>' });
    const next = await b.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'again' },
    });
    expect(next.status).toBe(202);
    await eventsUntil(b, next.body.run.id, ['run.completed']);
  });

  it("an agent run's commits on one replica and files PUT through the other land in one consistent history", async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    const steps = 4;
    ctx.fake.script(
      ...Array.from({ length: steps }, (_, i) => ({
        content: `<python>open('/workspace/knowledge/agent-${i}.md', 'w').write('step ${i}\\n')</python>`,
      })),
      { content: '<finish>written</finish>' },
    );
    const posted = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'write four files' },
    });
    expect(posted.status).toBe(202);
    const runId = posted.body.run.id as string;
    // Replica B writes the same workspace until the run on A has ended.
    let ended = false;
    const done = eventsUntil(ctx.t, runId, ['run.completed', 'run.failed']).finally(() => {
      ended = true;
    });
    const written: string[] = [];
    while (!ended) {
      const path = `knowledge/b-${written.length}.md`;
      const put = await b.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, {
        key: ctx.team.key,
        raw: `from B ${written.length}\n`,
      });
      expect(put.status).toBe(200);
      written.push(path);
    }
    expect((await done).at(-1)!.event).toBe('run.completed');
    const dir = ctx.t.workspaces.dirOf(ws);
    const tree = gitOut(dir, 'ls-tree', '-r', '--name-only', 'HEAD').split('\n');
    for (const path of [...written, ...Array.from({ length: steps }, (_, i) => `knowledge/agent-${i}.md`)])
      expect(tree, path).toContain(path);
    expect(gitOut(dir, 'status', '--porcelain')).toBe('');
    const history = gitOut(dir, 'rev-list', 'HEAD').trim().split('\n');
    const rows = await b.database.db.select({ sha: commits.sha }).from(commits).where(eq(commits.workspaceId, ws));
    expect(rows.map((r) => r.sha).sort()).toEqual([...history].sort());
  });

  /** Another replica of `a` (with a short run lease when given). */
  const replica = (runLeaseMs?: number) =>
    createTestApp({ model: { baseURL: ctx.fake.url, model: 'fake-model' }, replicaOf: ctx.t, runLeaseMs });

  /** Posts a message on `app` whose model answer is held until `answer()`; resolves once the model was asked. */
  async function heldRun(app: TestApp, content = '<finish>held</finish>') {
    const { session } = await sessionIn(app, ctx.team, { approval: { mode: 'auto' } });
    let answer!: () => void;
    ctx.fake.script({ content, until: new Promise<void>((r) => (answer = r)) });
    const asked = ctx.fake.chats().length;
    const posted = await app.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'slow' },
    });
    expect(posted.status).toBe(202);
    await ctx.fake.chatRequests(asked + 1);
    return { session, runId: posted.body.run.id as string, answer };
  }
  const terminals = async (app: TestApp, runId: string) =>
    (await app.events.list(runId))
      .map((e) => e.event)
      .filter((e) => ['run.completed', 'run.failed', 'run.cancelled'].includes(e));

  it('a replica that starts leaves alone the runs another live replica is running', async () => {
    const { runId, answer } = await heldRun(ctx.t);
    const c = await replica();
    try {
      // C's start-up is over: the run is still A's, in progress.
      expect((await c.call('GET', `/v1/runs/${runId}`, { key: ctx.team.key })).body.status).toBe('in_progress');
      answer();
      const events = await eventsUntil(c, runId, ['run.completed', 'run.failed']);
      expect(events.at(-1)!.event).toBe('run.completed');
      expect(await terminals(ctx.t, runId)).toEqual(['run.completed']);
    } finally {
      await c.close();
    }
  });

  it('a run ended elsewhere while its model call was out: its own end adds no second terminal event, and the call still counts', async () => {
    const { session, runId, answer } = await heldRun(ctx.t, '<finish>too late</finish>');
    // Someone else ends the run meanwhile (written directly, without telling replica A).
    await b.database.db.update(runs).set({ status: 'cancelled', finishedAt: new Date() }).where(eq(runs.id, runId));
    await b.events.append(runId, 'run.cancelled', { status: 'cancelled', error: null });
    answer();
    // Replica A's loop gets its answer and ends the run as it sees it: the guard finds it ended.
    await expect
      .poll(async () => (await ctx.t.call('GET', `/v1/runs/${runId}`, { key: ctx.team.key })).body.usage.prompt_tokens)
      .toBe(100);
    expect((await ctx.t.call('GET', `/v1/runs/${runId}`, { key: ctx.team.key })).body.status).toBe('cancelled');
    expect(await terminals(ctx.t, runId)).toEqual(['run.cancelled']);
    // Its final message was still stored: nothing the run said is lost.
    const transcript = await ctx.t.call('GET', `/v1/sessions/${session}/messages`, { key: ctx.team.key });
    expect(transcript.body.data.at(-1)).toMatchObject({ role: 'assistant', content: 'too late' });
  });

  it('a server that died: once its lease runs out, another marks its runs interrupted; live leases are left alone', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    const other = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    const insert = (id: string, sessionId: string, runner: string, lease: string) =>
      ctx.t.database.db.execute(sql`insert into runs (id, team_id, workspace_id, session_id, status, model, runner, lease_until)
        values (${id}, ${ctx.team.id}, ${ws}, ${sessionId}, 'in_progress', 'fake-model', ${runner}, now() + ${lease}::interval)`);
    await insert('run_deadserver', session, 'dead-server', '300 milliseconds');
    await insert('run_liveserver', other.session, 'live-server', '1 hour');
    // A replica with a short lease looks for orphans every 200 ms.
    const d = await replica(600);
    try {
      await expect
        .poll(async () => (await d.call('GET', '/v1/runs/run_deadserver', { key: ctx.team.key })).body.status, {
          timeout: 15_000,
        })
        .toBe('failed');
      expect((await d.call('GET', '/v1/runs/run_deadserver', { key: ctx.team.key })).body.error).toMatchObject({
        code: 'interrupted',
      });
      expect(await terminals(d, 'run_deadserver')).toEqual(['run.failed']);
      expect((await d.call('GET', '/v1/runs/run_liveserver', { key: ctx.team.key })).body.status).toBe('in_progress');
    } finally {
      await d.close();
      await ctx.t.database.db.update(runs).set({ status: 'cancelled' }).where(eq(runs.id, 'run_liveserver'));
    }
  });

  it('a live server renews its runs: a long model call outlasts the lease many times and still completes', async () => {
    const d = await replica(600);
    const e = await replica(600);
    try {
      const { runId, answer } = await heldRun(d);
      const leaseOf = async () =>
        (await d.database.db.select({ l: runs.leaseUntil }).from(runs).where(eq(runs.id, runId)))[0]!.l!.getTime();
      const first = await leaseOf();
      // Renewed three times over (each lease 600 ms, renewed every 200 ms) while E sweeps for orphans.
      await expect.poll(leaseOf, { timeout: 15_000 }).toBeGreaterThan(first + 1200);
      expect((await e.call('GET', `/v1/runs/${runId}`, { key: ctx.team.key })).body.status).toBe('in_progress');
      answer();
      const events = await eventsUntil(e, runId, ['run.completed', 'run.failed']);
      expect(events.at(-1)!.event).toBe('run.completed');
      expect(await terminals(e, runId)).toEqual(['run.completed']);
    } finally {
      await e.close();
      await d.close();
    }
  });
});
