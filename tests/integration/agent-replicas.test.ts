import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestApp, type TestApp } from '../support/app.ts';
import { eventsUntil } from '../support/agent.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { sessionIn } from '../support/sandbox.ts';

/** Two API replicas on one Postgres database and one workspaces directory. */
describe('agent runs across replicas', () => {
  let fake: FakeOpenAI;
  let a: TestApp;
  let b: TestApp;
  let team: { id: string; key: string };

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    a = await createTestApp({ model: { baseURL: fake.url, model: 'fake-model' } });
    b = await createTestApp({ model: { baseURL: fake.url, model: 'fake-model' }, replicaOf: a });
    team = await a.team('replicas');
  });
  afterAll(async () => {
    await b.close();
    await a.close();
    await fake.close();
  });

  it('a cancel sent to the other replica stops the run where it runs: the model call is abandoned, one run.cancelled', async () => {
    const { session } = await sessionIn(a, team, { approval: { mode: 'auto' } });
    fake.script({ hang: true });
    const asked = fake.chats().length;
    const posted = await a.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'think forever' } });
    expect(posted.status).toBe(202);
    const runId = posted.body.run.id as string;
    await fake.chatRequests(asked + 1);

    const cancelled = await b.call('POST', `/v1/runs/${runId}/cancel`, { key: team.key });
    expect(cancelled.status).toBe(200);
    expect(cancelled.body.status).toBe('cancelled');
    // Replica A, which runs it, let go of the model call and recorded the end itself.
    await fake.hangsClosed(1);
    const events = await eventsUntil(a, runId, ['run.cancelled']);
    expect(events.filter((e) => ['run.completed', 'run.failed', 'run.cancelled'].includes(e.event))).toHaveLength(1);

    // The session is free again, on either replica.
    fake.script({ content: '<finish>ok</finish>' });
    const next = await b.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'again' } });
    expect(next.status).toBe(202);
    await eventsUntil(b, next.body.run.id, ['run.completed']);
  });

  it('a run ended elsewhere while its model call was out: its own end adds no second terminal event, and the call still counts', async () => {
    const { session } = await sessionIn(a, team, { approval: { mode: 'auto' } });
    let answer!: () => void;
    fake.script({ content: '<finish>too late</finish>', until: new Promise<void>((r) => (answer = r)) });
    const asked = fake.chats().length;
    const posted = await a.call('POST', `/v1/sessions/${session}/messages`, { key: team.key, body: { content: 'slow' } });
    const runId = posted.body.run.id as string;
    await fake.chatRequests(asked + 1);

    // A third replica starting up marks runs in flight as interrupted (it cannot tell whose they are).
    const c = await createTestApp({ model: { baseURL: fake.url, model: 'fake-model' }, replicaOf: a });
    try {
      const failed = await eventsUntil(c, runId, ['run.failed']);
      expect(failed.at(-1)!.data).toMatchObject({ status: 'failed', error: { code: 'interrupted' } });
      // Replica A's loop gets its answer and ends the run as it sees it: the guard finds it ended.
      answer();
      await expect.poll(async () => (await a.call('GET', `/v1/runs/${runId}`, { key: team.key })).body.usage.prompt_tokens).toBe(100);
      const run = (await a.call('GET', `/v1/runs/${runId}`, { key: team.key })).body;
      expect(run).toMatchObject({ status: 'failed', error: { code: 'interrupted' } });
      const all = (await a.agent.events.list(runId)).map((e) => e.event);
      expect(all.filter((e) => ['run.completed', 'run.failed', 'run.cancelled'].includes(e))).toEqual(['run.failed']);
      // Its final message was still stored: nothing the run said is lost.
      const transcript = await a.call('GET', `/v1/sessions/${session}/messages`, { key: team.key });
      expect(transcript.body.data.at(-1)).toMatchObject({ role: 'assistant', content: 'too late' });
    } finally {
      await c.close();
    }
  });
});
