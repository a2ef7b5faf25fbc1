import { readdirSync } from 'node:fs';
import { eq, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../../apps/api/src/db/client.ts';
import { isUniqueViolation } from '../../apps/api/src/db/errors.ts';
import * as schema from '../../apps/api/src/db/schema/index.ts';
import { createWorkspace, deleteWorkspace, getWorkspace } from '../../apps/api/src/workspace/records.ts';
import { createTeam } from '../../apps/api/src/auth/teams.ts';
import {
  createPgDatabase,
  createTestDatabase,
  dropPgDatabase,
  DRIVERS,
  rowsOf,
  type TestDatabase,
} from '../support/db.ts';

const TABLES = [
  'teams',
  'api_replicas',
  'api_keys',
  'workspaces',
  'workspace_secrets',
  'templates',
  'sessions',
  'messages',
  'runs',
  'run_events',
  'approvals',
  'sandboxes',
  'executions',
  'commits',
  'evolutions',
  'platform_updates',
  'webhooks',
  'webhook_deliveries',
  'jobs',
  'memory_chunks',
  'memory_index',
  'memory_terms',
  'audit_events',
  'usage',
  'idempotency_keys',
  'sandbox_nodes',
];

describe.each(DRIVERS)('database layer on %s', (driver) => {
  let t: TestDatabase;
  beforeAll(async () => {
    t = await createTestDatabase(driver);
  });
  afterAll(() => t.drop());

  it('applies the migrations: every platform table exists', async () => {
    const rows = await t.db.execute<{ table_name: string }>(
      sql`select table_name from information_schema.tables where table_schema = 'public'`,
    );
    const names = rowsOf<{ table_name: string }>(rows).map((r) => r.table_name);
    expect(names.sort()).toEqual([...TABLES].sort());
  });

  it('scopes workspaces by team: another team cannot read one by id', async () => {
    const a = await createTeam(t.db, `a-${driver}`);
    const b = await createTeam(t.db, `b-${driver}`);
    const ws = await createWorkspace(t.db, a.id, { name: 'shared-name' });
    await expect(getWorkspace(t.db, b.id, ws.id)).rejects.toMatchObject({ code: 'not_found' });
    expect((await getWorkspace(t.db, a.id, ws.id)).name).toBe('shared-name');
    // Names are unique per team, not globally.
    await expect(createWorkspace(t.db, b.id, { name: 'shared-name' })).resolves.toMatchObject({ teamId: b.id });
  });

  it('keeps live workspace names unique per team, and frees the name on delete', async () => {
    const team = await createTeam(t.db, `c-${driver}`);
    const first = await createWorkspace(t.db, team.id, { name: 'dup' });
    await expect(createWorkspace(t.db, team.id, { name: 'dup' })).rejects.toMatchObject({ code: 'conflict' });
    await deleteWorkspace(t.db, team.id, first.id);
    const second = await createWorkspace(t.db, team.id, { name: 'dup' });
    expect(second.id).not.toBe(first.id);
  });

  it('rejects a duplicate run event sequence number (the stream resume relies on it)', async () => {
    const team = await createTeam(t.db, `d-${driver}`);
    const ws = await createWorkspace(t.db, team.id, { name: 'events' });
    await t.db.insert(schema.sessions).values({ id: 'ses_1', teamId: team.id, workspaceId: ws.id });
    await t.db.insert(schema.runs).values({ id: 'run_1', teamId: team.id, workspaceId: ws.id, sessionId: 'ses_1' });
    await t.db.insert(schema.runEvents).values({ runId: 'run_1', seq: 1, event: 'run.created', data: {} });
    const dup = await t.db
      .insert(schema.runEvents)
      .values({ runId: 'run_1', seq: 1, event: 'run.created', data: {} })
      .catch((e) => e);
    expect(isUniqueViolation(dup)).toBe(true);
  });

  it('deleting a team removes everything it owns', async () => {
    const team = await createTeam(t.db, `e-${driver}`);
    const ws = await createWorkspace(t.db, team.id, { name: 'gone' });
    await t.db.delete(schema.teams).where(eq(schema.teams.id, team.id));
    expect(await t.db.select().from(schema.workspaces).where(eq(schema.workspaces.id, ws.id))).toEqual([]);
  });
});

describe('migrations', () => {
  it('re-opening a migrated Postgres database applies nothing twice', async () => {
    const t = await createTestDatabase('postgres');
    try {
      const again = await openDatabase({ url: t.url });
      const applied = await again.db.execute<{ n: number }>(
        sql`select count(*)::int as n from drizzle.__drizzle_migrations`,
      );
      await again.close();
      const count = rowsOf<{ n: number }>(applied)[0]!.n;
      expect(count).toBeGreaterThan(0);
      const migrationFiles = readdirSync(new URL('../../apps/api/drizzle', import.meta.url)).filter((f) =>
        f.endsWith('.sql'),
      );
      expect(count).toBe(migrationFiles.length);
    } finally {
      await t.drop();
    }
  });

  it('two Postgres replicas starting at once both come up on one schema', async () => {
    const url = await createPgDatabase();
    try {
      const [a, b] = await Promise.all([openDatabase({ url }), openDatabase({ url })]);
      await a.db.insert(schema.teams).values({ id: 'team_x', name: 'x' });
      expect(await b.db.select().from(schema.teams)).toHaveLength(1);
      await Promise.all([a.close(), b.close()]);
    } finally {
      await dropPgDatabase(url);
    }
  });
});
