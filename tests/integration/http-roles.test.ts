import { and, eq } from 'drizzle-orm';
import { beforeAll, describe, expect, it } from 'vitest';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse, TERMINAL } from '../support/agent.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/** What each kind of key may cause, beyond what it may change: reads start nothing, org admins stay out of teams. */
describe('keys do only what their role allows', () => {
  const ctx = useAgentApp('roles');
  let viewer: string;

  beforeAll(async () => {
    viewer = (
      await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
        key: ctx.team.key,
        body: { name: 'v', role: 'viewer' },
      })
    ).body.key;
  });

  const sandboxRows = async (session: string) =>
    ctx.t.database.db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, session)));

  it('reading a session file starts no sandbox: /workspace is served as committed, other paths are 404 until one runs', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team);
    expect(
      (
        await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=notes/a.txt`, {
          key: ctx.team.key,
          raw: 'committed\n',
        })
      ).status,
    ).toBe(200);
    const read = await ctx.t.app.request(`/v1/sessions/${session}/files?path=/workspace/notes/a.txt`, {
      headers: { authorization: `Bearer ${viewer}` },
    });
    expect(read.status).toBe(200);
    expect(await read.text()).toBe('committed\n');
    const tmp = await ctx.t.call('GET', `/v1/sessions/${session}/files?path=/tmp/x`, { key: ctx.team.key });
    expect(tmp.status).toBe(404);
    expect(tmp.body.error.message).toContain('no sandbox running');
    // A viewer may not run code, so it reads nothing code could have made (issue: secrets read back by a viewer).
    const viewerTmp = await ctx.t.call('GET', `/v1/sessions/${session}/files?path=/tmp/x`, { key: viewer });
    expect(viewerTmp.status).toBe(403);
    expect(
      (await ctx.t.call('GET', `/v1/sessions/${session}/files?path=/workspace/nope.txt`, { key: viewer })).status,
    ).toBe(404);
    expect(
      (await ctx.t.call('GET', `/v1/sessions/${session}/files?path=/workspace/../x`, { key: viewer })).status,
    ).toBe(400);
    expect(await sandboxRows(session)).toEqual([]);

    // Once the session runs code, reads come from its sandbox (what the code wrote, not yet committed
    // elsewhere) for a key that may run code; a viewer still gets /workspace as committed, and no more.
    await exec(
      ctx.t,
      ctx.team.key,
      session,
      'open("/tmp/x", "w").write("from the sandbox")\nopen("/workspace/notes/a.txt", "w").write("written by code, then committed")',
    );
    const live = await ctx.t.app.request(`/v1/sessions/${session}/files?path=/tmp/x`, {
      headers: { authorization: `Bearer ${ctx.team.key}` },
    });
    expect(await live.text()).toBe('from the sandbox');
    expect((await ctx.t.call('GET', `/v1/sessions/${session}/files?path=/tmp/x`, { key: viewer })).status).toBe(403);
    const committed = await ctx.t.app.request(`/v1/sessions/${session}/files?path=/workspace/notes/a.txt`, {
      headers: { authorization: `Bearer ${viewer}` },
    });
    expect(await committed.text()).toBe('written by code, then committed');
    expect(await sandboxRows(session)).toHaveLength(1);
  });

  it('an org-admin key cannot see or decide a team\u2019s ordinary approval', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'ask' } });
    ctx.fake.script({ content: '<python>print("needs a person")</python>' }, { content: '<finish>ok</finish>' });
    const first = await converse(ctx.t, ctx.team.key, session, 'go', [...TERMINAL, 'run.requires_action']);
    expect(first.run.status).toBe('requires_action');
    const approval = (await ctx.t.call('GET', '/v1/approvals?status=pending', { key: ctx.team.key })).body.data.find(
      (a: { session_id: string }) => a.session_id === session,
    );
    const listed = await ctx.t.call('GET', '/v1/approvals?status=pending', { key: ctx.t.adminKey });
    expect(listed.body.data.map((a: { id: string }) => a.id)).not.toContain(approval.id);
    const decided = await ctx.t.call('POST', `/v1/approvals/${approval.id}`, {
      key: ctx.t.adminKey,
      body: { decision: 'approve' },
    });
    expect(decided.status).toBe(404);
    expect(
      (await ctx.t.call('GET', '/v1/approvals?status=pending', { key: ctx.team.key })).body.data.map(
        (a: { id: string }) => a.id,
      ),
    ).toContain(approval.id);
    expect((await ctx.t.call('GET', `/v1/runs/${first.run.id}`, { key: ctx.team.key })).body.status).toBe(
      'requires_action',
    );
    // The team itself still decides it.
    expect(
      (await ctx.t.call('POST', `/v1/approvals/${approval.id}`, { key: ctx.team.key, body: { decision: 'deny' } }))
        .status,
    ).toBe(200);
  });
});
