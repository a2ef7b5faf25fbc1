import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'drizzle-orm';
import { createTestApp, type TestApp } from '../support/app.ts';
import { tableCounts } from '../support/counts.ts';
import { rowsOf } from '../support/db.ts';

describe('ops endpoints and documentation', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await createTestApp({ selfUpdate: true });
  });
  afterAll(() => t.close());

  it('/healthz answers without auth; /readyz checks the database and the real Docker Engine', async () => {
    expect((await t.call('GET', '/healthz')).body).toEqual({ status: 'ok' });
    const ready = await t.call('GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(ready.body).toEqual({
      status: 'ok',
      checks: { database: { ok: true }, sandboxes: { ok: true }, docker: { ok: true } },
    });
  });

  it('/openapi.json passes Redocly\u2019s recommended rules: every operation has a unique operationId, a security requirement and its 4xx answers', async () => {
    // As a server reached at that address gets it: the document names the server it was fetched from.
    const doc = await (await t.app.request('http://kiln.test:8080/openapi.json')).json();
    const ops = Object.entries(doc.paths as Record<string, Record<string, any>>).flatMap(([path, methods]) =>
      Object.entries(methods).map(([method, op]) => ({ path, method, op })),
    );
    expect(ops.length).toBeGreaterThanOrEqual(55);
    const ids = ops.map((o) => o.op.operationId);
    expect(ids.every((id) => typeof id === 'string' && /^[a-z][A-Za-z]+$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    for (const { path, op } of ops) {
      if (path === '/healthz' || path === '/readyz') {
        expect(op.security).toEqual([]);
        continue;
      }
      expect(op.security, path).toEqual([{ bearer: [] }]);
      expect(
        Object.keys(op.responses).some((s) => /^4\d\d$/.test(s)),
        path,
      ).toBe(true);
    }
    expect(doc.servers).toEqual([{ url: 'http://kiln.test:8080', description: 'this Kiln server' }]);

    const dir = mkdtempSync(join(tmpdir(), 'kiln-openapi-'));
    try {
      writeFileSync(join(dir, 'openapi.json'), JSON.stringify(doc));
      const lint = await promisify(execFile)(
        'node_modules/.bin/redocly',
        ['lint', join(dir, 'openapi.json'), '--config', 'redocly.yaml', '--format', 'json'],
        { maxBuffer: 16 * 1024 * 1024 },
      ).catch((err: { stdout: string }) => err);
      const report = JSON.parse(lint.stdout.slice(lint.stdout.indexOf('{')));
      expect(report.problems.map((p: { ruleId: string; message: string }) => `${p.ruleId}: ${p.message}`)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('/openapi.json documents every route with its security scheme; /docs serves the reference offline', async () => {
    const doc = await t.call('GET', '/openapi.json');
    expect(doc.body.openapi).toBe('3.1.0');
    for (const path of [
      '/v1/teams',
      '/v1/teams/{team}/keys',
      '/v1/workspaces',
      '/v1/workspaces/{workspace}',
      '/v1/audit',
      '/readyz',
    ]) {
      expect(Object.keys(doc.body.paths)).toContain(path);
    }
    expect(doc.body.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
    const page = await t.call('GET', '/docs');
    expect(page.body).toContain('<script src="/docs/init.js"></script>');
    expect(await (await t.app.request('/docs/init.js')).text()).toContain("url: '/openapi.json'");
    const bundle = await t.app.request('/docs/swagger-ui-bundle.js');
    expect(bundle.status).toBe(200);
    expect((await bundle.text()).length).toBeGreaterThan(100_000);
  });

  it('writes exactly one structured log line per request, carrying the request id', async () => {
    const before = t.logs.length;
    const r = await t.call('GET', '/healthz', { headers: { 'x-request-id': 'trace-123' } });
    expect(r.headers.get('x-request-id')).toBe('trace-123');
    const lines = t.logs.slice(before);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ request_id: 'trace-123', method: 'GET', path: '/healthz', status: 200 });
    expect(typeof lines[0]!.duration_ms).toBe('number');
    const bogus = await t.call('GET', '/healthz', { headers: { 'x-request-id': 'no spaces allowed' } });
    expect(bogus.headers.get('x-request-id')).toMatch(/^req_/);
  });
});

describe('idempotency', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('idem');
  });
  afterAll(() => t.close());

  it('replays the first answer for the same key and body, creating nothing new', async () => {
    const headers = { 'idempotency-key': 'create-ws-1' };
    const first = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'once' }, headers });
    expect(first.status).toBe(201);
    const before = await tableCounts(t.database.db);
    const second = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'once' }, headers });
    expect(second.status).toBe(201);
    expect(second.body).toEqual(first.body);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(await tableCounts(t.database.db)).toEqual(before);
  });

  it('stores the answer sealed: a replayed key creation returns the key, the table never holds it', async () => {
    const headers = { 'idempotency-key': 'create-key-1' };
    const body = { name: 'ci', role: 'member' };
    const first = await t.call('POST', `/v1/teams/${team.id}/keys`, { key: team.key, body, headers });
    expect(first.status).toBe(201);
    expect(first.body.key).toMatch(/^kiln_/);
    const again = await t.call('POST', `/v1/teams/${team.id}/keys`, { key: team.key, body, headers });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.body).toEqual(first.body);
    const rows = rowsOf<{ response_body: unknown }>(
      await t.database.db.execute(sql`select response_body from idempotency_keys where key = 'create-key-1'`),
    );
    expect(rows).toHaveLength(1);
    const stored = JSON.stringify(rows[0]!.response_body);
    expect(stored).not.toContain(first.body.key);
    expect(stored).not.toContain(first.body.key.slice(-16));
    // Sealed for its caller and key: copied under another key, it does not open (a 500, never the answer).
    await t.database.db.execute(
      sql`insert into idempotency_keys (scope, key, request_hash, status_code, response_body)
          select scope, 'copied', request_hash, status_code, response_body from idempotency_keys where key = 'create-key-1'`,
    );
    const copied = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: team.key,
      body,
      headers: { 'idempotency-key': 'copied' },
    });
    expect(copied.status).toBe(500);
    expect(JSON.stringify(copied.body)).not.toContain(first.body.key);
  });

  it('refuses the same key with a different body', async () => {
    const headers = { 'idempotency-key': 'create-ws-2' };
    await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'two' }, headers });
    const other = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'three' }, headers });
    expect(other.status).toBe(400);
    expect(other.body.error.message).toMatch(/different request/);
  });

  it('scopes keys to the caller: another key with the same Idempotency-Key is a new request', async () => {
    const other = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: team.key,
      body: { name: 'm', role: 'member' },
    });
    const headers = { 'idempotency-key': 'shared-key' };
    const a = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'sa' }, headers });
    const b = await t.call('POST', '/v1/workspaces', { key: other.body.key, body: { name: 'sb' }, headers });
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.body.id).not.toBe(a.body.id);
  });

  it('concurrent duplicates create one resource: the loser gets the replay or 409', async () => {
    const headers = { 'idempotency-key': 'race-1' };
    const results = await Promise.all(
      Array.from({ length: 5 }, () =>
        t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'raced' }, headers }),
      ),
    );
    const created = new Set(results.filter((r) => r.status === 201).map((r) => r.body.id));
    expect(created.size).toBe(1);
    for (const r of results) expect([201, 409]).toContain(r.status);
  });
});

describe('rate limiting', () => {
  it('answers 429 rate_limited with Retry-After past the burst, per team, and refills over time', async () => {
    let now = 1_000_000;
    const t = await createTestApp({ rateLimit: { perMinute: 60, burst: 4 }, now: () => now });
    try {
      const a = await t.team('rl-a');
      const b = await t.team('rl-b');
      // The admin key has its own bucket: setting up the teams spent its 4 tokens, not theirs.
      for (let i = 0; i < 4; i++) expect((await t.call('GET', '/v1/workspaces', { key: a.key })).status).toBe(200);
      const limited = await t.call('GET', '/v1/workspaces', { key: a.key });
      expect(limited.status).toBe(429);
      expect(limited.body.error).toMatchObject({ code: 'rate_limited', type: 'rate_limit_error' });
      expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect((await t.call('GET', '/v1/workspaces', { key: b.key })).status).toBe(200);
      now += 1_000;
      expect((await t.call('GET', '/v1/workspaces', { key: a.key })).status).toBe(200);
      expect((await t.call('GET', '/v1/workspaces', { key: a.key })).status).toBe(429);
    } finally {
      await t.close();
    }
  });
});

describe('audit', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('audited');
  });
  afterAll(() => t.close());

  it('records every state change with actor, resource and before/after', async () => {
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'a1' } })).body;
    await t.call('PATCH', `/v1/workspaces/${ws.id}`, { key: team.key, body: { settings: { max_steps: 5 } } });
    await t.call('DELETE', `/v1/workspaces/${ws.id}`, { key: team.key });
    const r = await t.call('GET', `/v1/audit?order=asc&limit=100`, { key: team.key });
    const byAction = (a: string) =>
      r.body.data.filter((e: { action: string; resource_id: string }) => e.action === a && e.resource_id === ws.id);
    const [created] = byAction('workspace.create');
    const [updated] = byAction('workspace.update');
    const [deleted] = byAction('workspace.delete');
    expect(created).toMatchObject({
      team_id: team.id,
      resource_type: 'workspace',
      before: null,
      after: { name: 'a1' },
    });
    expect(created.actor).toMatch(/^key_/);
    expect(updated.before.settings.max_steps).toBe(30);
    expect(updated.after.settings.max_steps).toBe(5);
    expect(deleted).toMatchObject({ before: { id: ws.id }, after: null });
    expect(created.request_id).toMatch(/^req_/);
  });

  it('records key creation without the secret, and filters by action and actor', async () => {
    const k = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: t.adminKey,
      body: { name: 'audited-key', role: 'member' },
    });
    const r = await t.call('GET', `/v1/audit?action=key.create&limit=100`, { key: t.adminKey });
    const event = r.body.data.find((e: { resource_id: string }) => e.resource_id === k.body.id);
    expect(event.actor_role).toBe('org_admin');
    expect(JSON.stringify(event)).not.toContain(k.body.key);
    expect(r.body.data.every((e: { action: string }) => e.action === 'key.create')).toBe(true);
    const mine = await t.call('GET', `/v1/audit?actor=${event.actor}&limit=100`, { key: t.adminKey });
    expect(mine.body.data.length).toBeGreaterThan(0);
    expect(mine.body.data.every((e: { actor: string }) => e.actor === event.actor)).toBe(true);
  });

  it('filters the audit log by resource and time range, and pages through it with the cursor', async () => {
    const made: string[] = [];
    for (let i = 0; i < 3; i++) {
      made.push((await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: `audited-${i}` } })).body.id);
    }
    const one = await t.call('GET', `/v1/audit?resource_type=workspace&resource=${made[1]}`, { key: team.key });
    expect(one.body.data.map((e: { action: string; resource_id: string }) => [e.action, e.resource_id])).toEqual([
      ['workspace.create', made[1]],
    ]);
    const at = one.body.data[0].created_at as string;
    const since = await t.call('GET', `/v1/audit?resource_type=workspace&since=${encodeURIComponent(at)}&limit=100`, {
      key: team.key,
    });
    const ids = since.body.data.map((e: { resource_id: string }) => e.resource_id);
    expect(ids).toContain(made[1]);
    expect(ids).toContain(made[2]);
    expect(ids).not.toContain(made[0]);
    const until = await t.call('GET', `/v1/audit?resource_type=workspace&until=${encodeURIComponent(at)}&limit=100`, {
      key: team.key,
    });
    expect(until.body.data.map((e: { resource_id: string }) => e.resource_id)).toContain(made[0]);
    expect(until.body.data.map((e: { resource_id: string }) => e.resource_id)).not.toContain(made[1]);

    // Two pages of one event each, newest first, then nothing more.
    const q = `resource_type=workspace&since=${encodeURIComponent(at)}&limit=1`;
    const p1 = await t.call('GET', `/v1/audit?${q}`, { key: team.key });
    expect(p1.body).toMatchObject({ has_more: true });
    const p2 = await t.call('GET', `/v1/audit?${q}&after=${p1.body.last_id}`, { key: team.key });
    expect([p1.body.data[0].resource_id, p2.body.data[0].resource_id]).toEqual([made[2], made[1]]);
    expect(p2.body.has_more).toBe(false);

    const bad = await t.call('GET', '/v1/audit?since=yesterday', { key: team.key });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('invalid_request');
  });

  it('reads and failed requests leave no audit row', async () => {
    const before = (await tableCounts(t.database.db)).audit_events;
    await t.call('GET', '/v1/workspaces', { key: team.key });
    await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: '' } });
    expect((await tableCounts(t.database.db)).audit_events).toBe(before);
  });
});
