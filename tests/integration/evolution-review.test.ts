import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { sql } from 'drizzle-orm';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { EvolutionService } from '../../apps/api/src/evolution/service.ts';
import { JobRunner } from '../../apps/api/src/jobs/runner.ts';
import { ModelClient } from '../../apps/api/src/agent/llm.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const SKILL =
  '---\nname: csv-summary\ndescription: Summarise a CSV file column by column\n---\n\n1. `pd.read_csv(path)`\n2. `df.describe()`\n';

describe('post-session review (a durable job, with a scripted model)', () => {
  const ctx = useAgentApp('evolve');
  const auto = { approval: { mode: 'auto' } };

  const git = (ws: string, ...args: string[]) =>
    execFileSync('git', args, { cwd: ctx.t.workspaces.dirOf(ws), encoding: 'utf8' });
  const messagesOf = async (session: string) =>
    (await ctx.t.call('GET', `/v1/sessions/${session}/messages?limit=100&order=asc`, { key: ctx.team.key })).body
      .data as any[];
  const evolution = async (ws: string, id: string) =>
    (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions/${id}`, { key: ctx.team.key })).body;
  const requestReview = async (ws: string, session: string) => {
    const r = await ctx.t.call('POST', `/v1/workspaces/${ws}/review`, {
      key: ctx.team.key,
      body: { session_id: session },
    });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ kind: 'review', status: 'queued', session_id: session });
    return r.body.id as string;
  };

  /** A finished conversation in which the agent worked out a procedure. */
  async function workedSession(settings: object = auto) {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, settings);
    ctx.fake.script(
      {
        content:
          '<thinking>Summarise the numbers.</thinking><python>import pandas as pd\nprint(pd.Series([1, 2, 3]).describe()["mean"])</python>',
      },
      { content: '<finish>The mean is 2.0.</finish>' },
    );
    const { run } = await converse(ctx.t, ctx.team.key, session, 'Summarise the numbers 1, 2, 3 for me');
    expect(run.status).toBe('completed');
    return { ws, session };
  }

  it('creates a skill: one commit by the agent with Kiln-Evolution, an evolutions row, a message and an event in the session', async () => {
    const { ws, session } = await workedSession();
    const headBefore = git(ws, 'rev-parse', 'HEAD').trim();
    const id = await requestReview(ws, session);
    const chatsBefore = ctx.fake.chats().length;
    ctx.fake.script(
      { content: '<list_files>skills</list_files>' },
      {
        content: `<write_file path="skills/csv-summary/SKILL.md">\n${SKILL}</write_file>\n<finish>Saved the CSV summary procedure as a skill</finish>`,
      },
    );
    expect(await ctx.t.evolution.jobs.drain()).toBe(1);

    // The reviewer saw the whole session: the request, the code, its output, the answer.
    const brief = ctx.fake
      .chats()
      [chatsBefore].messages.map((m: any) => m.content)
      .join('\n');
    expect(brief).toContain('Summarise the numbers 1, 2, 3');
    expect(brief).toContain('pd.Series([1, 2, 3]).describe()');
    expect(brief).toContain('2.0');
    expect(brief).toContain('fix the skill file itself');
    // It got the listing it asked for before writing.
    expect(ctx.fake.chats()[chatsBefore + 1].messages.at(-1).content).toContain('skills/builtin/');

    const evo = await evolution(ws, id);
    expect(evo).toMatchObject({
      status: 'committed',
      changed_paths: ['skills/csv-summary/SKILL.md'],
      summary: 'Saved the CSV summary procedure as a skill',
    });
    expect(git(ws, 'rev-parse', 'HEAD~1').trim()).toBe(headBefore);
    expect(evo.commit_sha).toBe(git(ws, 'rev-parse', 'HEAD').trim());
    const body = git(ws, 'log', '-1', '--format=%B');
    expect(body).toContain(`Kiln-Evolution: ${id}`);
    expect(body).toContain('Kiln-Kind: skill');
    expect(body).toContain('Kiln-Author: agent');
    expect(body).toContain(`Kiln-Session: ${session}`);
    expect(git(ws, 'show', 'HEAD:skills/csv-summary/SKILL.md')).toBe(SKILL);
    const listed = (await ctx.t.call('GET', `/v1/workspaces/${ws}/commits?limit=1`, { key: ctx.team.key })).body
      .data[0];
    expect(listed).toMatchObject({ kind: 'skill', author: 'agent', evolution_id: id });

    // The session is told: a message, and a finished run of its own carrying evolution.committed.
    const last = (await messagesOf(session)).at(-1);
    expect(last.role).toBe('assistant');
    expect(last.content).toContain(id);
    expect(last.content).toContain('skills/csv-summary/SKILL.md');
    const events = (
      await ctx.t.call('GET', `/v1/runs/${last.run_id}/events`, {
        key: ctx.team.key,
        headers: { accept: 'application/json' },
      })
    ).body.data as any[];
    expect(events.map((e) => e.event)).toEqual([
      'run.created',
      'evolution.committed',
      'message.created',
      'run.completed',
    ]);
    expect(events[1].data).toMatchObject({
      evolution_id: id,
      commit: evo.commit_sha,
      paths: ['skills/csv-summary/SKILL.md'],
    });
    expect((await ctx.t.call('GET', `/v1/runs/${last.run_id}`, { key: ctx.team.key })).body.status).toBe('completed');

    // The next conversation's prompt lists the new skill and the evolution (so "undo that" has a name).
    ctx.fake.script({ content: '<finish>ok</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'thanks');
    const system = ctx.fake.chats().at(-1).messages[0].content as string;
    expect(system).toContain('csv-summary: Summarise a CSV file column by column');
    expect(system).toContain(`${id} (review`);
  });

  it('stays silent when nothing is worth keeping: no commit, no message, recorded as no_change', async () => {
    const { ws, session } = await workedSession();
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const before = await messagesOf(session);
    const id = await requestReview(ws, session);
    ctx.fake.script({ content: '<finish></finish>' });
    await ctx.t.evolution.jobs.drain();
    expect(await evolution(ws, id)).toMatchObject({ status: 'no_change', commit_sha: null, changed_paths: [] });
    expect(git(ws, 'rev-parse', 'HEAD').trim()).toBe(head);
    expect(await messagesOf(session)).toEqual(before);
  });

  it('a reviewer that first answers nothing is asked again without its empty answer in the request', async () => {
    const { ws, session } = await workedSession();
    const id = await requestReview(ws, session);
    const before = ctx.fake.chats().length;
    ctx.fake.script({ content: '' }, { content: '<finish></finish>' });
    await ctx.t.evolution.jobs.drain();
    expect(await evolution(ws, id)).toMatchObject({ status: 'no_change' });
    const retry = ctx.fake.chats()[before + 1];
    expect(retry.messages.map((m: { role: string }) => m.role)).toEqual(['system', 'user', 'user']);
  });

  it('fixes a skill at its source after seeing the tool error in the transcript (tool calling)', async () => {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, { ...auto, protocol: 'tools' });
    const broken = '---\nname: loader\ndescription: Load a CSV\n---\n\nCall `pd.read_cvs(path)`.\n';
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=skills/loader/SKILL.md`, {
      key: ctx.team.key,
      raw: broken,
    });
    const memoryBefore = git(ws, 'show', 'HEAD:MEMORY.md');
    ctx.fake.script(
      {
        content: 'Following the loader skill.',
        tool_calls: [{ name: 'python', arguments: { code: 'import pandas as pd\npd.read_cvs("data.csv")' } }],
      },
      {
        content: '',
        tool_calls: [{ name: 'finish', arguments: { summary: 'Loading failed: pandas has no read_cvs.' } }],
      },
    );
    await converse(ctx.t, ctx.team.key, session, 'Load data.csv with the loader skill');
    const id = await requestReview(ws, session);
    const chatsBefore = ctx.fake.chats().length;
    const fixed = broken.replace('read_cvs', 'read_csv');
    ctx.fake.script(
      { content: '', tool_calls: [{ name: 'read_file', arguments: { path: 'skills/loader/SKILL.md' } }] },
      {
        content: '',
        tool_calls: [{ name: 'write_file', arguments: { path: 'skills/loader/SKILL.md', content: fixed } }],
      },
      {
        content: '',
        tool_calls: [{ name: 'finish', arguments: { summary: 'Fixed the loader skill: read_csv, not read_cvs' } }],
      },
    );
    await ctx.t.evolution.jobs.drain();

    const first = ctx.fake.chats()[chatsBefore];
    expect(first.tools.map((x: any) => x.function.name)).toEqual([
      'read_file',
      'list_files',
      'write_file',
      'delete_file',
      'finish',
    ]);
    const brief = first.messages.map((m: any) => m.content).join('\n');
    expect(brief).toContain('AttributeError');
    expect(brief).toContain('read_cvs');
    // The read came back as a tool result with the file's content.
    const toolResult = ctx.fake.chats()[chatsBefore + 1].messages.at(-1);
    expect(toolResult).toMatchObject({ role: 'tool' });
    expect(toolResult.content).toContain('pd.read_cvs(path)');

    expect(await evolution(ws, id)).toMatchObject({ status: 'committed', changed_paths: ['skills/loader/SKILL.md'] });
    expect(git(ws, 'show', 'HEAD:skills/loader/SKILL.md')).toBe(fixed);
    expect(git(ws, 'show', 'HEAD:MEMORY.md')).toBe(memoryBefore);
  });

  it('the write guard refuses built-in skills, paths outside the workspace, source files and skills without front matter', async () => {
    const { ws, session } = await workedSession();
    const dir = ctx.t.workspaces.dirOf(ws);
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const id = await requestReview(ws, session);
    const chatsBefore = ctx.fake.chats().length;
    ctx.fake.script(
      {
        content: [
          '<write_file path="skills/builtin/memory/SKILL.md">---\nname: memory\ndescription: hacked\n---\n</write_file>',
          '<write_file path="../escaped.md">outside</write_file>',
          '<write_file path="/etc/kiln.md">absolute</write_file>',
          '<write_file path=".git/config">[core]</write_file>',
          '<write_file path="tools/run.py">import os</write_file>',
          '<write_file path="skills/bad/SKILL.md">no front matter here</write_file>',
          '<delete_file>AGENT.md.missing</delete_file>',
        ].join('\n'),
      },
      { content: '<finish>Tried a few things</finish>' },
    );
    await ctx.t.evolution.jobs.drain();
    const feedback = ctx.fake.chats()[chatsBefore + 1].messages.at(-1).content as string;
    expect(feedback.match(/refused:/g)?.length).toBe(7);
    expect(feedback).toContain('skills/builtin/ is read-only');
    expect(feedback).toContain('must not contain ".."');
    expect(feedback).toContain('must be relative to the workspace');
    expect(feedback).toContain('must not touch .git');
    expect(feedback).toContain('tools/run.py: outside what self-evolution may change');
    expect(feedback).toContain('front matter');
    expect(await evolution(ws, id)).toMatchObject({ status: 'no_change' });
    expect(git(ws, 'rev-parse', 'HEAD').trim()).toBe(head);
    expect(git(ws, 'status', '--porcelain')).toBe('');
    expect(existsSync(join(dirname(dir), 'escaped.md'))).toBe(false);
    expect(existsSync(join(dir, 'tools/run.py'))).toBe(false);
  });

  it('the agent undoes a review when the user asks: a revert commit by the agent, the evolution marked reverted', async () => {
    const { ws, session } = await workedSession();
    const id = await requestReview(ws, session);
    ctx.fake.script({
      content: `<write_file path="skills/csv-summary/SKILL.md">\n${SKILL}</write_file><finish>Added a skill</finish>`,
    });
    await ctx.t.evolution.jobs.drain();
    const evo = await evolution(ws, id);
    expect(evo.status).toBe('committed');

    ctx.fake.script(
      {
        content: `<thinking>The user wants the last self-evolution change undone.</thinking><undo_evolution>${id}</undo_evolution>`,
      },
      { content: '<finish>Undone.</finish>' },
    );
    const { run, names, events } = await converse(ctx.t, ctx.team.key, session, 'undo that change');
    expect(run.status).toBe('completed');
    expect(names).toContain('evolution.reverted');
    const reverted = events.find((e) => e.event === 'evolution.reverted')!.data as any;
    expect(reverted).toMatchObject({ evolution_id: id, paths: ['skills/csv-summary/SKILL.md'] });
    // The model was told what happened.
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toContain(`evolution ${id} was reverted`);
    expect(existsSync(join(ctx.t.workspaces.dirOf(ws), 'skills/csv-summary/SKILL.md'))).toBe(false);
    const body = git(ws, 'log', '-1', '--format=%B');
    expect(body).toContain(`Kiln-Reverts: ${evo.commit_sha}`);
    expect(body).toContain('Kiln-Author: agent');
    expect(body).toContain(`Kiln-Run: ${run.id}`);
    expect((await evolution(ws, id)).status).toBe('reverted');
    // Undoing twice is a conflict, through the API too.
    const again = await ctx.t.call('POST', `/v1/workspaces/${ws}/evolutions/${id}/undo`, { key: ctx.team.key });
    expect(again.status).toBe(409);
  });

  it('is triggered by idleness and enough turns, once per state, and never while a run is active', async () => {
    const settings = { ...auto, evolution: { review_idle_minutes: 5, review_min_turns: 2 } };
    const { ws, session } = await sessionIn(ctx.t, ctx.team, settings);
    const { session: short } = await (async () => {
      const s = await ctx.t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: ctx.team.key, body: {} });
      return { session: s.body.id as string };
    })();
    for (const text of ['first question', 'second question']) {
      ctx.fake.script({ content: '<finish>answered</finish>' });
      await converse(ctx.t, ctx.team.key, session, text);
    }
    ctx.fake.script({ content: '<finish>answered</finish>' });
    await converse(ctx.t, ctx.team.key, short, 'only one turn here');
    const queued = async () =>
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions?kind=review`, { key: ctx.team.key })).body
        .data as any[];

    expect(await ctx.t.evolution.scheduleReviews(new Date())).toBe(0); // not idle yet
    const later = new Date(Date.now() + 6 * 60_000);
    expect(await ctx.t.evolution.scheduleReviews(later)).toBe(1);
    expect((await queued()).map((e) => [e.kind, e.session_id, e.status])).toEqual([['review', session, 'queued']]);
    expect(await ctx.t.evolution.scheduleReviews(later)).toBe(0); // the same state is never queued twice
    expect(await queued()).toHaveLength(1);
    ctx.fake.script({ content: '<finish></finish>' });
    await ctx.t.evolution.jobs.drain();
    expect((await queued())[0].status).toBe('no_change');
    expect(await ctx.t.evolution.scheduleReviews(new Date(Date.now() + 60 * 60_000))).toBe(0); // reviewed, nothing new since
    expect(await queued()).toHaveLength(1);

    // With a run in progress, neither the API nor the scheduler starts a review.
    ctx.fake.script({ hang: true });
    const asked = ctx.fake.chats().length;
    const busy = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'a third question' },
    });
    await ctx.fake.chatRequests(asked + 1);
    const refused = await ctx.t.call('POST', `/v1/workspaces/${ws}/review`, {
      key: ctx.team.key,
      body: { session_id: session },
    });
    expect(refused.status).toBe(409);
    expect(refused.body.error).toMatchObject({ code: 'session_busy' });
    expect(await ctx.t.evolution.scheduleReviews(new Date(Date.now() + 24 * 60 * 60_000))).toBe(0);
    expect(await queued()).toHaveLength(1);
    await ctx.t.call('POST', `/v1/runs/${busy.body.run.id}/cancel`, { key: ctx.team.key });
  });

  it('two job runners on one database run a review exactly once', async () => {
    const { ws, session } = await workedSession();
    const second = new EvolutionService(
      {
        db: ctx.t.database.db,
        model: new ModelClient({
          baseURL: ctx.fake.url,
          apiKey: 'k',
          defaultModel: 'fake-model',
          maxRetries: 0,
          timeoutMs: 30_000,
        }),
        workspaces: ctx.t.workspaces,
        events: ctx.t.events,
        log: pino({ level: 'silent' }),
        maxFileBytes: 1024 * 1024,
      },
      new JobRunner(
        ctx.t.database.db,
        { instance: 'second-replica', leaseMs: 60_000, pollMs: 60_000 },
        pino({ level: 'silent' }),
      ),
      { tickMs: 60_000 },
    );
    const id = await requestReview(ws, session);
    const chatsBefore = ctx.fake.chats().length;
    ctx.fake.script({
      content: `<write_file path="knowledge/stats.md"># Stats\n\nMean of 1..3 is 2.</write_file><finish>Added a knowledge page</finish>`,
    });
    const [a, b] = await Promise.all([ctx.t.evolution.jobs.drain(), second.jobs.drain()]);
    expect(a + b).toBe(1);
    expect(ctx.fake.chats().length - chatsBefore).toBe(1);
    expect(await evolution(ws, id)).toMatchObject({ status: 'committed', changed_paths: ['knowledge/stats.md'] });
    expect(
      git(ws, 'log', '--format=%s', '-3')
        .split('\n')
        .filter((s) => s.startsWith('Review:')),
    ).toHaveLength(1);
  });

  it('a review that committed but died before telling the session is finished on its next attempt: told once, no second commit', async () => {
    const { ws, session } = await workedSession();
    const id = await requestReview(ws, session);
    ctx.fake.script({
      content: `<write_file path="knowledge/mean.md"># Mean\n\nThe mean of 1..3 is 2.</write_file><finish>Added a page</finish>`,
    });
    await ctx.t.evolution.jobs.drain();
    const evo = await evolution(ws, id);
    const told = (await messagesOf(session)).filter((m) => m.content.includes(id));
    expect(told).toHaveLength(1);
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const db = ctx.t.database.db;
    const crashAt = async () =>
      db
        .execute(
          sql`update jobs set status = 'running', locked_until = now() - interval '1 minute' where payload->>'evolution_id' = ${id}`,
        )
        .then(() =>
          db.execute(
            sql`update evolutions set status = 'running', commit_sha = null, changed_paths = '[]' where id = ${id}`,
          ),
        );

    // Died after the commit, before the session was told.
    await db.execute(sql`delete from runs where id = ${told[0].run_id}`);
    await db.execute(sql`delete from messages where id = ${told[0].id}`);
    await crashAt();
    const asked = ctx.fake.chats().length;
    expect(await ctx.t.evolution.jobs.drain()).toBe(1);
    expect(ctx.fake.chats().length).toBe(asked);
    expect(git(ws, 'rev-parse', 'HEAD').trim()).toBe(head);
    expect(await evolution(ws, id)).toMatchObject({
      status: 'committed',
      commit_sha: evo.commit_sha,
      changed_paths: ['knowledge/mean.md'],
    });
    expect((await messagesOf(session)).filter((m) => m.content.includes(id))).toHaveLength(1);

    // Died after telling the session, before the record was finished: not told twice.
    await crashAt();
    await ctx.t.evolution.jobs.drain();
    expect(await evolution(ws, id)).toMatchObject({ status: 'committed', commit_sha: evo.commit_sha });
    expect((await messagesOf(session)).filter((m) => m.content.includes(id))).toHaveLength(1);
  });
});
