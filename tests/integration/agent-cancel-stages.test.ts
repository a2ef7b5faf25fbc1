import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import type { TestApp } from '../support/app.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { eventsUntil, TERMINAL } from '../support/agent.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
/** Code that leaves a marker: if the marker is there, the cancelled code ran. */
const MARKER = 'open("/tmp/cancelled-code-ran", "w").write("x")\nprint("ran")';
const ran = (t: TestApp, team: { key: string }, session: string) =>
  exec(t, team.key, session, 'import os; print(os.path.exists("/tmp/cancelled-code-ran"))').then((r) => r.stdout);

/**
 * A cancel that lands before the code reaches the runner (while the sandbox is claimed and
 * synced, or while the execution waits behind another) is never lost: the code does not run
 * and the run ends cancelled. The model-call and running stages are in agent-loop.test.ts.
 */
describe('a cancel at each stage of an execution', () => {
  const ctx = useAgentApp('cancel-stages');
  const auto = { approval: { mode: 'auto' } };

  it('while the session\u2019s sandbox is being claimed: the code never runs, the run ends cancelled', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    // One reply only: the cancelled run never asks the model again.
    ctx.fake.script({ content: `<python>${MARKER}</python>` });
    // The claim writes the sandbox's row first: holding the table makes it wait, deterministically.
    const sql = postgres(ctx.t.database.url!, { max: 2 });
    const locked = sql.reserve();
    const conn = await locked;
    await conn`begin`;
    await conn`lock table sandboxes in exclusive mode`;
    try {
      const r = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
        key: ctx.team.key,
        body: { content: 'go' },
      });
      await eventsUntil(ctx.t, r.body.run.id, ['exec.started']);
      // The claim is waiting for the lock (a state, not a guess about timing).
      for (;;) {
        const [w] =
          await sql`select count(*)::int as n from pg_locks l join pg_class c on c.oid = l.relation where c.relname = 'sandboxes' and not l.granted`;
        if (w!.n > 0) break;
      }
      expect((await ctx.t.call('POST', `/v1/runs/${r.body.run.id}/cancel`, { key: ctx.team.key })).status).toBeLessThan(
        300,
      );
      await conn`commit`;
      const events = await eventsUntil(ctx.t, r.body.run.id, TERMINAL);
      expect(events.at(-1)!.event).toBe('run.cancelled');
      const completed = events.find((e) => e.event === 'exec.completed')?.data as
        | { error: { type: string } }
        | undefined;
      if (completed) expect(completed.error.type).toBe('Cancelled');
      expect((await ctx.t.call('GET', `/v1/runs/${r.body.run.id}`, { key: ctx.team.key })).body.status).toBe(
        'cancelled',
      );
    } finally {
      conn.release();
      await sql.end();
    }
    expect(await ran(ctx.t, ctx.team, session)).toBe('False\n');
  });

  it('while queued behind another execution of the session: the code never runs, the run ends cancelled', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, auto);
    await exec(ctx.t, ctx.team.key, session, 'print("warm")');
    // An execution that runs until the test lets it go (a file made from outside the sandbox).
    const first = ctx.t.call('POST', `/v1/sessions/${session}/exec`, {
      key: ctx.team.key,
      body: {
        code: 'import os, time\nprint("holding", flush=True)\nwhile not os.path.exists("/tmp/go"): time.sleep(0.02)',
        timeout_s: 60,
      },
    });
    const [container] = await docker.listContainers({ filters: { label: [`kiln.session=${session}`] } });
    // One reply only: the cancelled run never asks the model again.
    ctx.fake.script({ content: `<python>${MARKER}</python>` });
    const r = await ctx.t.call('POST', `/v1/sessions/${session}/messages`, {
      key: ctx.team.key,
      body: { content: 'go' },
    });
    await eventsUntil(ctx.t, r.body.run.id, ['exec.started']);
    expect((await ctx.t.call('POST', `/v1/runs/${r.body.run.id}/cancel`, { key: ctx.team.key })).status).toBeLessThan(
      300,
    );
    const go = await docker.getContainer(container!.Id).exec({ Cmd: ['touch', '/tmp/go'], User: '10001:10001' });
    await go.start({ hijack: true, stdin: false });
    expect((await first).status).toBe(200);
    const events = await eventsUntil(ctx.t, r.body.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.cancelled');
    expect(await ran(ctx.t, ctx.team, session)).toBe('False\n');
  });
});
