import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const SERVER_IDLE_MS = 600_000;
const MAX_IDLE_S = 3600;
const LIFETIME_MS = 7200_000;

/** Is the sandbox's container still there? */
async function running(sandboxId: string): Promise<boolean> {
  const found = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  return found.length > 0;
}

const iso = (ms: number) => new Date(ms).toISOString();

describe('per-workspace sandbox idle time and keepalive', () => {
  let now = Date.now();
  let t: TestApp;
  let team: { id: string; key: string };
  const advance = (ms: number) => (now += ms);
  const reclaimAtOf = async (sandboxId: string) => {
    const list = await t.call('GET', '/v1/sandboxes', { key: team.key });
    return list.body.data.find((s: { id: string }) => s.id === sandboxId)?.reclaim_at as string | undefined;
  };
  const removedReason = async (sandboxId: string) => {
    const [row] = await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, sandboxId));
    return row!.state === 'removed' ? row!.removedReason : null;
  };

  beforeAll(async () => {
    t = await createTestApp({
      sandbox: {
        poolSize: 0,
        idleMs: SERVER_IDLE_MS,
        maxIdleMs: MAX_IDLE_S * 1000,
        maxLifetimeMs: LIFETIME_MS,
        perTeamMax: 20,
        now: () => now,
      },
    });
    team = await t.team('idle');
  });
  afterAll(() => t.close());

  it('reclaims a sandbox after its workspace\u2019s idle_s while another workspace\u2019s survives the same reap', async () => {
    const short = await sessionIn(t, team, { sandbox: { idle_s: 60 } });
    const dflt = await sessionIn(t, team);
    const a = await exec(t, team.key, short.session, 'x = 1');
    const b = await exec(t, team.key, dflt.session, 'y = 1');
    const start = now;
    expect(await reclaimAtOf(a.sandbox_id)).toBe(iso(start + 60_000));
    expect(await reclaimAtOf(b.sandbox_id)).toBe(iso(start + SERVER_IDLE_MS));
    advance(60_000);
    await t.engine.reap();
    expect(await running(a.sandbox_id)).toBe(true);
    advance(1_000);
    await t.engine.reap();
    expect(await running(a.sandbox_id)).toBe(false);
    expect(await removedReason(a.sandbox_id)).toBe('idle');
    expect(await running(b.sandbox_id)).toBe(true);
    expect(await removedReason(b.sandbox_id)).toBeNull();
    expect((await exec(t, team.key, dflt.session, 'print(y)')).stdout).toBe('1\n');
  });

  it('keepalive moves reclaim_at forward, and the sandbox survives a reap that would have reclaimed it', async () => {
    const { session } = await sessionIn(t, team, { sandbox: { idle_s: 60 } });
    const r = await exec(t, team.key, session, 'z = 41');
    advance(50_000);
    const kept = await t.call('POST', `/v1/sessions/${session}/keepalive`, { key: team.key });
    expect(kept.status).toBe(200);
    expect(kept.body).toEqual({
      session_id: session,
      sandbox_id: r.sandbox_id,
      idle_s: 60,
      reclaim_at: iso(now + 60_000),
    });
    expect(await reclaimAtOf(r.sandbox_id)).toBe(kept.body.reclaim_at);
    advance(20_000); // 70 s after the execution, 20 s after the keepalive
    await t.engine.reap();
    expect(await running(r.sandbox_id)).toBe(true);
    expect((await exec(t, team.key, session, 'print(z + 1)')).stdout).toBe('42\n');

    const audit = await t.call('GET', '/v1/audit?action=session.keepalive&limit=100', { key: team.key });
    expect(audit.body.data.find((e: { resource_id: string }) => e.resource_id === session)).toMatchObject({
      resource_type: 'session',
      after: { sandbox_id: r.sandbox_id, reclaim_at: kept.body.reclaim_at },
    });
  });

  it('keepalive without a running sandbox answers the same shape with nulls', async () => {
    const { session } = await sessionIn(t, team);
    const kept = await t.call('POST', `/v1/sessions/${session}/keepalive`, { key: team.key, body: {} });
    expect(kept.status).toBe(200);
    expect(kept.body).toEqual({ session_id: session, sandbox_id: null, idle_s: 600, reclaim_at: null });
  });

  it('keepalive is refused across teams, to viewers, with a body it does not know and on an ended session', async () => {
    const { session } = await sessionIn(t, team);
    const other = await t.team('idle-other');
    const viewer = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: t.adminKey,
      body: { name: 'viewer', role: 'viewer' },
    });
    const path = `/v1/sessions/${session}/keepalive`;
    const foreign = await t.call('POST', path, { key: other.key });
    expect(foreign.status).toBe(404);
    expect(foreign.body.error.code).toBe('not_found');
    expect((await t.call('POST', path, { key: viewer.body.key })).status).toBe(403);
    const bad = await t.call('POST', path, { key: team.key, body: { idle_s: 5 } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
    expect((await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    expect((await t.call('POST', path, { key: team.key })).status).toBe(409);
  });

  it('refuses an idle_s that is too small, over the server maximum or not a whole number', async () => {
    for (const idle_s of [59, MAX_IDLE_S + 1, 'abc', 90.5]) {
      const res = await t.call('POST', '/v1/workspaces', {
        key: team.key,
        body: { name: `bad-idle-${String(idle_s)}`, settings: { sandbox: { idle_s } } },
      });
      expect(res.status, String(idle_s)).toBe(400);
      expect(res.body.error.code).toBe('invalid_request');
      expect(res.body.error.message).toContain('settings.sandbox.idle_s');
    }
    const { ws } = await sessionIn(t, team);
    const over = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: team.key,
      body: { settings: { sandbox: { idle_s: MAX_IDLE_S + 1 } } },
    });
    expect(over.status).toBe(400);
    expect(over.body.error.message).toContain('KILN_SANDBOX_MAX_IDLE_S');
    const ok = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: team.key,
      body: { settings: { sandbox: { idle_s: MAX_IDLE_S } } },
    });
    expect(ok.status).toBe(200);
    expect(ok.body.settings.sandbox.idle_s).toBe(MAX_IDLE_S);
    const back = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: team.key,
      body: { settings: { sandbox: { idle_s: null } } },
    });
    expect(back.body.settings.sandbox.idle_s).toBeNull();
  });

  it('a changed idle_s applies at once to a sandbox already running', async () => {
    const lower = await sessionIn(t, team);
    const raise = await sessionIn(t, team, { sandbox: { idle_s: 60 } });
    const a = await exec(t, team.key, lower.session, 'pass');
    const b = await exec(t, team.key, raise.session, 'pass');
    const used = now;
    const patch = (ws: string, idle_s: number) =>
      t.call('PATCH', `/v1/workspaces/${ws}`, { key: team.key, body: { settings: { sandbox: { idle_s } } } });
    expect((await patch(lower.ws, 120)).status).toBe(200);
    expect((await patch(raise.ws, 900)).status).toBe(200);
    expect(await reclaimAtOf(a.sandbox_id)).toBe(iso(used + 120_000));
    expect(await reclaimAtOf(b.sandbox_id)).toBe(iso(used + 900_000));
    advance(121_000);
    await t.engine.reap();
    expect(await removedReason(a.sandbox_id)).toBe('idle');
    expect(await running(a.sandbox_id)).toBe(false);
    expect(await running(b.sandbox_id)).toBe(true);
  });

  it('reclaim_at is the hard lifetime when that comes before the idle deadline', async () => {
    const created = now;
    const { session } = await sessionIn(t, team, { sandbox: { idle_s: MAX_IDLE_S } });
    const r = await exec(t, team.key, session, 'pass');
    advance(LIFETIME_MS - 1000_000);
    const kept = await t.call('POST', `/v1/sessions/${session}/keepalive`, { key: team.key });
    expect(kept.body.reclaim_at).toBe(iso(created + LIFETIME_MS));
    expect(await reclaimAtOf(r.sandbox_id)).toBe(iso(created + LIFETIME_MS));
  });
});
