import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core';
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite';
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator';
import { drizzle as drizzlePostgres } from 'drizzle-orm/postgres-js';
import { migrate as migratePostgres } from 'drizzle-orm/postgres-js/migrator';
import postgres from 'postgres';
import { PgliteThread } from './pglite-thread.ts';
import { type StatementListener, StatementTimings } from './statements.ts';
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
  /**
   * Calls `listener` after every statement of `db` with its driver, kind and duration, until the
   * returned function is called (the metrics' statement latency; nothing is timed while none listens).
   */
  onStatement: (listener: StatementListener) => () => void;
  /**
   * Takes a lock every process on this database respects (a Postgres advisory lock on a connection
   * of its own), and resolves with its release. A process that dies releases its locks with its
   * connection. Absent on PGlite, which only one process can open: a lock in memory is enough there.
   */
  lock?: (key: string) => Promise<() => Promise<void>>;
  close(): Promise<void>;
}

const migrationsFolder = fileURLToPath(new URL('../../drizzle', import.meta.url));
const TEMPLATES = fileURLToPath(new URL('../../../../node_modules/.cache/kiln', import.meta.url));
const require = createRequire(import.meta.url);
const execFileAsync = promisify(execFile);
const MIGRATION_LOCK = 7_700_001;
/** The first key of every `Database.lock` (the second is a hash of the caller's key). */
const NAMED_LOCKS = 7_700_002;
/**
 * Connections that may hold a named lock at once, per process: each held lock holds one, so a
 * process writing to more workspaces at once waits for one (the statements' own pool never does).
 */
const LOCK_CONNECTIONS = 8;

/**
 * Opens Postgres (when a URL is given) or the embedded PGlite under `dataDir`,
 * and applies the drizzle-kit migrations before anything else touches it.
 */
export async function openDatabase(opts: {
  url?: string;
  dataDir?: string;
  /** Where an in-memory PGlite keeps the migrated template it starts from (default node_modules/.cache/kiln). */
  templateDir?: string;
}): Promise<Database> {
  if (opts.url) return openPostgres(opts.url);
  return openPglite(opts.dataDir, opts.templateDir);
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
  const locks = postgres(url, { max: LOCK_CONNECTIONS, onnotice: () => {} });
  const timings = new StatementTimings('postgres');
  return {
    db: drizzlePostgres(timed(client, timings), { schema }) as unknown as Db,
    driver: 'postgres',
    onStatement: (listener) => timings.on(listener),
    listen: async (channel, onMessage) => {
      const sub = await client.listen(channel, onMessage);
      return () => sub.unlisten();
    },
    // The lock is a transaction's (pg_advisory_xact_lock), held until its release ends the
    // transaction: no failure can leave it held on a pooled connection.
    lock: (key) =>
      new Promise((resolve, reject) => {
        let release!: () => void;
        const held = new Promise<void>((r) => {
          release = r;
        });
        const done = locks.begin(async (tx) => {
          await tx`select pg_advisory_xact_lock(${NAMED_LOCKS}, hashtext(${key}))`;
          resolve(async () => {
            release();
            // Ends when the transaction has: a connection lost meanwhile released the lock already.
            await done.then(
              () => undefined,
              () => undefined,
            );
          });
          await held;
        });
        done.catch(reject);
      }),
    close: async () => {
      await locks.end();
      await client.end();
    },
  };
}

/**
 * Where a migrated, empty database is kept to start the next new one from: a PGlite data
 * directory as a tar under node_modules/.cache, named by a hash of the migrations and of PGlite's
 * version (a change to either makes a new one). Making a database (initdb) and migrating it took
 * 6.7 s on a busy 2-core host. An in-memory database loads the tar (2.3 s there); a new data
 * directory on disk gets it unpacked by tar and is then opened as an existing one (0.4 + 1.2 s;
 * PGlite's own loading into a directory took 8.4 s). Undefined when the cache cannot be made.
 */
function templateOf(dir = TEMPLATES): string | undefined {
  try {
    const hash = createHash('sha256');
    for (const pkg of ['@electric-sql/pglite', '@electric-sql/pglite-pgvector']) hash.update(`${versionOf(pkg)}\n`);
    for (const file of readdirSync(migrationsFolder, { recursive: true }).map(String).sort()) {
      const full = join(migrationsFolder, file);
      if (statSync(full).isFile()) hash.update(`${file}\n`).update(readFileSync(full));
    }
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    return join(dir, `pglite-${hash.digest('hex').slice(0, 24)}.tar`);
  } catch {
    return undefined;
  }
}

/** An installed package's name and version, from the package.json above its entry (which it does not export). */
function versionOf(pkg: string): string {
  let dir = dirname(require.resolve(pkg));
  while (!existsSync(join(dir, 'package.json'))) {
    if (dirname(dir) === dir) throw new Error(`no package.json for ${pkg}`);
    dir = dirname(dir);
  }
  const { name, version } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
    name: string;
    version: string;
  };
  return `${name}@${version}`;
}

/**
 * Unpacks a template into a data directory not made yet: into a directory beside it first, then
 * renamed into place, so a start cut short leaves no half-unpacked database that looks made.
 */
async function unpack(template: string, path: string): Promise<void> {
  const aside = `${path}.unpack-${randomBytes(6).toString('hex')}`;
  mkdirSync(aside, { mode: 0o700 });
  try {
    await execFileAsync('tar', ['-xf', template, '-C', aside]);
    rmdirSync(path);
    renameSync(aside, path);
  } finally {
    rmSync(aside, { recursive: true, force: true });
  }
}

async function openPglite(dataDir?: string, templateDir?: string): Promise<Database> {
  let path: string | undefined;
  // A database not made yet (in memory, or a data directory without PG_VERSION) starts from the template.
  let fresh = true;
  if (dataDir) {
    path = join(dataDir, 'pglite');
    mkdirSync(path, { recursive: true });
    fresh = !existsSync(join(path, 'PG_VERSION'));
  }
  // In its own thread, so that statements do not stop the API's event loop (see PgliteThread).
  const timings = new StatementTimings('pglite');
  const template = fresh ? templateOf(templateDir) : undefined;
  let start = template && existsSync(template) ? template : undefined;
  const fromTemplate = async (t: string) => {
    if (!path) return PgliteThread.open(undefined, timings, t);
    await unpack(t, path);
    return PgliteThread.open(path, timings);
  };
  const client = await (start ? fromTemplate(start) : PgliteThread.open(path, timings)).catch((err) => {
    if (!start) throw err;
    // A template that cannot be loaded (cut short, another version's) is dropped and made again;
    // the database (new: nothing of anyone's is in it) is made from nothing.
    rmSync(start, { force: true });
    start = undefined;
    if (path) {
      rmSync(path, { recursive: true, force: true });
      mkdirSync(path, { recursive: true });
    }
    return PgliteThread.open(path, timings);
  });
  try {
    const db = drizzlePglite(client.asPglite(), { schema });
    await migratePglite(db, { migrationsFolder });
    // Best effort: without a template, every new database is made from nothing.
    if (template && !start) await client.dump(template).catch(() => {});
    return {
      db: db as unknown as Db,
      driver: 'pglite',
      onStatement: (listener) => timings.on(listener),
      close: () => client.close(),
    };
  } catch (err) {
    await client.close();
    throw err;
  }
}

/**
 * The postgres.js client as drizzle sees it, with each statement timed: drizzle sends every
 * statement through `unsafe()` (on the client, or on a transaction's or savepoint's client, which
 * are wrapped the same way). A query of postgres.js runs when it is first awaited, so the clock
 * starts in its first `then`; while nobody listens the query is returned untouched.
 */
function timed(sql: postgres.Sql, timings: StatementTimings): postgres.Sql {
  const wrapTx =
    (begin: (...args: unknown[]) => unknown) =>
    (...args: unknown[]) => {
      const fn = args.at(-1) as (tx: postgres.Sql) => unknown;
      return begin(...args.slice(0, -1), (tx: postgres.Sql) => fn(timed(tx, timings)));
    };
  return new Proxy(sql, {
    get(target, key, receiver) {
      if (key === 'unsafe')
        return (query: string, ...rest: unknown[]) => {
          const q = (target.unsafe as (...a: unknown[]) => postgres.PendingQuery<postgres.Row[]>)(query, ...rest);
          if (!timings.active) return q;
          const then = q.then;
          let counted = false;
          // biome-ignore lint/suspicious/noThenProperty: the query runs when awaited, through its own then, which this wraps
          q.then = function (
            this: typeof q,
            onFulfilled?: (v: unknown) => unknown,
            onRejected?: (e: unknown) => unknown,
          ) {
            // The first then is the await that runs it; postgres.js adds its own later (a
            // transaction's catch), which must not count the statement again.
            if (counted) return then.call(this, onFulfilled, onRejected);
            counted = true;
            const started = performance.now();
            return then.call(
              this,
              (v) => {
                timings.done(query, started);
                return onFulfilled ? onFulfilled(v) : (v as never);
              },
              (err) => {
                timings.done(query, started);
                if (onRejected) return onRejected(err);
                throw err;
              },
            );
          } as typeof q.then;
          return q;
        };
      if (key === 'begin' || key === 'savepoint') {
        const begin = Reflect.get(target, key, receiver) as ((...args: unknown[]) => unknown) | undefined;
        return begin && wrapTx(begin.bind(target));
      }
      return Reflect.get(target, key, receiver);
    },
  });
}
