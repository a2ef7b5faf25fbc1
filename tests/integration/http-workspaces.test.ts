import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_SETTINGS } from '../../apps/api/src/workspace/settings.ts';
import { createTestApp, type TestApp } from '../support/app.ts';

describe('workspaces CRUD', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('ws-team');
  });
  afterAll(() => t.close());

  it('creates with defaults filled in, and with a partial settings override', async () => {
    const plain = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'plain' } });
    expect(plain.status).toBe(201);
    expect(plain.body).toMatchObject({ name: 'plain', settings: DEFAULT_SETTINGS });
    expect(plain.body.head).toMatch(/^[0-9a-f]{40}$/);
    expect(plain.body.id).toMatch(/^ws_/);
    const tuned = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: {
        name: 'tuned',
        settings: { protocol: 'tools', sandbox: { memory_mb: 2048 }, evolution: { timezone: 'Asia/Shanghai' } },
      },
    });
    expect(tuned.status).toBe(201);
    expect(tuned.body.settings.protocol).toBe('tools');
    expect(tuned.body.settings.sandbox).toEqual({ ...DEFAULT_SETTINGS.sandbox, memory_mb: 2048 });
    expect(tuned.body.settings.evolution.timezone).toBe('Asia/Shanghai');
  });

  it('rejects a duplicate name with 409 conflict', async () => {
    await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'twice' } });
    const again = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'twice' } });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe('conflict');
  });

  it('patches settings field by field and renames', async () => {
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'patchme' } })).body;
    const r = await t.call('PATCH', `/v1/workspaces/${ws.id}`, {
      key: team.key,
      body: { name: 'patched', settings: { approval: { mode: 'auto' }, context: { max_turns: 12 } } },
    });
    expect(r.status).toBe(200);
    expect(r.body.name).toBe('patched');
    expect(r.body.settings.approval).toEqual({ ...DEFAULT_SETTINGS.approval, mode: 'auto' });
    expect(r.body.settings.context).toEqual({ max_tokens: DEFAULT_SETTINGS.context.max_tokens, max_turns: 12 });
    const got = await t.call('GET', `/v1/workspaces/${ws.id}`, { key: team.key });
    expect(got.body).toEqual(r.body);
    const clash = await t.call('PATCH', `/v1/workspaces/${ws.id}`, { key: team.key, body: { name: 'twice' } });
    expect(clash.status).toBe(409);
  });

  it('rejects an approval rule RE2 cannot compile with a 400 naming the rule, and keeps the stored settings', async () => {
    const bad = {
      approval: {
        rules: [
          { match: 'print', behavior: 'allow' },
          { match: '(?=.*rm)', behavior: 'deny' },
        ],
      },
    };
    const created = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'lookahead', settings: bad },
    });
    expect(created.status).toBe(400);
    expect(created.body.error.code).toBe('invalid_request');
    expect(created.body.error.message).toContain('approval.rules.1.match');
    expect(created.body.error.message).toContain('"(?=.*rm)"');
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'lookahead-later' } })).body;
    const patched = await t.call('PATCH', `/v1/workspaces/${ws.id}`, { key: team.key, body: { settings: bad } });
    expect(patched.status).toBe(400);
    expect(patched.body.error.message).toContain('"(?=.*rm)"');
    expect((await t.call('GET', `/v1/workspaces/${ws.id}`, { key: team.key })).body.settings.approval).toEqual(
      DEFAULT_SETTINGS.approval,
    );
  });

  it('deletes: gone from get and list, and its name is free again', async () => {
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'doomed' } })).body;
    const del = await t.call('DELETE', `/v1/workspaces/${ws.id}`, { key: team.key });
    expect(del.status).toBe(200);
    expect((await t.call('GET', `/v1/workspaces/${ws.id}`, { key: team.key })).status).toBe(404);
    expect((await t.call('DELETE', `/v1/workspaces/${ws.id}`, { key: team.key })).status).toBe(404);
    const list = await t.call('GET', '/v1/workspaces?limit=100', { key: team.key });
    expect(list.body.data.map((w: { id: string }) => w.id)).not.toContain(ws.id);
    expect((await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'doomed' } })).status).toBe(201);
  });

  it('pages through lists with limit/after/order without gaps or repeats', async () => {
    const other = await t.team('pager');
    const ids: string[] = [];
    for (let i = 0; i < 7; i++)
      ids.push((await t.call('POST', '/v1/workspaces', { key: other.key, body: { name: `p${i}` } })).body.id);
    const seen: string[] = [];
    let after: string | null = null;
    for (;;) {
      const q: string = `/v1/workspaces?limit=3&order=asc${after ? `&after=${after}` : ''}`;
      const page: { body: { data: { id: string }[]; has_more: boolean; last_id: string | null } } = await t.call(
        'GET',
        q,
        { key: other.key },
      );
      seen.push(...page.body.data.map((w) => w.id));
      if (!page.body.has_more) break;
      after = page.body.last_id;
    }
    expect(seen).toEqual(ids);
    const desc = await t.call('GET', '/v1/workspaces?limit=100', { key: other.key });
    expect(desc.body.data.map((w: { id: string }) => w.id)).toEqual([...ids].reverse());
    expect(desc.body.has_more).toBe(false);
  });
});
