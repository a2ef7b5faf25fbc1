import { count } from 'drizzle-orm';
import { beforeAll, describe, expect, it } from 'vitest';
import { apiKeys, evolutions } from '../../apps/api/src/db/schema/index.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';

/**
 * Auth and tenancy through the real HTTP stack: unknown keys, roles, and above all that
 * another team's resource is always 404 — for every resource route that exists.
 */
describe('auth and tenancy', () => {
  // Team alpha is the fixture's (ctx.team), b is team beta.
  const ctx = useAgentApp('alpha');
  let runA: string;
  let b: { id: string; key: string };
  let wsA: string;
  let keyA: string;

  beforeAll(async () => {
    b = await ctx.t.team('beta');
    const ws = await ctx.t.call('POST', '/v1/workspaces', { key: ctx.team.key, body: { name: 'alpha-ws' } });
    wsA = ws.body.id;
    const k = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: ctx.team.key,
      body: { name: 'second', role: 'member' },
    });
    keyA = k.body.id;
    const s = await ctx.t.call('POST', `/v1/workspaces/${wsA}/sessions`, { key: ctx.team.key, body: {} });
    ctx.fake.script({ content: '<finish>hello</finish>' });
    runA = (await converse(ctx.t, ctx.team.key, s.body.id, 'hi')).run.id;
  });

  it('refuses requests without a key, with a malformed header, or with an unknown key', async () => {
    for (const headers of [{}, { authorization: 'Basic abc' }, { authorization: 'Bearer kiln_nope' }] as Record<
      string,
      string
    >[]) {
      const r = await ctx.t.call('GET', '/v1/workspaces', { headers });
      expect(r.status).toBe(401);
      expect(r.body.error).toMatchObject({ type: 'authentication_error', code: 'unauthorized' });
      expect(r.body.error.request_id).toBe(r.headers.get('x-request-id'));
    }
  });

  it('stores keys hashed: no secret appears in the database', async () => {
    const rows = await ctx.t.database.db.select().from(apiKeys);
    const dump = JSON.stringify(rows);
    for (const secret of [ctx.t.adminKey, ctx.team.key, b.key]) expect(dump).not.toContain(secret);
    expect(rows.every((r) => /^[0-9a-f]{64}$/.test(r.keyHash))).toBe(true);
  });

  it('never logs a key, even a wrong one', async () => {
    await ctx.t.call('GET', '/v1/workspaces', { key: 'kiln_wrong_but_secret_value' });
    const log = ctx.t.logText();
    for (const secret of [ctx.t.adminKey, ctx.team.key, b.key, 'kiln_wrong_but_secret_value'])
      expect(log).not.toContain(secret);
  });

  it('a revoked key stops working at once', async () => {
    const k = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: ctx.t.adminKey,
      body: { name: 'temp', role: 'member' },
    });
    expect((await ctx.t.call('GET', '/v1/workspaces', { key: k.body.key })).status).toBe(200);
    const del = await ctx.t.call('DELETE', `/v1/teams/${ctx.team.id}/keys/${k.body.id}`, { key: ctx.team.key });
    expect(del.status).toBe(200);
    expect(del.body.revoked_at).not.toBeNull();
    expect((await ctx.t.call('GET', '/v1/workspaces', { key: k.body.key })).status).toBe(401);
  });

  it('team keys cannot create teams; org-admin keys must use a team key for team resources', async () => {
    const r = await ctx.t.call('POST', '/v1/teams', { key: ctx.team.key, body: { name: 'sneaky' } });
    expect(r.status).toBe(403);
    expect(r.body.error.code).toBe('forbidden');
    const w = await ctx.t.call('GET', '/v1/workspaces', { key: ctx.t.adminKey });
    expect(w.status).toBe(403);
    expect(w.body.error.message).toMatch(/team key/);
  });

  it('viewer keys read but never write; members cannot manage keys', async () => {
    const viewer = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: ctx.team.key,
      body: { name: 'v', role: 'viewer' },
    });
    const member = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: ctx.team.key,
      body: { name: 'm', role: 'member' },
    });
    expect((await ctx.t.call('GET', `/v1/workspaces/${wsA}`, { key: viewer.body.key })).status).toBe(200);
    for (const [method, path, body] of [
      ['POST', '/v1/workspaces', { name: 'x' }],
      ['PATCH', `/v1/workspaces/${wsA}`, { name: 'y' }],
      ['DELETE', `/v1/workspaces/${wsA}`, undefined],
    ] as const) {
      const r = await ctx.t.call(method, path, { key: viewer.body.key, body });
      expect(r.status, `${method} ${path}`).toBe(403);
    }
    const r = await ctx.t.call('POST', `/v1/teams/${ctx.team.id}/keys`, {
      key: member.body.key,
      body: { name: 'x', role: 'owner' },
    });
    expect(r.status).toBe(403);
  });

  it('lists only the caller\u2019s own team', async () => {
    const r = await ctx.t.call('GET', '/v1/teams', { key: b.key });
    expect(r.body.data.map((x: { id: string }) => x.id)).toEqual([b.id]);
    const all = await ctx.t.call('GET', '/v1/teams', { key: ctx.t.adminKey });
    expect(all.body.data.map((x: { id: string }) => x.id)).toEqual(expect.arrayContaining([ctx.team.id, b.id]));
  });

  it('answers 404, never 403, for every resource route on another team\u2019s resource, and changes nothing', async () => {
    const keysBefore = await ctx.t.database.db.select({ n: count() }).from(apiKeys);
    const evo = (await ctx.t.call('POST', `/v1/workspaces/${wsA}/dream`, { key: ctx.team.key, body: {} })).body
      .id as string;
    const evolutionsBefore = await ctx.t.database.db.select({ n: count() }).from(evolutions);
    const routes: [string, string, unknown?][] = [
      ['GET', `/v1/teams/${ctx.team.id}`],
      ['GET', `/v1/teams/${ctx.team.id}/keys`],
      ['POST', `/v1/teams/${ctx.team.id}/keys`, { name: 'steal', role: 'owner' }],
      ['DELETE', `/v1/teams/${ctx.team.id}/keys/${keyA}`],
      ['GET', `/v1/workspaces/${wsA}`],
      ['PATCH', `/v1/workspaces/${wsA}`, { name: 'hijacked' }],
      ['POST', `/v1/workspaces/${wsA}/review`, {}],
      ['POST', `/v1/workspaces/${wsA}/dream`, {}],
      ['GET', `/v1/workspaces/${wsA}/evolutions`],
      ['GET', `/v1/workspaces/${wsA}/evolutions/${evo}`],
      ['POST', `/v1/workspaces/${wsA}/evolutions/${evo}/undo`],
      ['GET', `/v1/runs/${runA}`],
      ['GET', `/v1/runs/${runA}/events`],
      ['POST', `/v1/runs/${runA}/cancel`],
      ['DELETE', `/v1/workspaces/${wsA}`],
    ];
    for (const [method, path, body] of routes) {
      const r = await ctx.t.call(method, path, { key: b.key, body });
      expect(r.status, `${method} ${path}`).toBe(404);
      expect(r.body.error.code).toBe('not_found');
    }
    const ws = await ctx.t.call('GET', `/v1/workspaces/${wsA}`, { key: ctx.team.key });
    expect(ws.body.name).toBe('alpha-ws');
    expect(await ctx.t.database.db.select({ n: count() }).from(apiKeys)).toEqual(keysBefore);
    expect(await ctx.t.database.db.select({ n: count() }).from(evolutions)).toEqual(evolutionsBefore);
    const listed = await ctx.t.call('GET', '/v1/workspaces', { key: b.key });
    expect(listed.body.data.map((w: { id: string }) => w.id)).not.toContain(wsA);
    const audit = await ctx.t.call('GET', '/v1/audit', { key: b.key, headers: {} });
    expect(audit.body.data.every((e: { team_id: string }) => e.team_id === b.id)).toBe(true);
  });

  it('lists runs of the caller\u2019s team only, filtered by status, workspace and session', async () => {
    const own = await ctx.t.call('GET', '/v1/runs', { key: ctx.team.key });
    expect(own.status).toBe(200);
    expect(own.body).toMatchObject({ has_more: false, last_id: runA });
    expect(own.body.data).toEqual([expect.objectContaining({ id: runA, workspace_id: wsA, status: 'completed' })]);
    for (const q of ['', `?workspace=${wsA}`, `?session=${own.body.data[0].session_id}`, '?status=completed']) {
      const other = await ctx.t.call('GET', `/v1/runs${q}`, { key: b.key });
      expect(other.status, q).toBe(200);
      expect(other.body, q).toEqual({ data: [], has_more: false, last_id: null });
    }
    expect(
      (await ctx.t.call('GET', '/v1/runs?status=completed,failed', { key: ctx.team.key })).body.data.map(
        (r: { id: string }) => r.id,
      ),
    ).toEqual([runA]);
    expect(
      (await ctx.t.call('GET', '/v1/runs?status=queued,in_progress,requires_action', { key: ctx.team.key })).body.data,
    ).toEqual([]);
    expect((await ctx.t.call('GET', '/v1/runs?workspace=ws_other', { key: ctx.team.key })).body.data).toEqual([]);
    const admin = await ctx.t.call('GET', '/v1/runs', { key: ctx.t.adminKey });
    expect(admin.status).toBe(403);
    expect(admin.body.error.code).toBe('forbidden');
  });

  it('rejects a malformed runs query with the 400 envelope', async () => {
    for (const q of ['?status=done', '?status=completed,', '?limit=0', '?limit=101', '?order=up']) {
      const r = await ctx.t.call('GET', `/v1/runs${q}`, { key: ctx.team.key });
      expect(r.status, q).toBe(400);
      expect(r.body.error, q).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
      expect(r.body.error.request_id).toBe(r.headers.get('x-request-id'));
    }
  });
});
