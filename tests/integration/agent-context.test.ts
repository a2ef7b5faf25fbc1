import { execFileSync } from 'node:child_process';
import { eq } from 'drizzle-orm';
import { describe, expect, it } from 'vitest';
import { sessions } from '../../apps/api/src/db/schema/index.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const SUMMARY =
  '<daily_log>\n- Computed the totals for ACME-42.\n</daily_log>\n<project_state>\n## Progress\nTotals done.\n## Todo\nChart.\n## Key identifiers\nACME-42, /workspace/data/totals.csv\n## Environment\nsandbox\n</project_state>';

/** The four levels of context condensation, each observed in the request the model receives. */
describe('context management', () => {
  const ctx = useAgentApp('context');
  const lastRequest = () =>
    ctx.fake.chats().at(-1).messages as { role: string; content: string | null; tool_calls?: unknown[] }[];
  const condensed = (events: { event: string; data: unknown }[]) =>
    events
      .filter((e) => e.event === 'context.condensed')
      .map((e) => e.data as { levels: number[]; before_tokens: number; after_tokens: number; budget: number });

  it('level 1: a long result of an earlier turn keeps its head and tail; the current turn is untouched', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script(
      { content: '<python>print("HEAD" + "lorem ipsum " * 1500 + "TAIL")</python>' },
      { content: '<finish>printed</finish>' },
    );
    await converse(ctx.t, ctx.team.key, session, 'print a lot');
    ctx.fake.script(
      { content: '<python>print("NOW" + "dolor " * 1500)</python>' },
      { content: '<finish>again</finish>' },
    );
    const { events } = await converse(ctx.t, ctx.team.key, session, 'and now');
    const request = lastRequest();
    const result = (marker: string) =>
      request.find((m) => m.role === 'user' && m.content?.startsWith('Kiln System') && m.content.includes(marker))!;
    const old = result('HEAD');
    expect(old.content).toContain('omitted by Kiln');
    expect(old.content).toContain('TAIL');
    const current = result('NOW');
    expect(current.content).not.toContain('omitted by Kiln');
    const c = condensed(events);
    expect(c.some((x) => x.levels.includes(1) && x.after_tokens < x.before_tokens)).toBe(true);
  });

  it('level 2: over the turn limit, the oldest turns go to the daily log (a commit) and the project state', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' }, context: { max_turns: 2 } });
    ctx.fake.script({ content: '<finish>first done</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'turn one about ACME-42');
    ctx.fake.script({ content: '<finish>second done</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'turn two');
    ctx.fake.script({ content: SUMMARY }, { content: '<finish>third done</finish>' });
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'turn three');
    expect(run.status).toBe('completed');
    const summaryRequest = ctx.fake.chats().at(-2);
    expect(summaryRequest.messages[0].content).toContain('<daily_log>');
    expect(summaryRequest.messages[1].content).toContain('turn one about ACME-42');
    const request = lastRequest();
    expect(request[0]!.content).toContain('<Current_Project_State>');
    expect(request[0]!.content).toContain('ACME-42, /workspace/data/totals.csv');
    expect(request.map((m) => m.content).join('\n')).not.toContain('turn one about ACME-42');
    expect(request.map((m) => m.content).join('\n')).toContain('turn two');
    expect(condensed(events)[0]!.levels).toContain(2);
    const day = new Date().toISOString().slice(0, 10);
    const dir = ctx.t.workspaces.dirOf(ws);
    expect(execFileSync('git', ['-C', dir, 'show', `HEAD:memory/${day}.md`], { encoding: 'utf8' })).toContain(
      '- Computed the totals for ACME-42.',
    );
    expect(execFileSync('git', ['-C', dir, 'log', '-1', '--format=%B'], { encoding: 'utf8' })).toContain(
      'Kiln-Kind: memory',
    );
    const [row] = await ctx.t.database.db.select().from(sessions).where(eq(sessions.id, session));
    expect(row!.stateSnapshot).toContain('## Todo');
  });

  it('level 3: over the token limit with few turns, earlier turns shrink to their first message and last answer', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' }, context: { max_tokens: 1000 } });
    ctx.fake.script(
      { content: '<python>print("step one output")</python>' },
      { content: '<python>print("step two output")</python>' },
      { content: '<finish>the old answer</finish>' },
    );
    await converse(ctx.t, ctx.team.key, session, 'the old question');
    ctx.fake.script({ content: '<finish>new answer</finish>' });
    const { events } = await converse(ctx.t, ctx.team.key, session, 'a new question');
    const request = lastRequest();
    const texts = request.map((m) => m.content ?? '');
    expect(texts).toContain('the old question');
    expect(texts).toContain('the old answer');
    expect(texts.join('\n')).not.toContain('step one output');
    expect(texts.at(-1)).toBe('a new question');
    expect(condensed(events).some((x) => x.levels.includes(3))).toBe(true);
  });

  it('level 4: a context-length error summarises, cuts to the limit it names, and retries once', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    ctx.fake.script({ content: '<finish>earlier</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'an earlier turn about ACME-42');
    ctx.fake.script(
      {
        status: 400,
        error: {
          message:
            "This model's maximum context length is 3000 tokens. However, your messages resulted in 9000 tokens.",
          code: 'context_length_exceeded',
        },
      },
      { content: SUMMARY },
      { content: '<finish>fits now</finish>' },
    );
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'continue');
    expect(run.status).toBe('completed');
    const retried = lastRequest();
    expect(retried.map((m) => m.content).join('\n')).not.toContain('an earlier turn about ACME-42');
    expect(retried[0]!.content).toContain('<Current_Project_State>');
    const c = condensed(events);
    expect(c.at(-1)!.budget).toBe(2400);
    expect(c.some((x) => x.levels.includes(2))).toBe(true);
  });

  it('a second context-length error ends the run clearly', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    const overflow = {
      status: 400,
      error: { message: 'maximum context length is 2000 tokens', code: 'context_length_exceeded' },
    };
    ctx.fake.script(overflow, overflow);
    const { run } = await converse(ctx.t, ctx.team.key, session, 'too big');
    expect(run).toMatchObject({ status: 'failed', error: { code: 'context_overflow' } });
  });
});
