import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core';
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite';
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator';
import { drizzle as drizzlePostgres } from 'drizzle-orm/postgres-js';
import { migrate as migratePostgres } from 'drizzle-orm/postgres-js/migrator';
import postgres from 'postgres';
import { PgliteThread } from './pglite-thread.ts';
import * as schema from './schema/index.ts';

/** The one database type the rest of the code sees, whichever driver is underneath. */
export type Db = PgDatabase<PgQueryResultHKT, typeof schema>;

export interface Database {
  db: Db;
  driver: 'postgres' | 'pglite';
  /**
   * Postgres LISTEN, for news from other processes (replicas) on the same database. Absent on
   * PGlite, which only one process can open.
   */
  listen?: (channel: string, onMessage: (payload: string) => void) => Promise<() => Promise<void>>;
  close(): Promise<void>;
}

const migrationsFolder = fileURLToPath(new URL('../../drizzle', import.meta.url));
const MIGRATION_LOCK = 7_700_001;

/**
 * Opens Postgres (when a URL is given) or the embedded PGlite under `dataDir`,
 * and applies the drizzle-kit migrations before anything else touches it.
 */
export async function openDatabase(opts: { url?: string; dataDir?: string }): Promise<Database> {
  if (opts.url) return openPostgres(opts.url);
  return openPglite(opts.dataDir);
}

async function openPostgres(url: string): Promise<Database> {
  // Migrate on one dedicated connection holding an advisory lock, so replicas starting together
  // apply each migration once.
  const migrator = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await migrator`select pg_advisory_lock(${MIGRATION_LOCK})`;
    await migratePostgres(drizzlePostgres(migrator), { migrationsFolder });
  } finally {
    await migrator.end();
  }
  const client = postgres(url, { max: 10, onnotice: () => {} });
  return {
    db: drizzlePostgres(client, { schema }) as unknown as Db,
    driver: 'postgres',
    listen: async (channel, onMessage) => {
      const sub = await client.listen(channel, onMessage);
      return () => sub.unlisten();
    },
    close: () => client.end(),
  };
}

async function openPglite(dataDir?: string): Promise<Database> {
  let path: string | undefined;
  if (dataDir) {
    path = join(dataDir, 'pglite');
    mkdirSync(path, { recursive: true });
  }
  // In its own thread, so that statements do not stop the API's event loop (see PgliteThread).
  const client = await PgliteThread.open(path);
  try {
    const db = drizzlePglite(client.asPglite(), { schema });
    await migratePglite(db, { migrationsFolder });
    return { db: db as unknown as Db, driver: 'pglite', close: () => client.close() };
  } catch (err) {
    await client.close();
    throw err;
  }
}
