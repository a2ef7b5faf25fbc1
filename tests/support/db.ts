import { randomBytes } from 'node:crypto';
import postgres from 'postgres';
import { openDatabase, type Database } from '../../apps/api/src/db/client.ts';

/** The suite's Postgres server (trust auth); each test file gets a database of its own. */
const PG_ADMIN_URL = process.env.KILN_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

export type Driver = 'postgres' | 'pglite';
export const DRIVERS: Driver[] = ['postgres', 'pglite'];

export interface TestDatabase extends Database {
  url?: string;
  drop(): Promise<void>;
  /** A second connection to the same Postgres database (another replica); closing it drops nothing. */
  reopen(): Promise<TestDatabase>;
}

/**
 * A fresh, migrated database: a new Postgres database (dropped afterwards) or an in-memory PGlite.
 * `adminUrl` is another Postgres server's (the fleet test's database host); default the suite's.
 */
export async function createTestDatabase(driver: Driver = 'postgres', adminUrl = PG_ADMIN_URL): Promise<TestDatabase> {
  if (driver === 'pglite') {
    const database = await openDatabase({});
    return {
      ...database,
      drop: () => database.close(),
      reopen: () => Promise.reject(new Error('an in-memory PGlite cannot be shared by two replicas')),
    };
  }
  const url = await createPgDatabase(adminUrl);
  const database = await openDatabase({ url });
  const reopen = async (): Promise<TestDatabase> => {
    const again = await openDatabase({ url });
    return { ...again, url, drop: () => again.close(), reopen };
  };
  return {
    ...database,
    url,
    reopen,
    drop: async () => {
      await database.close();
      await dropPgDatabase(url, adminUrl);
    },
  };
}

export async function createPgDatabase(adminUrl = PG_ADMIN_URL): Promise<string> {
  const name = `kiln_test_${randomBytes(6).toString('hex')}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}

export async function dropPgDatabase(url: string, adminUrl = PG_ADMIN_URL): Promise<void> {
  const name = new URL(url).pathname.slice(1);
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`drop database if exists ${name} with (force)`);
  } finally {
    await admin.end();
  }
}

export { rowsOf } from '../../apps/api/src/db/rows.ts';
