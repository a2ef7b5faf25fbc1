import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { eventsUntil, TERMINAL } from '../support/agent.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
/** Code that leaves a marker: if the marker is there, the cancelled code ran. */
const MARKER = 'open("/tmp/cancelled-code-ran", "w").write("x")\nprint("ran")';
const ran = (t: TestApp, team: { key: string }, session: string) => exec(t, team.key, session, 'import os; print(os.path.exists("/tmp/cancelled-code-ran"))').then((r) => r.stdout);

/**
 * A cancel that lands before the code reaches the runner (while the sandbox is claimed and
 * synced, or while the execution waits behind another) is never lost: the code does not run
 * and the run ends cancelled. The model-call and running stages are in agent-loop.test.ts.
 */
describe('a cancel at each stage of an execution', () => {
  let fake: FakeOpenAI;
  let t: TestApp;
  let team: { id: string; key: string };
  const auto = { approval: { mode: 'auto' } };

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    t = await createTestApp({ model: { baseURL: fake.url, model: 'fake-model' } });
    team = await t.team('cancel-stages');
  });
  afterAll(async () => {
    await t.close();
    await fake.close();
  });

  it('while the session\u2019s sandbox is being claimed: the code never runs, the run ends cancelled', async () => {
    const { session } = await sessionIn(t, team, auto);
    // One reply only: the cancelled run never asks the model again.
    fake.script({ content: `<python>${MARKER}</python>` });
    // The claim writes the sandbox's row first: holding the table makes it wait, deterministically.
    const sql = postgres(t.database.url!, { max: 2 });
    const locked = sql.reserve();
    const conn = await locked;
    await conn`begin`;
    await conn`lock table sandboxes in exclusive mode`;
    try {
      const r = await t.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'go' } });
      await eventsUntil(t, r.body.run.id, ['exec.started']);
      // The claim is waiting for the lock (a state, not a guess about timing).
      for (;;) {
        const [w] = await sql`select count(*)::int as n from pg_locks l join pg_class c on c.oid = l.relation where c.relname = 'sandboxes' and not l.granted`;
        if (w!.n > 0) break;
      }
      expect((await t.call("POST", `/v1/runs/${r.body.run.id}/cancel`, { key: team.key })).status).toBeLessThan(300);
      await conn`commit`;
      const events = await eventsUntil(t, r.body.run.id, TERMINAL);
      expect(events.at(-1)!.event).toBe('run.cancelled');
      const completed = events.find((e) => e.event === 'exec.completed')?.data as { error: { type: string } } | undefined;
      if (completed) expect(completed.error.type).toBe('Cancelled');
      expect((await t.call('GET', `/v1/runs/${r.body.run.id}`, { key: team.key })).body.status).toBe('cancelled');
    } finally {
      conn.release();
      await sql.end();
    }
    expect(await ran(t, team, session)).toBe('False\n');
  });

  it('while queued behind another execution of the session: the code never runs, the run ends cancelled', async () => {
    const { session } = await sessionIn(t, team, auto);
    await exec(t, team.key, session, 'print("warm")');
    // An execution that runs until the test lets it go (a file made from outside the sandbox).
    const first = t.call('POST', `/v1/sessions/${session}/exec`, {
      key: team.key,
      body: { code: 'import os, time\nprint("holding", flush=True)\nwhile not os.path.exists("/tmp/go"): time.sleep(0.02)', timeout_s: 60 },
    });
    const [container] = await docker.listContainers({ filters: { label: [`kiln.session=${session}`] } });
    // One reply only: the cancelled run never asks the model again.
    fake.script({ content: `<python>${MARKER}</python>` });
    const r = await t.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'go' } });
    await eventsUntil(t, r.body.run.id, ['exec.started']);
    expect((await t.call("POST", `/v1/runs/${r.body.run.id}/cancel`, { key: team.key })).status).toBeLessThan(300);
    const go = await docker.getContainer(container!.Id).exec({ Cmd: ['touch', '/tmp/go'], User: '10001:10001' });
    await go.start({ hijack: true, stdin: false });
    expect((await first).status).toBe(200);
    const events = await eventsUntil(t, r.body.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.cancelled');
    expect(await ran(t, team, session)).toBe('False\n');
  });
});
