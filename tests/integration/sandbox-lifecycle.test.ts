import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { executions, sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);

async function containerOf(sandboxId: string) {
  const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  return c;
}

/**
 * Moves the app's clock past a limit in two steps: 30 s on, the reaper keeps the sandbox; 61 s
 * on, it removes its container and records `reason`.
 */
async function reapedAfter(t: TestApp, advance: (ms: number) => void, sandboxId: string, reason: string) {
  advance(30_000);
  await t.engine.reap();
  expect(await containerOf(sandboxId)).toBeDefined();
  advance(31_000);
  await t.engine.reap();
  expect(await containerOf(sandboxId)).toBeUndefined();
  const [row] = await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, sandboxId));
  expect(row).toMatchObject({ state: 'removed', removedReason: reason });
}

describe('sandbox lifecycle', () => {
  let now = Date.now();
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    // The pool without fair share: warm containers for any team (with it, tests/integration/sandbox-fair-share.test.ts).
    t = await createTestApp({
      sandbox: { poolSize: 2, idleMs: 60_000, perTeamMax: 20, now: () => now },
      env: { KILN_SANDBOX_FAIR_SHARE: 'off' },
    });
    team = await t.team('lifecycle');
  });
  afterAll(() => t.close());

  it('keeps a warm pool, and a new session takes its sandbox from it', async () => {
    await t.engine.poolSettled();
    expect(t.engine.poolReady).toBe(2);
    const warm = await docker.listContainers({ filters: { label: ['kiln.managed=1', 'kiln.session='] } });
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'print("warm")');
    expect(r.stdout).toBe('warm\n');
    const warmIds = warm.map((c) => c.Labels['kiln.sandbox']);
    expect(warmIds).toContain(r.sandbox_id);
    await t.engine.poolSettled();
    expect(t.engine.poolReady).toBe(2);
  });

  it('a workspace whose disk shape differs from the pool gets a cold container with its own limits', async () => {
    // Memory enough for /tmp, /workspace and home at 100 + 100 + 16 MB to fit inside it with the runner's reserve.
    const { session } = await sessionIn(t, team, { sandbox: { disk_mb: 100, memory_mb: 400 } });
    const r = await exec(t, team.key, session, 'print("cold")');
    const info = await docker.getContainer((await containerOf(r.sandbox_id))!.Id).inspect();
    expect(info.HostConfig.Tmpfs!['/tmp']).toContain('size=100m');
    expect(info.HostConfig.Memory).toBe(400 * 1024 * 1024);
  });

  it('a warm container claimed by a workspace with other memory/CPU/pids limits is updated to them', async () => {
    await t.engine.poolSettled();
    const { session } = await sessionIn(t, team, { sandbox: { memory_mb: 200, cpus: 0.5, pids: 100 } });
    const r = await exec(t, team.key, session, 'print(1)');
    const info = await docker.getContainer((await containerOf(r.sandbox_id))!.Id).inspect();
    expect(info.HostConfig.Memory).toBe(200 * 1024 * 1024);
    expect(info.HostConfig.NanoCpus).toBe(0.5e9);
    expect(info.HostConfig.PidsLimit).toBe(100);
  });

  it('records every execution and audits it', async () => {
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'print("audited")');
    const [row] = await t.database.db.select().from(executions).where(eq(executions.id, r.execution_id));
    expect(row).toMatchObject({
      sessionId: session,
      sandboxId: r.sandbox_id,
      exitCode: 0,
      truncated: false,
      stdoutBytes: 8,
    });
    expect(row!.codeHash).toMatch(/^[0-9a-f]{64}$/);
    const audit = await t.call('GET', '/v1/audit?action=session.exec&limit=100', { key: team.key });
    const event = audit.body.data.find(
      (e: { after: { execution_id: string } }) => e.after.execution_id === r.execution_id,
    );
    expect(event).toMatchObject({ resource_id: session, after: { exit_code: 0, sandbox_id: r.sandbox_id } });
  });

  it('GET /v1/sandboxes shows the team\u2019s sandboxes with memory and CPU use', async () => {
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'import numpy\nbig = numpy.ones(20_000_000)');
    const mineNow = async () =>
      (await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data.find(
        (s: { id: string }) => s.id === r.sandbox_id,
      );
    // Known from the sandbox's first moment: a new sandbox's listing has both figures at once.
    const mine = await mineNow();
    expect(mine).toMatchObject({ session_id: session, state: 'idle', runtime: 'runc', image: expect.any(String) });
    expect(mine.memory_bytes).toBeGreaterThan(0);
    expect(typeof mine.cpu_percent).toBe('number');
    // The figures are Docker's stream of readings, one a second: the array shows within a few.
    await expect
      .poll(async () => (await mineNow()).memory_bytes, { timeout: 10_000 })
      .toBeGreaterThan(100 * 1024 * 1024);
    const other = await t.team('lifecycle-other');
    const theirs = await t.call('GET', '/v1/sandboxes', { key: other.key });
    expect(theirs.body.data).toEqual([]);
    expect((await t.call('DELETE', `/v1/sandboxes/${r.sandbox_id}`, { key: other.key })).status).toBe(404);
  });

  it('DELETE /v1/sandboxes/{sandbox} removes it; the session\u2019s next exec gets a fresh one and says its state is gone', async () => {
    const { session } = await sessionIn(t, team);
    const first = await exec(t, team.key, session, 'v = 1');
    const del = await t.call('DELETE', `/v1/sandboxes/${first.sandbox_id}`, { key: team.key });
    expect(del.status).toBe(200);
    expect(await containerOf(first.sandbox_id)).toBeUndefined();
    const [row] = await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, first.sandbox_id));
    expect(row).toMatchObject({ state: 'removed', removedReason: 'deleted' });
    const next = await exec(t, team.key, session, '"v" in dir()');
    expect(next.sandbox_id).not.toBe(first.sandbox_id);
    expect(next.stdout).toBe('False\n');
    expect(next.restarted).toBe(true);
  });

  it('ending a session removes its container and marks its row removed', async () => {
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'print(1)');
    expect(await containerOf(r.sandbox_id)).toBeDefined();
    const end = await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
    expect(end.body.status).toBe('ended');
    expect(await containerOf(r.sandbox_id)).toBeUndefined();
    const [row] = await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, r.sandbox_id));
    expect(row!.state).toBe('removed');
    const after = await t.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(after.status).toBe(409);
  });

  it('a reap that overlaps the pool refill never removes a container that joined the pool meanwhile', async () => {
    await t.engine.poolSettled();
    const { session } = await sessionIn(t, team);
    await exec(t, team.key, session, 'print(1)'); // takes a warm container: the pool refills
    let settled = false;
    const refill = t.engine.poolSettled().then(() => (settled = true));
    // Reap over and over while the replacement is being started, then once more after.
    while (!settled) await t.engine.reap();
    await refill;
    await t.engine.reap();
    expect(t.engine.poolReady).toBe(2);
    // Both pooled containers are really there: two new sessions run on them.
    for (const _ of [1, 2]) {
      const next = await sessionIn(t, team);
      expect((await exec(t, team.key, next.session, 'print("pooled")')).stdout).toBe('pooled\n');
    }
  });

  it('reclaims sandboxes idle longer than the idle timeout', async () => {
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'kept = 1');
    await reapedAfter(t, (ms) => (now += ms), r.sandbox_id, 'idle');
    const next = await exec(t, team.key, session, '"kept" in dir()');
    expect(next).toMatchObject({ stdout: 'False\n', restarted: true });
  });
});

describe('hard lifetime', () => {
  it('removes a container past its hard lifetime even while it is in use', async () => {
    // Its own clock and a short lifetime: only containers of this engine can be that close to
    // expiry, so the test never touches containers of test files running alongside.
    let now = Date.now();
    const t = await createTestApp({ sandbox: { maxLifetimeMs: 60_000, now: () => now } });
    try {
      const team = await t.team('lifetime');
      const { session } = await sessionIn(t, team);
      const r = await exec(t, team.key, session, 'print(1)');
      await reapedAfter(t, (ms) => (now += ms), r.sandbox_id, 'expired');
    } finally {
      await t.close();
    }
  });
});

describe('concurrency and caps', () => {
  it('runs 16 sessions executing at once without errors', async () => {
    const t = await createTestApp({ sandbox: { perTeamMax: 16 } });
    try {
      const team = await t.team('sixteen');
      const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'many' } })).body.id;
      const sessions = await Promise.all(
        Array.from(
          { length: 16 },
          async () =>
            (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id as string,
        ),
      );
      const results = await Promise.all(
        sessions.map((s, i) => exec(t, team.key, s, `n = ${i}\nsum(range(100_000)) + n`)),
      );
      for (const [i, r] of results.entries()) expect(r.stdout).toBe(`${4999950000 + i}\n`);
      expect(new Set(results.map((r) => r.sandbox_id)).size).toBe(16);
      const again = await Promise.all(sessions.map((s) => exec(t, team.key, s, 'n')));
      for (const [i, r] of again.entries()) expect(r.stdout).toBe(`${i}\n`);
    } finally {
      await t.close();
    }
  });

  it('answers 429 sandbox_unavailable beyond the team\u2019s cap, and frees a slot when a session ends', async () => {
    const t = await createTestApp({ sandbox: { perTeamMax: 2 } });
    try {
      const team = await t.team('capped');
      const a = await sessionIn(t, team);
      const b = await sessionIn(t, team);
      const c = await sessionIn(t, team);
      await exec(t, team.key, a.session, 'print(1)');
      await exec(t, team.key, b.session, 'print(1)');
      const over = await t.call('POST', `/v1/sessions/${c.session}/exec`, {
        key: team.key,
        body: { code: 'print(1)' },
      });
      expect(over.status).toBe(429);
      expect(over.body.error.code).toBe('sandbox_unavailable');
      expect(over.headers.get('retry-after')).toBeTruthy();
      const rows = await t.database.db
        .select()
        .from(sandboxes)
        .where(and(eq(sandboxes.teamId, team.id)));
      expect(rows.filter((r) => r.state !== 'removed')).toHaveLength(2);
      // Another team is not affected by this team's cap.
      const other = await t.team('uncapped');
      const o = await sessionIn(t, other);
      expect((await exec(t, other.key, o.session, 'print(2)')).stdout).toBe('2\n');
      await t.call('DELETE', `/v1/sessions/${a.session}`, { key: team.key });
      expect((await exec(t, team.key, c.session, 'print(3)')).stdout).toBe('3\n');
    } finally {
      await t.close();
    }
  });

  it('another team\u2019s session is 404 on every session route', async () => {
    const t = await createTestApp();
    try {
      const a = await t.team('owner-team');
      const b = await t.team('intruder');
      const { ws, session } = await sessionIn(t, a);
      const routes: [string, string, unknown?][] = [
        ['GET', `/v1/sessions/${session}`],
        ['DELETE', `/v1/sessions/${session}`],
        ['POST', `/v1/sessions/${session}/exec`, { code: 'print(1)' }],
        ['GET', `/v1/sessions/${session}/files?path=/tmp/x`],
        ['PUT', `/v1/sessions/${session}/files?path=/tmp/x`],
        ['POST', `/v1/workspaces/${ws}/sessions`, {}],
        ['GET', `/v1/workspaces/${ws}/sessions`],
      ];
      for (const [method, path, body] of routes) {
        const r = await t.call(method, path, { key: b.key, body });
        expect(r.status, `${method} ${path}`).toBe(404);
      }
      expect((await t.call('GET', `/v1/sessions/${session}`, { key: a.key })).body.status).toBe('active');
    } finally {
      await t.close();
    }
  });
});
