import type { AddressInfo } from 'node:net';
import { eq } from 'drizzle-orm';
import { type ServerType, serve } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunEvent } from '../../apps/api/src/agent/events.ts';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { eventsUntil, PAUSED, pendingApproval, TERMINAL } from '../support/agent.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { type FakeOpenAI, startFakeOpenAI } from '../support/fake-openai.ts';
import { callMcpTool } from '../support/mcp.ts';
import { exec, mountedHere, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);

/** Serves the app over HTTP on loopback and says so to the other replicas (as server.ts does once listening). */
async function listen(t: TestApp): Promise<ServerType> {
  const server = await new Promise<ServerType>((resolve) => {
    const s = serve({ fetch: t.app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s));
  });
  await t.replicas.open(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  return server;
}

function shut(server: ServerType): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    if ('closeAllConnections' in server) server.closeAllConnections();
  });
}

/** What a run's code printed, from its events. */
const outputOf = (events: RunEvent[]) =>
  events
    .filter((e) => e.event === 'exec.output')
    .map((e) => (e.data as { data: string }).data)
    .join('');

/** A replica's kiln_replica_forwards_total, by outcome, from its /metrics. */
async function forwards(t: TestApp): Promise<Record<string, number>> {
  const r = await t.app.request('/metrics', { headers: { authorization: `Bearer ${t.adminKey}` } });
  expect(r.status).toBe(200);
  const out: Record<string, number> = {};
  for (const m of (await r.text()).matchAll(/^kiln_replica_forwards_total\{outcome="(\w+)"\} (\d+)$/gm))
    out[m[1]!] = Number(m[2]);
  return out;
}

/** One sample of a replica's /metrics (0 when absent). */
async function metric(t: TestApp, sample: string): Promise<number> {
  const r = await t.app.request('/metrics', { headers: { authorization: `Bearer ${t.adminKey}` } });
  const line = (await r.text()).split('\n').find((l) => l.startsWith(`${sample} `));
  return line ? Number(line.slice(sample.length + 1)) : 0;
}

/** The sandbox containers of a sandbox id, whichever replica made them. */
const containersOf = (sandboxId: string) =>
  docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });

describe("two replicas behind one address: a request about a session reaches the replica holding the session's sandbox", () => {
  let fake: FakeOpenAI;
  let a: TestApp;
  let b: TestApp;
  let serverA: ServerType | undefined;
  let serverB: ServerType | undefined;

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    const model = { baseURL: fake.url, model: 'fake-model' };
    a = await createTestApp({ model });
    b = await createTestApp({ model, replicaOf: a });
    serverA = await listen(a);
    serverB = await listen(b);
    // Each knows the other from its next heartbeat: now.
    await a.replicas.beat();
    await b.replicas.beat();
  });
  afterAll(async () => {
    for (const s of [serverA, serverB]) if (s) await shut(s);
    await b?.close();
    await a?.close();
    await fake?.close();
  });

  it('executions, a streamed one, a file of the sandbox and a keepalive through either replica reach one interpreter', async () => {
    const [fromA, fromB] = [await forwards(a), await forwards(b)];
    expect(fromB).toEqual({ sent: 0, unreachable: 0, received: 0 });
    const team = await a.team('replicas');
    const { session } = await sessionIn(a, team);
    const first = await exec(
      a,
      team.key,
      session,
      "x = 41\nopen('/workspace/note.txt', 'w').write('from A')\nprint(x)",
    );
    expect(first.stdout).toBe('41\n');

    const second = await exec(b, team.key, session, 'print(x + 1)');
    expect(second).toMatchObject({ stdout: '42\n', sandbox_id: first.sandbox_id, restarted: false });
    const streamed = await b.call('POST', `/v1/sessions/${session}/exec?stream=true`, {
      key: team.key,
      body: { code: 'print(x * 2)' },
    });
    expect(streamed.status).toBe(200);
    expect(streamed.headers.get('content-type')).toContain('text/event-stream');
    expect(streamed.body).toContain('82');
    expect(streamed.body).toContain('exec.completed');
    const file = await b.call('GET', `/v1/sessions/${session}/files?path=/workspace/note.txt`, { key: team.key });
    expect(file.status).toBe(200);
    expect(file.body).toBe('from A');
    // A caller cannot pass for a replica that sent the request on (to be served where it arrives).
    for (const forged of [
      a.replicas.instance,
      `${a.replicas.instance}.AAAA`,
      b.replicas.mark.slice(0, -1) + (b.replicas.mark.endsWith('A') ? 'B' : 'A'),
    ]) {
      const r = await b.call('POST', `/v1/sessions/${session}/exec`, {
        key: team.key,
        body: { code: 'print(x)' },
        headers: { 'kiln-forwarded-by': forged },
      });
      expect(r.body).toMatchObject({ stdout: '41\n', sandbox_id: first.sandbox_id });
    }
    expect(a.replicas.marked(b.replicas.mark)).toBe(true);
    const kept = await b.call('POST', `/v1/sessions/${session}/keepalive`, { key: team.key, body: {} });
    expect(kept.status).toBe(200);
    expect(kept.body.sandbox_id).toBe(first.sandbox_id);

    // One sandbox in all, made and held by A; B made none of its own.
    const listed = await b.call('GET', '/v1/sandboxes', { key: team.key });
    expect(listed.body.data.map((s: { id: string }) => s.id)).toEqual([first.sandbox_id]);
    expect(await containersOf(first.sandbox_id)).toHaveLength(1);

    // Counted on both sides: B sent on the seven requests about the session (the three with a
    // forged mark too), A served them.
    expect(await forwards(b)).toEqual({ ...fromB, sent: fromB.sent! + 7 });
    expect(await forwards(a)).toEqual({ ...fromA, received: fromA.received! + 7 });
  });

  it("MCP's run_python with a session, called through the other replica, runs in that session's interpreter", async () => {
    const team = await a.team('replicas-mcp');
    const { session, ws: workspace } = await sessionIn(a, team);
    await exec(a, team.key, session, 'z = 20');
    const r = await callMcpTool(b.app, team.key, 'run_python', { workspace, session, code: 'print(z + 1)' });
    expect(r.status).toBe(200);
    const text = await r.text();
    // Answered as JSON or as one SSE event, whichever the transport chose.
    const body = JSON.parse(text.startsWith('{') ? text : /^data: (.*)$/m.exec(text)![1]!);
    expect(body.result.isError, JSON.stringify(body)).toBeFalsy();
    expect(body.result.structuredContent).toMatchObject({ session_id: session, stdout: '21\n', restarted: false });
    expect((await exec(a, team.key, session, 'print(z)')).stdout).toBe('20\n');
  });

  it("a message posted through the other replica starts its run where the sandbox is: the agent's code sees the session's variables", async () => {
    const team = await a.team('replicas-run');
    const { session } = await sessionIn(a, team, { approval: { mode: 'auto' } });
    const set = await exec(a, team.key, session, 'z = 7');
    fake.script({ content: '<python>print(z * 6)</python>' }, { content: '<finish>done</finish>' });
    const posted = await b.call('POST', `/v1/sessions/${session}/messages`, {
      key: team.key,
      body: { content: 'what is z times six?' },
    });
    expect(posted.status).toBe(202);
    const events = await eventsUntil(b, posted.body.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(outputOf(events)).toBe('42\n');
    const listed = await b.call('GET', '/v1/sandboxes', { key: team.key });
    expect(listed.body.data.map((s: { id: string }) => s.id)).toEqual([set.sandbox_id]);
    expect(fake.refusals).toEqual([]);
  });

  it('an approval decided through the other replica resumes the run where the sandbox is', async () => {
    const team = await a.team('replicas-approval');
    // The default policy asks before code runs.
    const { session } = await sessionIn(a, team);
    await exec(a, team.key, session, 'z = 5');
    fake.script({ content: '<python>print(z + 1)</python>' }, { content: '<finish>done</finish>' });
    const posted = await a.call('POST', `/v1/sessions/${session}/messages`, {
      key: team.key,
      body: { content: 'z + 1?' },
    });
    expect(posted.status).toBe(202);
    await eventsUntil(a, posted.body.run.id, PAUSED);
    const pending = await pendingApproval(a, team.key, session);
    expect(pending).toMatchObject({ status: 'pending', code: 'print(z + 1)' });
    const decided = await b.call('POST', `/v1/approvals/${pending.id}`, {
      key: team.key,
      body: { decision: 'approve' },
    });
    expect(decided.body).toMatchObject({ status: 'approved' });
    const events = await eventsUntil(b, posted.body.run.id, TERMINAL);
    expect(events.at(-1)!.event).toBe('run.completed');
    expect(outputOf(events)).toBe('6\n');
    expect(fake.refusals).toEqual([]);
  });

  it('a holder out of reach: the session gets a new sandbox where the request arrived, says so, and the holder lets the old one go', async () => {
    const team = await a.team('holder-gone');
    const { session } = await sessionIn(a, team);
    const first = await exec(a, team.key, session, 'y = 1');
    const before = await forwards(b);
    // A no longer answers on its address, though its last heartbeat is still fresh.
    await shut(serverA!);
    serverA = undefined;
    const next = await exec(b, team.key, session, "print('y' in dir())");
    expect(next).toMatchObject({ stdout: 'False\n', restarted: true });
    expect(next.sandbox_id).not.toBe(first.sandbox_id);
    expect(await forwards(b)).toEqual({ ...before, unreachable: before.unreachable! + 1 });
    const rows = await b.call('GET', '/v1/sandboxes', { key: team.key });
    expect(rows.body.data.map((s: { id: string }) => s.id)).toEqual([next.sandbox_id]);
    // A's reaper sees its sandbox given up and removes it.
    await a.engine.reap();
    expect(await containersOf(first.sandbox_id)).toEqual([]);
    expect(await containersOf(next.sandbox_id)).toHaveLength(1);
  });

  it('a holder that died (no longer heard) with a sandbox no other replica can speak to: the session gets a new one that says so, and the old container goes', async () => {
    const team = await a.team('holder-died');
    const { session } = await sessionIn(a, team, { sandbox: { runtime: 'runc' } });
    const first = await exec(a, team.key, session, 'y = 1');
    const [row] = await a.database.db.select().from(sandboxes).where(eq(sandboxes.id, first.sandbox_id));
    // Its workspace mount on this host (the default here), which goes with it.
    const mount = (row!.runner as { mount?: string } | null)?.mount;
    expect(mount && mountedHere(mount)).toBe(true);
    // A stops saying it is up, as a replica that died does; B reads who is.
    await a.replicas.close();
    await b.replicas.beat();
    expect(b.replicas.gone(a.replicas.instance)).toBe(true);
    // Its sandbox is runc: its runner was the exec A held, which no other replica can reach.
    const next = await exec(b, team.key, session, "print('y' in dir())");
    expect(await metric(b, 'kiln_sandbox_takeovers_total{outcome="lost"}')).toBe(1);
    expect(next).toMatchObject({ stdout: 'False\n', restarted: true });
    expect(next.sandbox_id).not.toBe(first.sandbox_id);
    expect(await containersOf(first.sandbox_id)).toEqual([]);
    expect(mountedHere(mount!)).toBe(false);
    const rows = await b.call('GET', '/v1/sandboxes', { key: team.key });
    expect(rows.body.data.map((s: { id: string }) => s.id)).toEqual([next.sandbox_id]);
  });
});
