import { createHash } from 'node:crypto';
import { sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { type Embedder, usableVector } from './embeddings.ts';

/** Chunks embedded per turn of one workspace (then the next workspace waiting has its turn). */
const BATCH = 32;
/** After a failed turn (the endpoint down, the encoder's thread lost), a workspace waits this long, doubling to RETRY_MAX_MS. */
const RETRY_MS = 5_000;
const RETRY_MAX_MS = 10 * 60_000;
/** Of a chunk's text, at most this much is read and embedded (a tenant's file may be one huge line). */
const TEXT_CHARS = 8_000;
/** Workspaces with chunks but no vectors, looked for at start-up (a process that stopped mid-way). */
const SWEEP_LIMIT = 10_000;

/**
 * Embeds memory chunks after they are written, never on the write's path: a commit writes its
 * chunks (with the vectors the index already had for the same text) and returns; the chunks still
 * without a vector are embedded here, in the background, and a search fuses whatever vectors
 * exist meanwhile (a chunk without one is still found by its words).
 *
 * Workspaces take turns of BATCH chunks, so one tenant's import of a year of logs delays another
 * tenant's new vectors by one turn, not by the whole import. A vector is written only to the
 * chunk it was made from (same id, same content, still without one), so a chunk replaced
 * meanwhile is left to the turn that finds it. Replicas may embed the same chunk twice; the second
 * write finds it filled and changes nothing.
 */
export class VectorFill {
  /** Workspaces waiting for a turn, in the order they asked. */
  private readonly waiting = new Set<string>();
  /** Consecutive failed turns of a workspace, and the timer of its next try. */
  private readonly failed = new Map<string, number>();
  private readonly retries = new Map<string, NodeJS.Timeout>();
  private running: Promise<void> | null = null;
  private stopped = false;

  constructor(
    private readonly db: Db,
    readonly embedder: Embedder,
    private readonly log?: Logger,
    /** The first wait after a failed turn (doubling to RETRY_MAX_MS). */
    private readonly retryMs = RETRY_MS,
  ) {}

  /** Embed the workspace's chunks that have no vector yet (returns at once; a workspace waiting to retry keeps waiting). */
  schedule(workspaceId: string): void {
    if (this.stopped || this.retries.has(workspaceId)) return;
    this.waiting.add(workspaceId);
    this.kick();
  }

  /** Schedules every workspace whose index has chunks without a vector of this model (start-up). */
  async sweep(): Promise<number> {
    const rows = rowsOf<{ workspace_id: string }>(
      await this.db.execute(sql`select m.workspace_id from memory_index m
        where m.embed_model = ${this.embedder.model}
          and exists (select 1 from memory_chunks c where c.workspace_id = m.workspace_id and c.embedding is null)
        limit ${SWEEP_LIMIT}`),
    );
    for (const r of rows) this.schedule(r.workspace_id);
    return rows.length;
  }

  /** Resolves once nothing is waiting or being embedded (tests, the bench). */
  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  /** Stops after the turn in progress; what is left is found again by the next start's sweep. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.waiting.clear();
    for (const t of this.retries.values()) clearTimeout(t);
    this.retries.clear();
    await this.running;
  }

  private kick(): void {
    this.running ??= this.loop().finally(() => {
      this.running = null;
      // A workspace that asked while the loop was ending.
      if (this.waiting.size && !this.stopped) this.kick();
    });
  }

  private async loop(): Promise<void> {
    for (let [ws] = this.waiting; ws !== undefined && !this.stopped; [ws] = this.waiting) {
      this.waiting.delete(ws);
      try {
        if (await this.turn(ws)) this.waiting.add(ws);
        this.failed.delete(ws);
      } catch (err) {
        this.retryLater(ws, err);
      }
    }
  }

  /** Embeds up to BATCH chunks of a workspace; true when it has more. */
  private async turn(workspaceId: string): Promise<boolean> {
    const { model } = this.embedder;
    const rows = rowsOf<{ id: number; content_hash: string; search_text: string; builtin: boolean }>(
      await this.db.execute(sql`select c.id, c.content_hash, left(c.search_text, ${TEXT_CHARS}::int) as search_text, c.builtin from memory_chunks c
        join memory_index m on m.workspace_id = c.workspace_id and m.embed_model = ${model}
        where c.workspace_id = ${workspaceId} and c.embedding is null
        order by c.id limit ${BATCH + 1}`),
    );
    const batch = rows.slice(0, BATCH);
    if (!batch.length) return false;
    const made = await this.embedder.embed(batch.map((r) => r.search_text));
    if (made.length !== batch.length)
      throw new Error(`the embedder gave ${made.length} vectors for ${batch.length} texts`);
    // A text the model refuses, or an answer pgvector would refuse (NaN, say), leaves its chunk
    // with an empty vector: found by its words alone, and never asked for again (the chunk stays
    // out of every vector search and index: they read vectors of the query's size).
    const vectors = made.map((v) => (usableVector(v) ? v : []));
    const refused = vectors.filter((v) => !v.length).length;
    if (refused)
      this.log?.warn(
        { workspace: workspaceId, chunks: refused, model },
        'memory vectors: the embeddings model gave no usable vector for some chunks; they are found by their words alone',
      );
    for (const [i, r] of batch.entries())
      if (r.builtin && vectors[i]!.length) rememberBuiltin(model, r.search_text, vectors[i]!);
    const list = (xs: string[]) => `{${xs.join(',')}}`;
    await this.db.execute(sql`update memory_chunks c set embedding = v.embedding::real[]
      from unnest(${list(batch.map((r) => String(r.id)))}::bigint[], ${list(batch.map((r) => r.content_hash))}::text[],
        ${list(vectors.map((v) => `"{${v.join(',')}}"`))}::text[]) as v(id, content_hash, embedding)
      where c.id = v.id and c.content_hash = v.content_hash and c.embedding is null`);
    return rows.length > BATCH;
  }

  private retryLater(workspaceId: string, err: unknown): void {
    const count = (this.failed.get(workspaceId) ?? 0) + 1;
    this.failed.set(workspaceId, count);
    const wait = Math.min(RETRY_MAX_MS, this.retryMs * 2 ** (count - 1));
    this.log?.warn(
      { err, workspace: workspaceId, retryInMs: wait },
      'memory vectors: could not embed a workspace’s new chunks; search finds them by their words meanwhile',
    );
    const timer = setTimeout(() => {
      this.retries.delete(workspaceId);
      this.schedule(workspaceId);
    }, wait);
    timer.unref();
    this.retries.set(workspaceId, timer);
  }
}

/**
 * Vectors of the built-in skills' chunks (skills/builtin/, Kiln's own text, the same in every
 * workspace), by model and text: a new workspace takes them from here instead of embedding them
 * again. Only Kiln's text: a cache shared by tenants' own text would tell one tenant, by how soon
 * its vectors come, what another has written.
 */
const builtinVectors = new Map<string, number[]>();
const BUILTIN_VECTORS_MAX = 2000;
const builtinKey = (model: string, text: string) => `${model}\0${createHash('sha256').update(text).digest('hex')}`;

export const builtinVector = (model: string, text: string) => builtinVectors.get(builtinKey(model, text));

function rememberBuiltin(model: string, text: string, v: number[]): void {
  if (builtinVectors.size < BUILTIN_VECTORS_MAX) builtinVectors.set(builtinKey(model, text), v);
}
