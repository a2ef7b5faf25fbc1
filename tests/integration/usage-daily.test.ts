import { sql } from 'drizzle-orm';
import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const today = () => new Date().toISOString().slice(0, 10);

describe('usage per workspace and day', () => {
  const ctx = useAgentApp('daily');

  it('counts model calls, tokens and runs per workspace and UTC day, over the days asked, for the team only', async () => {
    const a = await sessionIn(ctx.t, ctx.team);
    const b = await sessionIn(ctx.t, ctx.team);
    for (const s of [a, a, b]) {
      ctx.fake.script({ content: '<finish>ok</finish>', usage: { prompt_tokens: 100, completion_tokens: 5 } });
      expect((await converse(ctx.t, ctx.team.key, s.session, 'hi')).run.status).toBe('completed');
    }
    // A call of 20 days ago: outside the default 14 days, inside 30.
    const old = new Date(Date.now() - 20 * 86_400_000);
    await ctx.t.database.db.execute(
      sql`insert into usage (id, team_id, workspace_id, model, prompt_tokens, completion_tokens, created_at)
          values ('use_old', ${ctx.team.id}, ${a.ws}, 'fake-model', 7, 3, ${old.toISOString()}::timestamptz)`,
    );

    const r = await ctx.t.call('GET', '/v1/usage/daily', { key: ctx.team.key });
    expect(r.status).toBe(200);
    expect(r.body.to).toBe(today());
    expect(r.body.from).toBe(new Date(Date.now() - 13 * 86_400_000).toISOString().slice(0, 10));
    expect(r.body.data).toEqual(
      [
        { workspace_id: a.ws, day: today(), prompt_tokens: 200, completion_tokens: 10, calls: 2, runs: 2 },
        { workspace_id: b.ws, day: today(), prompt_tokens: 100, completion_tokens: 5, calls: 1, runs: 1 },
      ].sort((x, y) => x.workspace_id.localeCompare(y.workspace_id)),
    );

    const month = await ctx.t.call('GET', `/v1/usage/daily?days=30&workspace=${a.ws}`, { key: ctx.team.key });
    expect(month.body.data.map((d: { day: string; calls: number; runs: number }) => [d.day, d.calls, d.runs])).toEqual([
      [old.toISOString().slice(0, 10), 1, 0],
      [today(), 2, 2],
    ]);

    const other = await ctx.t.team('daily-other');
    expect((await ctx.t.call('GET', '/v1/usage/daily', { key: other.key })).body.data).toEqual([]);
    for (const q of ['days=0', 'days=367', 'days=x']) {
      const bad = await ctx.t.call('GET', `/v1/usage/daily?${q}`, { key: ctx.team.key });
      expect(bad.status, q).toBe(400);
      expect(bad.body.error.code).toBe('invalid_request');
    }
  });
});
