import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestApp, type TestApp } from '../support/app.ts';

/**
 * The smoke suite: seconds, not minutes. The platform self-check runs it in the patched
 * worktree (`vitest run tests/smoke`) before it boots the patched server; it is part of
 * `npm test` too. The whole app in-process on an embedded database, without a container
 * runtime (no Docker needed): routes, auth, validation.
 */
describe('smoke', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await createTestApp({ driver: 'pglite', sandbox: false });
  });
  afterAll(() => t?.close());

  it('answers health, readiness and the OpenAPI document', async () => {
    expect((await t.call('GET', '/healthz')).body).toEqual({ status: 'ok' });
    // Ready needs the database and a container runtime; this app has only the first, and says so.
    const ready = await t.call('GET', '/readyz');
    expect(ready.status).toBe(503);
    expect(ready.body.checks.database).toEqual({ ok: true });
    expect(ready.body.checks.sandboxes).toEqual({
      ok: false,
      error: expect.stringContaining('without a container runtime'),
    });
    // The name it had before sandboxes could run on nodes, kept for probes that read it.
    expect(ready.body.checks.docker).toEqual(ready.body.checks.sandboxes);
    const doc = await t.call('GET', '/openapi.json');
    expect(Object.keys(doc.body.paths)).toEqual(
      expect.arrayContaining(['/v1/teams', '/v1/workspaces', '/v1/sessions/{session}/messages']),
    );
  });

  it('authenticates, validates and serves a team, a workspace and a session', async () => {
    const anon = await t.call('GET', '/v1/workspaces');
    expect(anon.status).toBe(401);
    expect(anon.body.error).toMatchObject({ code: 'unauthorized', request_id: expect.any(String) });
    expect((await t.call('POST', '/v1/teams', { key: t.adminKey, body: { name: '' } })).status).toBe(400);
    const team = await t.team('smoke');
    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'w' } });
    expect(ws.status).toBe(201);
    const files = await t.call('GET', `/v1/workspaces/${ws.body.id}/files?path=`, { key: team.key });
    expect(files.status).toBe(200);
    const ses = await t.call('POST', `/v1/workspaces/${ws.body.id}/sessions`, { key: team.key, body: {} });
    expect(ses.status).toBe(201);
    // Running code needs a sandbox: a clear 503 in the error envelope, and nothing left behind.
    const run = await t.call('POST', `/v1/sessions/${ses.body.id}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(run.status).toBe(503);
    expect(run.body.error).toMatchObject({
      code: 'unavailable',
      message: expect.stringContaining('sandboxes are off'),
    });
    expect((await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data).toEqual([]);
  });
});
