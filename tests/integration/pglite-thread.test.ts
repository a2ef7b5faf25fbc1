import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eq, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../apps/api/src/db/client.ts';
import { isUniqueViolation } from '../../apps/api/src/db/errors.ts';
import { PgliteThread } from '../../apps/api/src/db/pglite-thread.ts';
import * as schema from '../../apps/api/src/db/schema/index.ts';
import { createTeam } from '../../apps/api/src/auth/teams.ts';
import { rowsOf } from '../support/db.ts';
import { ticksDuring } from '../support/ticks.ts';

/** The embedded database runs in a worker thread; these pin down what that must not change. */
describe('PGlite in its own thread', () => {
  let dir: string;
  let d: Database;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kiln-pglite-'));
    d = await openDatabase({ dataDir: dir });
  });
  afterAll(async () => {
    await d.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('keeps the event loop running while a statement executes', async () => {
    // A statement long enough to span many turns of the loop if the loop were free.
    const { value: rows, ticks: during } = await ticksDuring(async () =>
      rowsOf<{ n: string }>(await d.db.execute(sql`select count(*)::text as n from generate_series(1, 3000000)`)),
    );
    expect(rows[0]!.n).toBe('3000000');
    // In-thread, PGlite would have held the loop for the whole statement: no tick in between.
    expect(during).toBeGreaterThan(10);
  });

  it('commits a transaction, and rolls one back entirely when it throws', async () => {
    const team = await createTeam(d.db, 'tx-team');
    await d.db.transaction(async (tx) => {
      await tx.update(schema.teams).set({ name: 'renamed' }).where(eq(schema.teams.id, team.id));
    });
    expect((await d.db.select().from(schema.teams).where(eq(schema.teams.id, team.id)))[0]!.name).toBe('renamed');

    const boom = new Error('boom');
    await expect(
      d.db.transaction(async (tx) => {
        await tx.update(schema.teams).set({ name: 'lost' }).where(eq(schema.teams.id, team.id));
        throw boom;
      }),
    ).rejects.toBe(boom);
    expect((await d.db.select().from(schema.teams).where(eq(schema.teams.id, team.id)))[0]!.name).toBe('renamed');
  });

  it('holds statements from outside a transaction until it ends (one connection, no interleaving)', async () => {
    const team = await createTeam(d.db, 'tx-order');
    let outsideDone = false;
    let outside!: Promise<string>;
    await d.db.transaction(async (t) => {
      await t.update(schema.teams).set({ name: 'inside' }).where(eq(schema.teams.id, team.id));
      // Sent to the database thread before the transaction's next statement: without exclusion it
      // would run first (the thread handles messages in order) and see, or join, this transaction.
      outside = d.db
        .select()
        .from(schema.teams)
        .where(eq(schema.teams.id, team.id))
        .then((rows) => {
          outsideDone = true;
          return rows[0]!.name;
        });
      await t.execute(sql`select 1`);
      expect(outsideDone).toBe(false);
    });
    expect(await outside).toBe('inside');
  });

  it('carries Postgres error fields across the thread (unique violations are recognised)', async () => {
    const team = await createTeam(d.db, 'dup-team');
    const err = await d.db
      .insert(schema.teams)
      .values({ id: `${team.id}-2`, name: 'dup-team' })
      .catch((e) => e);
    expect(isUniqueViolation(err)).toBe(true);
    const raw = await d.db.execute(sql`select * from no_such_table`).catch((e) => e);
    let e = raw as { code?: string; cause?: unknown } | undefined;
    while (e && !e.code) e = e.cause as typeof e;
    expect(e?.code).toBe('42P01');
  });

  it('keeps data on disk across a close and a reopen', async () => {
    await createTeam(d.db, 'durable-team');
    await d.close();
    d = await openDatabase({ dataDir: dir });
    const rows = await d.db.select().from(schema.teams).where(eq(schema.teams.name, 'durable-team'));
    expect(rows).toHaveLength(1);
  });

  it('fails queries with a clear error after the thread is closed, instead of hanging', async () => {
    const thread = await PgliteThread.open();
    expect((await thread.query<{ one: number }>('select 1 as one')).rows[0]!.one).toBe(1);
    await thread.close();
    await expect(thread.query('select 1')).rejects.toThrow(/database thread/);
  });
});

describe('an in-memory PGlite starts from a migrated template', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-pglite-template-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const tables = async (db: Database) =>
    rowsOf<{ n: number }>(
      await db.db.execute(sql`select count(*)::int as n from information_schema.tables where table_schema = 'public'`),
    )[0]!.n;

  it('made by the first database, empty of what that one wrote; a broken one is made again', async () => {
    const first = await openDatabase({ templateDir: dir });
    const migrated = await tables(first);
    expect(migrated).toBeGreaterThan(20);
    await createTeam(first.db, 'written-after');
    await first.close();
    const [file] = readdirSync(dir);
    expect(file).toMatch(/^pglite-[0-9a-f]{24}\.tar$/);
    const made = readFileSync(join(dir, file!));

    // The next starts from it: the same schema (its migrations already applied), none of the rows.
    const second = await openDatabase({ templateDir: dir });
    expect(await tables(second)).toBe(migrated);
    expect(await second.db.select().from(schema.teams)).toEqual([]);
    await second.close();
    expect(readdirSync(dir)).toEqual([file]);

    // A template cut short is dropped, the database made from nothing, and the template made again.
    writeFileSync(join(dir, file!), made.subarray(0, 4096));
    const third = await openDatabase({ templateDir: dir });
    expect(await tables(third)).toBe(migrated);
    await third.close();
    expect(readFileSync(join(dir, file!)).length).toBe(made.length);
  }, 120_000);

  it('a new data directory on disk is unpacked from it; one that exists is opened as it is', async () => {
    const data = mkdtempSync(join(tmpdir(), 'kiln-pglite-new-'));
    const other = mkdtempSync(join(tmpdir(), 'kiln-pglite-new-'));
    /** initdb gives every cluster an identifier of its own: the same one twice is the template's. */
    const systemId = async (db: Database) =>
      rowsOf<{ id: string }>(
        await db.db.execute(sql`select system_identifier::text as id from pg_control_system()`),
      )[0]!.id;
    try {
      const first = await openDatabase({ dataDir: data, templateDir: dir });
      const twin = await openDatabase({ dataDir: other, templateDir: dir });
      expect(await systemId(first)).toBe(await systemId(twin));
      await twin.close();
      expect(await tables(first)).toBeGreaterThan(20);
      expect(await first.db.select().from(schema.teams)).toEqual([]);
      await createTeam(first.db, 'kept on disk');
      await first.close();
      // Nothing left beside it from the unpacking.
      expect(readdirSync(data)).toEqual(['pglite']);
      const again = await openDatabase({ dataDir: data, templateDir: dir });
      expect((await again.db.select().from(schema.teams)).map((t) => t.name)).toEqual(['kept on disk']);
      await again.close();
    } finally {
      rmSync(data, { recursive: true, force: true });
      rmSync(other, { recursive: true, force: true });
    }
  }, 120_000);
});
