import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { dayIn } from '../../apps/api/src/evolution/dream.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const MEMORY = [
  '# Core memory',
  '',
  '- The user prefers tabs for indentation.',
  '- Tabs, not spaces, when formatting code for the user.',
  '- Deployments go to staging-1.',
  '- The team lead is Ada.',
  '',
].join('\n');

const DISTILLED = [
  '# Core memory',
  '',
  '- The user prefers tabs for indentation.',
  '- Deployments go to staging-2 (since today).',
  '- The team lead is Ada.',
].join('\n');

describe('deep dream (memory consolidation as a durable job, with a scripted model)', () => {
  const ctx = useAgentApp('dreamers');
  const auto = { approval: { mode: 'auto' } };
  const today = dayIn(new Date(), 'UTC');

  const git = (ws: string, ...args: string[]) =>
    execFileSync('git', args, { cwd: ctx.t.workspaces.dirOf(ws), encoding: 'utf8' });
  const show = (ws: string, path: string) => git(ws, 'show', `HEAD:${path}`);
  const evolution = async (ws: string, id: string) =>
    (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions/${id}`, { key: ctx.team.key })).body;
  const dream = async (ws: string, days?: number) => {
    const r = await ctx.t.call('POST', `/v1/workspaces/${ws}/dream`, { key: ctx.team.key, body: days ? { days } : {} });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ kind: 'dream', status: 'queued' });
    await ctx.t.evolution.jobs.drain();
    return evolution(ws, r.body.id);
  };

  async function workspaceWithMemory(settings: object = auto) {
    const { ws, session } = await sessionIn(ctx.t, ctx.team, settings);
    expect(
      (await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=MEMORY.md`, { key: ctx.team.key, raw: MEMORY })).status,
    ).toBe(200);
    return { ws, session };
  }

  // First: the schedule looks at every workspace of the database, and this one is the only one yet.
  it('runs nightly on dream_cron in the workspace time zone, once', async () => {
    const { ws } = await sessionIn(ctx.t, ctx.team, {
      evolution: { dream_cron: '55 23 * * *', timezone: 'Asia/Shanghai' },
    });
    const dreams = async () =>
      (await ctx.t.call('GET', `/v1/workspaces/${ws}/evolutions?kind=dream`, { key: ctx.team.key })).body.data as any[];
    // 23:55 in Shanghai is 15:55 UTC: the first such moment after the workspace was created.
    const fire = new Date();
    fire.setUTCHours(15, 55, 0, 0);
    if (fire.getTime() <= Date.now()) fire.setUTCDate(fire.getUTCDate() + 1);
    const at = (minutes: number) => new Date(fire.getTime() + minutes * 60_000);
    await ctx.t.evolution.scheduleDreams(at(-1));
    expect(await dreams()).toEqual([]);
    await ctx.t.evolution.scheduleDreams(at(1));
    expect((await dreams()).map((e) => e.status)).toEqual(['queued']);
    await ctx.t.evolution.scheduleDreams(at(2));
    expect(await dreams()).toHaveLength(1);
    // Nothing was said in this workspace: the dream skips, and says so.
    await ctx.t.evolution.jobs.drain();
    const [done] = await dreams();
    expect(done.status).toBe('skipped');
    expect(done.summary).toContain('no daily log');
  });
  it('logs the day, merges near-duplicates, lets the newer fact win, writes a diary: one commit', async () => {
    const { ws, session } = await workspaceWithMemory();
    ctx.fake.script({ content: '<finish>Noted: deployments now go to staging-2.</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'From today we deploy to staging-2 instead of staging-1.');
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const asked = ctx.fake.chats().length;
    ctx.fake.script(
      { content: '<daily_log>\n- The user moved deployments from staging-1 to staging-2.\n</daily_log>' },
      {
        content: `<memory>\n${DISTILLED}\n</memory>\n<diary>Two entries said the same about tabs; I merged them. The deploy target changed to staging-2, so the old staging-1 entry was replaced.</diary>\n<summary>Merged 2 tab entries, replaced the deploy target</summary>`,
      },
    );
    const evo = await dream(ws);

    // (1) the day's conversation went to the model for the daily log…
    const logRequest = ctx.fake
      .chats()
      [asked].messages.map((m: any) => m.content)
      .join('\n');
    expect(logRequest).toContain('From today we deploy to staging-2');
    // (2) …and the consolidation saw the old memory (both duplicates, the old fact) and the day's log.
    const distil = ctx.fake.chats()[asked + 1].messages;
    expect(distil[0].content).toContain('merge entries that say nearly the same thing');
    expect(distil[0].content).toContain('the newer fact replaces the old one');
    expect(distil[0].content).toContain('at most 50 entries');
    expect(distil[1].content).toContain('Tabs, not spaces');
    expect(distil[1].content).toContain('Deployments go to staging-1.');
    expect(distil[1].content).toContain(`<Daily_Log day="${today}">`);
    expect(distil[1].content).toContain('moved deployments from staging-1 to staging-2');
    expect(distil[1].content).not.toContain('kiln-logged');

    expect(evo).toMatchObject({ status: 'committed', summary: 'Merged 2 tab entries, replaced the deploy target' });
    expect(evo.changed_paths.sort()).toEqual(['MEMORY.md', `memory/${today}.md`, `memory/dreams/${today}.md`]);
    expect(evo.diary).toContain('merged them');
    expect(git(ws, 'rev-parse', 'HEAD~1').trim()).toBe(head);
    const body = git(ws, 'log', '-1', '--format=%B');
    expect(body).toContain(`Kiln-Evolution: ${evo.id}`);
    expect(body).toContain('Kiln-Kind: memory');
    expect(body).toContain('Kiln-Author: agent');
    expect(show(ws, 'MEMORY.md')).toBe(`${DISTILLED}\n`);
    expect(show(ws, `memory/${today}.md`)).toContain('- The user moved deployments from staging-1 to staging-2.');
    expect(show(ws, `memory/dreams/${today}.md`)).toContain('The deploy target changed to staging-2');

    // Revertible like any other commit.
    const undo = await ctx.t.call('POST', `/v1/workspaces/${ws}/evolutions/${evo.id}/undo`, { key: ctx.team.key });
    expect(undo.status).toBe(201);
    expect(show(ws, 'MEMORY.md')).toBe(MEMORY);
  });

  it('writes the daily log one fact per line, in the shape memory search finds by date', async () => {
    const { ws, session } = await workspaceWithMemory();
    ctx.fake.script({ content: '<finish>Noted.</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'The boiler in the Leith flat was serviced by Hamish today.');
    const asked = ctx.fake.chats().length;
    ctx.fake.script(
      // A model that answers in prose and nested bullets all the same.
      {
        content:
          '<daily_log>\n### Session\nThe user said the boiler in the Leith flat was serviced by Hamish.\n  * Next service due in a year.\n</daily_log>',
      },
      {
        content: `<memory>\n${DISTILLED}\n</memory>\n<diary>Nothing to merge.</diary>\n<summary>Logged the boiler service</summary>`,
      },
    );
    await dream(ws);
    expect(ctx.fake.chats()[asked].messages[0].content).toContain('One line per fact or turn');
    const log = show(ws, `memory/${today}.md`);
    expect(log).toContain(
      '### Session\n- The user said the boiler in the Leith flat was serviced by Hamish.\n- Next service due in a year.',
    );
    const r = await ctx.t.call(
      'GET',
      `/v1/workspaces/${ws}/memory/search?q=${encodeURIComponent('who serviced the boiler')}&path=memory/`,
      { key: ctx.team.key },
    );
    expect(r.body.data[0]).toMatchObject({ path: `memory/${today}.md`, date: today, heading: 'Session' });
    expect(r.body.data[0].snippet).toContain('serviced by Hamish');
  });

  it('skips when nothing is new, and never logs a message twice (even when the session goes on)', async () => {
    const { ws, session } = await workspaceWithMemory();
    ctx.fake.script({ content: '<finish>Sure.</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'Remember that reports are due on Fridays.');
    ctx.fake.script(
      { content: '<daily_log>\n- Reports are due on Fridays.\n</daily_log>' },
      {
        content: `<memory>\n${MEMORY.trim()}\n- Reports are due on Fridays.\n</memory><diary>Added the report deadline.</diary><summary>Added 1</summary>`,
      },
    );
    expect((await dream(ws)).status).toBe('committed');

    // Nothing new: no model call, no commit, and the log says why.
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const asked = ctx.fake.chats().length;
    const skipped = await dream(ws);
    expect(skipped).toMatchObject({ status: 'skipped', commit_sha: null });
    expect(skipped.summary).toContain('nothing new since the last dream');
    expect(ctx.fake.chats().length).toBe(asked);
    expect(git(ws, 'rev-parse', 'HEAD').trim()).toBe(head);

    // The session goes on: only the new messages are sent for the log, the earlier ones are not written again.
    ctx.fake.script({ content: '<finish>Noted.</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'Also: the standup moved to 10:00.');
    ctx.fake.script(
      { content: '<daily_log>\n- The standup moved to 10:00.\n</daily_log>' },
      {
        content: `<memory>\n${MEMORY.trim()}\n- Reports are due on Fridays.\n- Standup is at 10:00.\n</memory><diary>Added the standup time.</diary><summary>Added 1</summary>`,
      },
    );
    const before = ctx.fake.chats().length;
    expect((await dream(ws)).status).toBe('committed');
    const logRequest = ctx.fake.chats()[before].messages[1].content as string;
    expect(logRequest).toContain('standup moved to 10:00');
    expect(logRequest).not.toContain('reports are due on Fridays');
    const log = show(ws, `memory/${today}.md`);
    expect(log.match(/Reports are due on Fridays/g)).toHaveLength(1);
    expect(log.match(/kiln-logged/g)).toHaveLength(2);
  });

  it('refuses an empty, cut-off or over-the-cap MEMORY.md: one retry, then the dream fails and nothing is written', async () => {
    const { ws, session } = await workspaceWithMemory({ ...auto, evolution: { memory_max_entries: 4 } });
    ctx.fake.script({ content: '<finish>ok</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'My favourite colour is green.');
    const head = git(ws, 'rev-parse', 'HEAD').trim();
    const asked = ctx.fake.chats().length;
    ctx.fake.script(
      { content: '<daily_log>\n- Favourite colour: green.\n</daily_log>' },
      {
        content:
          '<memory>\n# Core memory\n\n- a\n- b\n- c\n- d\n- e\n</memory><diary>Kept everything.</diary><summary>x</summary>',
      },
      { content: '<memory>\n# Core memory\n</memory><diary>Dropped everything.</diary>' },
    );
    const failed = await dream(ws);
    expect(failed.status).toBe('failed');
    expect(failed.error).toContain('has no entries');
    // The retry was told exactly what was wrong with the first answer.
    expect(ctx.fake.chats()[asked + 2].messages.at(-1).content).toContain('5 entries; the limit is 4');
    expect(git(ws, 'rev-parse', 'HEAD').trim()).toBe(head);
    expect(show(ws, 'MEMORY.md')).toBe(MEMORY);
    expect(git(ws, 'status', '--porcelain')).toBe('');

    // A cut-off answer (no closing tag) is refused too; a good second answer is used.
    ctx.fake.script(
      { content: '<daily_log>\n- Favourite colour: green.\n</daily_log>' },
      { content: '<memory>\n# Core memory\n\n- The user prefers tabs.\n- Deploy' },
      {
        content:
          '<memory>\n# Core memory\n\n- The user prefers tabs.\n- Favourite colour: green.\n</memory><diary>Merged and added.</diary><summary>ok</summary>',
      },
    );
    const second = await dream(ws);
    expect(second.status).toBe('committed');
    expect(show(ws, 'MEMORY.md')).toBe('# Core memory\n\n- The user prefers tabs.\n- Favourite colour: green.\n');
  });
});
