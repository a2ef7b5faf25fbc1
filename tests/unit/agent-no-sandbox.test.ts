import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { FakeBackend } from '../support/fake-backend.ts';
import { sessionIn } from '../support/sandbox.ts';

/**
 * An agent run whose code finds no sandbox to run in (an engine that refuses to start one, or the
 * team at its cap), on the in-process backend and the scripted model (which refuses a transcript
 * with a tool call left unanswered, as a real endpoint does).
 */
const IMAGE = 'kiln-sandbox:fake';
const backend = new FakeBackend([IMAGE]);

describe('an agent run with no sandbox to run its code in', () => {
  const ctx = useAgentApp('no-sandbox', {
    driver: 'pglite',
    backend,
    sandbox: { poolSize: 0, reapIntervalMs: 3_600_000 },
    env: { KILN_SANDBOX_IMAGE: IMAGE, KILN_SANDBOX_MAX_PER_TEAM: '1' },
  });
  const settings = { approval: { mode: 'auto' }, protocol: 'tools' };
  const python = (code: string) => ({ tool_calls: [{ name: 'python', arguments: { code } }] });
  const finish = (summary: string) => ({ tool_calls: [{ name: 'finish', arguments: { summary } }] });

  it('ends failed with sandbox_unavailable and the reason (not a crash), and the session goes on', async () => {
    const { session } = await sessionIn(ctx.t, ctx.team, settings);
    backend.refuseStart = 'failed to create shim task: OCI runtime create failed';
    ctx.fake.script(python('print(1)'));
    const { run, names, events } = await converse(ctx.t, ctx.team.key, session, 'print one');
    expect(run.status).toBe('failed');
    expect(run.error).toMatchObject({ code: 'sandbox_unavailable' });
    expect(run.error.message).toMatch(/^the sandbox could not be started/);
    expect(names.at(-1)).toBe('run.failed');
    // The code's start is answered by its end, saying why it did not run.
    expect(names.filter((n) => n.startsWith('exec.'))).toEqual(['exec.started', 'exec.completed']);
    const completed = events.find((e) => e.event === 'exec.completed')!.data as { error: { message: string } };
    expect(completed).toMatchObject({ execution_id: null, error: { type: 'SandboxUnavailable' } });
    expect(completed.error.message).toMatch(/^the sandbox could not be started/);
    // The engine's words are in the server's log (once), with the run; not in the event.
    expect(completed.error.message).not.toContain('OCI');
    const logged = ctx.t.logs.filter((l) => JSON.stringify(l).includes('OCI runtime create failed'));
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatchObject({ run: run.id, level: 40 });
    // The call was answered: the next run's transcript is one the endpoint accepts.
    backend.refuseStart = null;
    ctx.fake.script(python('print(2)'), finish('Printed 2.'));
    const next = await converse(ctx.t, ctx.team.key, session, 'print two');
    expect(next.run.status).toBe('completed');
    const sent = ctx.fake.chats()[1].messages;
    const answer = sent.find((m: { role: string }) => m.role === 'tool');
    expect(answer.content).toMatch(/^Kiln System: \[Not run\] the sandbox could not be started/);
  });

  it('says so when the team is at its cap of live sandboxes', async () => {
    // The first test's session holds the team's one sandbox.
    const { session } = await sessionIn(ctx.t, ctx.team, settings);
    ctx.fake.script(python('print(3)'));
    const { run } = await converse(ctx.t, ctx.team.key, session, 'print three');
    expect(run.status).toBe('failed');
    expect(run.error).toMatchObject({ code: 'sandbox_unavailable' });
    expect(run.error.message).toMatch(/already has 1 live sandboxes/);
  });
});
