import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestApp, type TestApp } from '../support/app.ts';
import { tableCounts } from '../support/counts.ts';

/** Every route answers malformed or out-of-range input with 400 and the envelope, and writes nothing. */
describe('bad input', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  let ws: string;
  let keyId: string;

  beforeAll(async () => {
    t = await createTestApp({ bodyLimitBytes: 64 * 1024 });
    team = await t.team('input');
    ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'w' } })).body.id;
    keyId = (await t.call('GET', `/v1/teams/${team.id}/keys`, { key: team.key })).body.data[0].id;
  });
  afterAll(() => t.close());

  const cases = (): [string, string, string, { body?: unknown; raw?: string; headers?: Record<string, string> }][] => [
    ['admin', 'POST', '/v1/teams', { body: {} }],
    ['admin', 'POST', '/v1/teams', { body: { name: '' } }],
    ['admin', 'POST', '/v1/teams', { body: { name: 'x'.repeat(101) } }],
    ['admin', 'POST', '/v1/teams', { body: { name: 'ok', extra: 1 } }],
    ['admin', 'POST', '/v1/teams', { raw: '{"name":', headers: { 'content-type': 'application/json' } }],
    ['admin', 'POST', '/v1/teams', { raw: 'name=x', headers: { 'content-type': 'application/json' } }],
    ['admin', 'GET', '/v1/teams?limit=0', {}],
    ['admin', 'GET', '/v1/teams?limit=101', {}],
    ['admin', 'GET', '/v1/teams?order=sideways', {}],
    ['admin', 'GET', '/v1/teams/not-an-id', {}],
    ['team', 'POST', '/v1/teams/{team}/keys', { body: { name: 'k', role: 'god' } }],
    ['team', 'POST', '/v1/teams/{team}/keys', { body: { name: 'k', role: 'member', can_approve: 'yes' } }],
    ['team', 'GET', '/v1/teams/{team}/keys?limit=-1', {}],
    ['team', 'DELETE', '/v1/teams/{team}/keys/KEY!', {}],
    ['team', 'POST', '/v1/workspaces', { body: { name: 'n', settings: { sandbox: { memory_mb: 10 } } } }],
    ['team', 'POST', '/v1/workspaces', { body: { name: 'n', settings: { approval: { mode: 'sometimes' } } } }],
    ['team', 'POST', '/v1/workspaces', { body: { name: 'n', settings: { evolution: { dream_cron: 'nightly' } } } }],
    ['team', 'POST', '/v1/workspaces', { body: { name: 'n', settings: { unknown: true } } }],
    ['team', 'POST', '/v1/workspaces', { body: [] }],
    ['team', 'GET', '/v1/workspaces?limit=abc', {}],
    ['team', 'PATCH', '/v1/workspaces/{ws}', { body: { settings: { max_steps: 0 } } }],
    ['team', 'PATCH', '/v1/workspaces/{ws}', { body: { settings: { context: { max_tokens: 'many' } } } }],
    ['team', 'PATCH', '/v1/workspaces/{ws}', { body: { name: 42 } }],
    ['team', 'PATCH', '/v1/workspaces/{ws}', { raw: 'not json', headers: { 'content-type': 'application/json' } }],
    ['team', 'DELETE', '/v1/workspaces/bad id', {}],
    ['team', 'GET', '/v1/audit?limit=1000', {}],
    ['team', 'POST', '/v1/workspaces/{ws}/dream', { body: { days: 0 } }],
    ['team', 'POST', '/v1/workspaces/{ws}/dream', { body: { days: 31 } }],
    ['team', 'POST', '/v1/workspaces/{ws}/dream', { body: { days: 'two' } }],
    ['team', 'POST', '/v1/workspaces/{ws}/dream', { body: { days: 1, now: true } }],
    ['team', 'POST', '/v1/workspaces/{ws}/review', { body: { session_id: 'not an id' } }],
    [
      'team',
      'POST',
      '/v1/workspaces/{ws}/review',
      { raw: '{"session_id"', headers: { 'content-type': 'application/json' } },
    ],
    ['team', 'GET', '/v1/workspaces/{ws}/evolutions?kind=self_update', {}],
    ['team', 'POST', '/v1/workspaces/{ws}/evolutions/evo!/undo', {}],
    ['team', 'POST', '/v1/workspaces', { body: { name: 'n' }, headers: { 'idempotency-key': 'x'.repeat(300) } }],
  ];

  it('answers 400 with the envelope and writes nothing, for every case', async () => {
    const before = await tableCounts(t.database.db);
    for (const [who, method, template, opts] of cases()) {
      const path = template.replace('{team}', team.id).replace('{ws}', ws).replace('{key}', keyId);
      const r = await t.call(method, path, { key: who === 'admin' ? t.adminKey : team.key, ...opts });
      const label = `${method} ${path} ${JSON.stringify(opts.body ?? opts.raw)}`;
      expect(r.status, label).toBe(400);
      expect(r.body.error, label).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
      expect(r.body.error.message.length, label).toBeGreaterThan(5);
      expect(r.body.error.request_id, label).toBe(r.headers.get('x-request-id'));
    }
    const after = await tableCounts(t.database.db);
    // api_keys.last_used_at may move; no row count may.
    expect(after).toEqual(before);
    expect((await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body.settings.max_steps).toBe(30);
  });

  it('names the offending field in the message and in details', async () => {
    const r = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: team.key,
      body: { settings: { sandbox: { memory_mb: 10, pids: 'x' } } },
    });
    expect(r.status).toBe(400);
    expect(r.body.error.message).toContain('body.settings.sandbox.memory_mb');
    expect(r.body.error.details.map((d: { path: string }) => d.path)).toEqual(
      expect.arrayContaining(['body.settings.sandbox.memory_mb', 'body.settings.sandbox.pids']),
    );
  });

  it('refuses an oversized body with 413 and the envelope, writing nothing', async () => {
    const before = await tableCounts(t.database.db);
    const r = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'big', pad: 'x'.repeat(70 * 1024) },
    });
    expect(r.status).toBe(413);
    expect(r.body.error.code).toBe('payload_too_large');
    expect(await tableCounts(t.database.db)).toEqual(before);
  });

  it('inside a workspace, checks the input first, then the key, then the workspace', async () => {
    const created = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: team.key,
      body: { name: 'v', role: 'viewer' },
    });
    const viewer = created.body.key as string;
    const other = await t.team('input-other');
    const cases: [string, string, unknown, number, string][] = [
      [team.key, '/v1/workspaces/bad!/dream', { days: 1 }, 400, 'param.workspace: not a valid id'],
      [team.key, '/v1/workspaces/research/dream', { days: 1 }, 400, 'a workspace id looks like ws_…'],
      [team.key, '/v1/workspaces/ws_missing/dream', { days: 0 }, 400, 'body.days'],
      [team.key, '/v1/workspaces/ws_missing/dream', { days: 1 }, 404, 'workspace not found'],
      [other.key, `/v1/workspaces/${ws}/dream`, { days: 1 }, 404, 'workspace not found'],
      [viewer, `/v1/workspaces/${ws}/dream`, { days: 0 }, 400, 'body.days'],
      [viewer, `/v1/workspaces/${ws}/dream`, { days: 1 }, 403, 'viewer keys are read-only'],
      [t.adminKey, `/v1/workspaces/${ws}/dream`, { days: 1 }, 403, 'use a team key'],
    ];
    for (const [key, path, body, status, message] of cases) {
      const r = await t.call('POST', path, { key, body });
      expect(r.status, `${path} ${JSON.stringify(body)}`).toBe(status);
      expect(r.body.error.message).toContain(message);
    }
  });

  it('answers unknown routes with a 404 envelope, authenticated or not', async () => {
    for (const [method, path] of [
      ['GET', '/nope'],
      ['POST', '/v1/nothing-here'],
      ['PUT', '/v1/workspaces'],
    ] as const) {
      const r = await t.call(method, path, { key: team.key });
      expect(r.status, path).toBe(404);
      expect(r.body.error.code).toBe('not_found');
    }
  });
});
