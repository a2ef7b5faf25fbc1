// The embedded database's own thread. PGlite is Postgres compiled to WebAssembly: every statement
// runs synchronously in the thread that owns it. Here, that is this worker, so the API's event
// loop (agent runs, SSE, HTTP) keeps running while a statement executes.
//
// Plain JavaScript on purpose: a worker is started by Node itself, outside tsx's or vitest's
// TypeScript loaders. It speaks the small protocol that pglite-thread.ts expects:
//   in:  { id, op: 'query', sql, params, rowMode, parsers, tx } | { id, op: 'exec', sql, tx }
//        | { id, op: 'begin' } | { id, op: 'commit', tx } | { id, op: 'rollback', tx } | { id, op: 'close' }
//        | { id, op: 'dump', path } (the data directory as a tar, written to a temporary name, then renamed)
//   workerData: { dataDir?, template? } (template: a dump to start an in-memory database from)
//   out: { id, ok } | { id, error }
import { randomBytes } from 'node:crypto';
import { readFile, rename, rm, writeFile } from 'node:fs/promises';
import { parentPort, workerData } from 'node:worker_threads';
import { PGlite } from '@electric-sql/pglite';
import { pg_trgm } from '@electric-sql/pglite/contrib/pg_trgm';
import { vector } from '@electric-sql/pglite-pgvector';

const identity = (value) => value;
/** Open transactions by id: PGlite's transaction object and how to end its callback. */
const transactions = new Map();
let pg;

function errorOf(err) {
  const out = { message: err?.message ?? String(err), name: err?.name ?? 'Error' };
  // The fields of a Postgres error (code, detail, constraint, …) are what callers branch on.
  for (const key of [
    'code',
    'severity',
    'detail',
    'hint',
    'position',
    'schema',
    'table',
    'column',
    'dataType',
    'constraint',
    'where',
  ]) {
    if (err?.[key] !== undefined) out[key] = err[key];
  }
  return out;
}

/**
 * Query options as the caller gave them, except parsers: functions cannot cross threads, so the
 * caller names the type OIDs it wants left as text and gets them unparsed (what drizzle asks for).
 */
function optionsOf(msg) {
  const options = {};
  if (msg.rowMode) options.rowMode = msg.rowMode;
  if (msg.parsers) options.parsers = Object.fromEntries(msg.parsers.map((oid) => [oid, identity]));
  return options;
}

function target(msg) {
  if (msg.tx === undefined) return pg;
  const open = transactions.get(msg.tx);
  if (!open) throw new Error(`transaction ${msg.tx} is not open`);
  return open.tx;
}

async function handle(msg) {
  switch (msg.op) {
    case 'query':
      return target(msg).query(msg.sql, msg.params, optionsOf(msg));
    case 'exec':
      return target(msg).exec(msg.sql, optionsOf(msg));
    case 'begin':
      // Resolves once PGlite has begun the transaction; it stays open until commit or rollback.
      return new Promise((started, failed) => {
        const done = pg.transaction(
          (tx) =>
            new Promise((commit, rollback) => {
              transactions.set(msg.id, { tx, commit, rollback, done });
              started(msg.id);
            }),
        );
        done.catch((err) => failed(err));
      });
    case 'commit':
    case 'rollback': {
      const open = transactions.get(msg.tx);
      if (!open) throw new Error(`transaction ${msg.tx} is not open`);
      transactions.delete(msg.tx);
      if (msg.op === 'commit') {
        open.commit();
        await open.done;
      } else {
        const marker = new Error('rolled back');
        open.rollback(marker);
        await open.done.catch((err) => {
          if (err !== marker) throw err;
        });
      }
      return null;
    }
    case 'dump': {
      const tar = await pg.dumpDataDir('none');
      const aside = `${msg.path}.${randomBytes(6).toString('hex')}.part`;
      try {
        await writeFile(aside, Buffer.from(await tar.arrayBuffer()), { mode: 0o600 });
        await rename(aside, msg.path);
      } finally {
        await rm(aside, { force: true });
      }
      return null;
    }
    case 'close':
      await pg.close();
      return null;
    default:
      throw new Error(`unknown operation ${msg.op}`);
  }
}

try {
  const loadDataDir = workerData.template ? new Blob([await readFile(workerData.template)]) : undefined;
  pg = await PGlite.create(workerData.dataDir, {
    relaxedDurability: true,
    extensions: { pg_trgm, vector },
    ...(loadDataDir ? { loadDataDir } : {}),
  });
  parentPort.on('message', (msg) => {
    handle(msg).then(
      (ok) => parentPort.postMessage({ id: msg.id, ok }),
      (err) => parentPort.postMessage({ id: msg.id, error: errorOf(err) }),
    );
  });
  parentPort.postMessage({ id: 0, ok: 'ready' });
} catch (err) {
  parentPort.postMessage({ id: 0, error: errorOf(err) });
}
