import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import { pg_trgm } from '@electric-sql/pglite/contrib/pg_trgm';
import { vector } from '@electric-sql/pglite-pgvector';
import { asc, sql, type SQL } from 'drizzle-orm';
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite';
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator';
import { drizzle as drizzlePostgres } from 'drizzle-orm/postgres-js';
import { migrate as migratePostgres } from 'drizzle-orm/postgres-js/migrator';
import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../apps/api/src/db/client.ts';
import { evolutions, platformUpdates } from '../../apps/api/src/db/schema/index.ts';
import { createPgDatabase, dropPgDatabase, DRIVERS, type Driver } from '../support/db.ts';

const MIGRATIONS = fileURLToPath(new URL('../../apps/api/drizzle', import.meta.url));

/**
 * A database as a server of the previous version left it (the migrations up to 0007), filled by
 * `fill`, then opened by this version (0008 runs).
 */
type Fill = (run: (q: SQL) => Promise<unknown>) => Promise<void>;

async function upgrade(driver: Driver, dir: string, fill: Fill): Promise<Database & { drop(): Promise<void> }> {
  const old = join(dir, 'migrations');
  cpSync(MIGRATIONS, old, { recursive: true });
  const journal = JSON.parse(readFileSync(join(old, 'meta/_journal.json'), 'utf8')) as { entries: { idx: number }[] };
  journal.entries = journal.entries.filter((e) => e.idx <= 7);
  writeFileSync(join(old, 'meta/_journal.json'), JSON.stringify(journal));
  if (driver === 'pglite') {
    const pg = await PGlite.create(join(dir, 'pglite'), { extensions: { pg_trgm, vector } });
    const db = drizzlePglite(pg);
    await migratePglite(db, { migrationsFolder: old });
    await fill((q) => db.execute(q));
    await pg.close();
    const database = await openDatabase({ dataDir: dir });
    return { ...database, drop: () => database.close() };
  }
  const url = await createPgDatabase();
  const client = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const db = drizzlePostgres(client);
    await migratePostgres(db, { migrationsFolder: old });
    await fill((q) => db.execute(q));
  } finally {
    await client.end();
  }
  const database = await openDatabase({ url });
  return { ...database, drop: () => database.close().then(() => dropPgDatabase(url)) };
}

const applied = {
  id: 'evo_applied',
  status: 'applied' as const,
  commitSha: 'a'.repeat(40),
  changedPaths: ['README.md', 'apps/api/src/app.ts'],
  reason: 'Say hello\n\nin the README',
  checks: [
    { name: 'typecheck', ok: true, duration_ms: 1200, log: 'tsc: fine' },
    { name: 'restart', ok: true, duration_ms: 800, log: 'relay: ready' },
  ],
  error: null,
  createdAt: new Date('2026-03-04T05:06:07.123Z'),
  finishedAt: new Date('2026-03-04T05:09:00.456Z'),
};
const failed = {
  id: 'evo_failed',
  status: 'failed' as const,
  commitSha: 'b'.repeat(40),
  changedPaths: ['package.json'],
  reason: 'Bump a dependency',
  checks: [{ name: 'install', ok: false, duration_ms: 3000, log: 'npm ci: no' }],
  error: 'self-check failed at install',
  createdAt: new Date('2026-03-05T00:00:00.000Z'),
  finishedAt: new Date('2026-03-05T00:01:00.000Z'),
};
const checking = {
  id: 'evo_checking',
  status: 'checking' as const,
  commitSha: 'c'.repeat(40),
  changedPaths: [],
  reason: 'Still being checked',
  checks: [],
  error: null,
  createdAt: new Date('2026-03-06T00:00:00.000Z'),
  finishedAt: null,
};

describe.each(DRIVERS)('upgrading a database that keeps platform self-updates in evolutions (0008, %s)', (driver) => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-upgrade-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('moves each self_update row to platform_updates with its id and values; reviews stay', async () => {
    const database = await upgrade(driver, dir, async (run) => {
      for (const u of [applied, failed, checking]) {
        const [paths, checks] = [JSON.stringify(u.changedPaths), JSON.stringify(u.checks)];
        const [created, finished] = [u.createdAt.toISOString(), u.finishedAt?.toISOString() ?? null];
        await run(sql`insert into evolutions
          (id, kind, status, commit_sha, changed_paths, summary, checks, error, created_at, finished_at)
          values (${u.id}, 'self_update', ${u.status}, ${u.commitSha}, ${paths}::jsonb, ${u.reason},
            ${checks}::jsonb, ${u.error}, ${created}::timestamptz, ${finished}::timestamptz)`);
      }
      await run(sql`insert into teams (id, name) values ('team_old', 'old')`);
      await run(sql`insert into evolutions (id, team_id, workspace_id, kind, status, summary, created_at)
        values ('evo_review', 'team_old', 'ws_old', 'review', 'no_change', 'nothing to keep', '2026-03-01T00:00:00Z')`);
    });
    try {
      const moved = await database.db.select().from(platformUpdates).orderBy(asc(platformUpdates.id));
      expect(moved).toEqual([applied, checking, failed]);
      const left = await database.db
        .select({ id: evolutions.id, kind: evolutions.kind, summary: evolutions.summary })
        .from(evolutions);
      expect(left).toEqual([{ id: 'evo_review', kind: 'review', summary: 'nothing to keep' }]);
    } finally {
      await database.drop();
    }
  });
});
