import { eq } from 'drizzle-orm';
import pino from 'pino';
import { beforeAll, describe, expect, it } from 'vitest';
import { RunEventLog } from '../../apps/api/src/agent/events.ts';
import { ModelClient } from '../../apps/api/src/agent/llm.ts';
import { AgentService } from '../../apps/api/src/agent/service.ts';
import { approvals, runs } from '../../apps/api/src/db/schema/index.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, eventsUntil, PAUSED, pendingApproval, TERMINAL } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

describe('approvals', () => {
  const ctx = useAgentApp('approvals');
  let member: string;
  const paused = PAUSED;
  const pending = (session: string) => pendingApproval(ctx.t, ctx.team.key, session);

  beforeAll(async () => {
    member = (
      await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
        key: ctx.team.key,
        body: { name: 'm', role: 'member' },
      })
    ).body.key;
  });

  it('ask: the run waits in requires_action; only a key that may approve decides; approve runs the code', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print("approved code ran")</python>' }, { content: '<finish>ok</finish>' });
    const first = await converse(ctx.t, ctx.team.key, session, 'run it', paused);
    expect(first.run.status).toBe('requires_action');
    const requested = first.events.find((e) => e.event === 'approval.requested')!;
    expect((requested.data as { code: string }).code).toBe('print("approved code ran")');
    const a = await pending(session);
    expect(a).toMatchObject({ status: 'pending', code: 'print("approved code ran")', run_id: first.run.id });
    const denied = await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: member, body: { decision: 'approve' } });
    expect(denied.status).toBe(403);
    const ok = await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'approve' } });
    expect(ok.body).toMatchObject({ status: 'approved', decision: 'approve' });
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(events.map((e) => e.event)).toEqual(expect.arrayContaining(['approval.resolved', 'exec.completed']));
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain('approved code ran');
    const twice = await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'deny' } });
    expect(twice.status).toBe(409);
    expect(twice.body.error.code).toBe('conflict');
  });

  it('deny: the code never runs and the model is told a person refused', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script(
      { content: '<python>open("/tmp/should-not-exist", "w").write("x")</python>' },
      { content: '<finish>understood</finish>' },
    );
    const first = await converse(ctx.t, ctx.team.key, session, 'do it', paused);
    const a = await pending(session);
    await ctx.t.call('POST', `/v1/approvals/${a.id}`, {
      key: ctx.team.key,
      body: { decision: 'deny', reason: 'not today' },
    });
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.map((e) => e.event)).not.toContain('exec.started');
    const told = ctx.fake.chats().at(-1).messages.at(-1).content as string;
    expect(told).toContain('[User Denied]');
    expect(told).toContain('not today');
  });

  it('approve_session stops asking for that session only', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script(
      { content: '<python>print(1)</python>' },
      { content: '<python>print(2)</python>' },
      { content: '<finish>two</finish>' },
    );
    const first = await converse(ctx.t, ctx.team.key, session, 'count', paused);
    const a = await pending(session);
    await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: ctx.team.key, body: { decision: 'approve_session' } });
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(events.filter((e) => e.event === 'approval.requested')).toHaveLength(1);
    expect(events.filter((e) => e.event === 'exec.completed')).toHaveLength(2);
    const other = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print(3)</python>' });
    const elsewhere = await converse(ctx.t, ctx.team.key, other.session, 'count', paused);
    expect(elsewhere.run.status).toBe('requires_action');
    await ctx.t.call('POST', `/v1/runs/${elsewhere.run.id}/cancel`, { key: ctx.team.key });
  });

  it('policy rules: deny first, then ask, then allow, then the mode', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, {
      approval: {
        mode: 'ask',
        rules: [
          { match: 'shutil\\.rmtree', behavior: 'deny' },
          { match: '^print\\(', behavior: 'allow' },
        ],
      },
    });
    ctx.fake.script(
      { content: '<python>print("allowed by rule")</python>' },
      { content: '<python>import shutil\nshutil.rmtree("/workspace")</python>' },
      { content: '<finish>done</finish>' },
    );
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'rules', paused);
    expect(run.status).toBe('completed');
    expect(events.filter((e) => e.event === 'exec.completed')).toHaveLength(1);
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toMatch(/\[Denied by policy\].*shutil/);
  });

  it('expiry fails closed and tells the model nobody answered; deciding later is 409 approval_expired', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print("never")</python>' }, { content: '<finish>will ask later</finish>' });
    const first = await converse(ctx.t, ctx.team.key, session, 'expire', paused);
    const a = await pending(session);
    await ctx.t.database.db
      .update(approvals)
      .set({ expiresAt: new Date(Date.now() - 1000) })
      .where(eq(approvals.id, a.id));
    expect(await ctx.t.agent.sweepExpired()).toBe(1);
    const events = await eventsUntil(ctx.t, first.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(events.map((e) => e.event)).not.toContain('exec.started');
    const told = ctx.fake.chats().at(-1).messages.at(-1).content as string;
    expect(told).toContain('[Approval Expired]');
    expect(told).toContain('not a refusal');
    const late = await ctx.t.call('POST', `/v1/approvals/${a.id}`, {
      key: ctx.team.key,
      body: { decision: 'approve' },
    });
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('approval_expired');
  });

  it('a pending approval survives a restart; runs in flight at the restart are marked interrupted', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print("after restart")</python>' }, { content: '<finish>resumed</finish>' });
    const first = await converse(ctx.t, ctx.team.key, session, 'survive', paused);
    const a = await pending(session);
    // Another run left in_progress by a crash (no process is running it any more).
    const ghost = await sessionIn(ctx.t, ctx.team);
    await ctx.t.database.db.insert(runs).values({
      id: 'run_ghost',
      teamId: ctx.team.id,
      workspaceId: ghost.ws,
      sessionId: ghost.session,
      status: 'in_progress',
      model: 'fake-model',
    });

    // A second service on the same database is what a restarted server is.
    const restartedEvents = new RunEventLog(ctx.t.database.db);
    const restarted = new AgentService({
      db: ctx.t.database.db,
      events: restartedEvents,
      model: new ModelClient({
        baseURL: ctx.fake.url,
        apiKey: 'k',
        defaultModel: 'fake-model',
        maxRetries: 0,
        timeoutMs: 30_000,
      }),
      engine: ctx.t.engine,
      workspaces: ctx.t.workspaces,
      log: pino({ level: 'silent' }),
    });
    await restarted.startup();
    const [ghostRun] = await ctx.t.database.db.select().from(runs).where(eq(runs.id, 'run_ghost'));
    expect(ghostRun).toMatchObject({ status: 'failed', error: { code: 'interrupted' } });
    expect((await ctx.t.call('GET', `/v1/runs/${first.run.id}`, { key: ctx.team.key })).body.status).toBe(
      'requires_action',
    );
    const principal = { keyId: 'key_x', role: 'owner' as const, teamId: ctx.team.id, canApprove: true };
    const done = eventsUntil({ events: restartedEvents }, first.run.id, TERMINAL);
    await restarted.decide(principal, a.id, 'approve');
    const events = await done;
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain('after restart');
    await restarted.stop();
  });

  it('lists approvals oldest first and pages them with the cursor', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team);
    const made: string[] = [];
    const runIds: string[] = [];
    for (let i = 0; i < 3; i++) {
      const s = (await ctx.t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: ctx.team.key, body: {} })).body.id;
      ctx.fake.script({ content: `<python>print(${i})</python>` });
      runIds.push((await converse(ctx.t, ctx.team.key, s, 'go', paused)).run.id);
      made.push((await pending(s)).id);
    }
    const q = `/v1/approvals?status=pending&workspace=${ws}&limit=2`;
    const p1 = await ctx.t.call('GET', q, { key: ctx.team.key });
    expect(p1.body).toMatchObject({ has_more: true, last_id: made[1] });
    expect(p1.body.data.map((a: { id: string }) => a.id)).toEqual(made.slice(0, 2));
    const p2 = await ctx.t.call('GET', `${q}&after=${p1.body.last_id}`, { key: ctx.team.key });
    expect(p2.body).toMatchObject({ has_more: false, last_id: made[2] });
    expect(p2.body.data.map((a: { id: string }) => a.id)).toEqual([made[2]]);
    for (const id of made)
      await ctx.t.call('POST', `/v1/approvals/${id}`, { key: ctx.team.key, body: { decision: 'deny' } });
  });

  it('another team cannot see or decide this team\u2019s approvals', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team);
    ctx.fake.script({ content: '<python>print("secret")</python>' });
    const first = await converse(ctx.t, ctx.team.key, session, 'x', paused);
    const a = await pending(session);
    const other = await ctx.t.team('approvals-other');
    expect((await ctx.t.call('GET', '/v1/approvals', { key: other.key })).body.data).toEqual([]);
    expect(
      (await ctx.t.call('POST', `/v1/approvals/${a.id}`, { key: other.key, body: { decision: 'approve' } })).status,
    ).toBe(404);
    expect((await ctx.t.call('GET', `/v1/runs/${first.run.id}`, { key: other.key })).status).toBe(404);
    expect((await ctx.t.call('GET', `/v1/runs/${first.run.id}/events`, { key: other.key })).status).toBe(404);
    expect((await ctx.t.call('POST', `/v1/runs/${first.run.id}/cancel`, { key: other.key })).status).toBe(404);
    expect(
      (await ctx.t.call('POST', `/v1/sessions/${session}/messages`, { key: other.key, body: { content: 'hi' } }))
        .status,
    ).toBe(404);
    await ctx.t.call('POST', `/v1/runs/${first.run.id}/cancel`, { key: ctx.team.key });
  });
});
