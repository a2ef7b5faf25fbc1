import type { RunEvent, RunEventLog } from '../../apps/api/src/agent/events.ts';
import type { TestApp } from './app.ts';

/** Resolves with every event of the run up to (and including) the first one named in `until`. */
export async function eventsUntil(t: { events: RunEventLog }, runId: string, until: string[]): Promise<RunEvent[]> {
  const seen: RunEvent[] = [];
  const abort = new AbortController();
  return new Promise((resolve, reject) => {
    t.events
      .follow(
        runId,
        0,
        (ev) => {
          seen.push(ev);
          if (until.includes(ev.event)) {
            abort.abort();
            resolve(seen);
          }
        },
        abort.signal,
      )
      .catch(reject);
  });
}

export const TERMINAL = ['run.completed', 'run.failed', 'run.cancelled'];
/** Where a run stops for now: its end, or a pause for an approval. */
export const PAUSED = [...TERMINAL, 'run.requires_action'];

/** The session's pending approval, as the API lists it. */
export async function pendingApproval(t: TestApp, key: string, session: string) {
  const list = await t.call('GET', '/v1/approvals?status=pending', { key });
  return list.body.data.find((a: { session_id: string }) => a.session_id === session);
}

/** Posts a message and waits for the run to end (or pause, with `until`). */
export async function converse(t: TestApp, key: string, session: string, content: string, until = TERMINAL) {
  const r = await t.call('POST', `/v1/sessions/${session}/messages`, { key, body: { content } });
  if (r.status !== 202) throw new Error(`message ${r.status}: ${JSON.stringify(r.body)}`);
  const events = await eventsUntil(t, r.body.run.id, until);
  const run = (await t.call('GET', `/v1/runs/${r.body.run.id}`, { key })).body;
  return { run, events, names: events.map((e) => e.event) };
}
