import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { type Embedder, openAiEmbedder } from '../../apps/api/src/memory/embeddings.ts';
import { loadConfig } from '../../apps/api/src/config.ts';
import { createTestApp } from '../support/app.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { memoryWorkspace } from '../support/memory.ts';

/**
 * The endpoint's embedder behind a gate the test opens: every call is recorded (its texts), waits
 * for the gate, and fails while `failures` says so. Our own Embedder interface, around the real
 * client talking to the scripted endpoint.
 */
function gated(inner: Embedder) {
  let open!: () => void;
  let gate = new Promise<void>((r) => {
    open = r;
  });
  const g = {
    calls: [] as string[][],
    failures: 0,
    open: () => open(),
    close: () => {
      gate = new Promise<void>((r) => {
        open = r;
      });
    },
    embedder: {
      model: inner.model,
      async embed(texts: string[]) {
        g.calls.push(texts);
        await gate;
        if (g.failures > 0) {
          g.failures--;
          throw new Error('the embeddings endpoint is down');
        }
        return inner.embed(texts);
      },
      // A search's query is not held: only the chunks' fill is (as the built-in encoder's query thread).
      embedQuery: async (text: string) => (await inner.embed([text]))[0]!,
    } satisfies Embedder,
  };
  return g;
}

const log = (word: string, n: number) =>
  `# 2026-03-0${word.length % 9}\n\n${Array.from({ length: n }, (_, i) => `- 09:${String(i % 60).padStart(2, '0')} Maya: ${word} note ${i}`).join('\n')}\n`;

describe('memory vectors, made after the write', () => {
  let fake: FakeOpenAI;
  let endpoint: Embedder;

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    endpoint = openAiEmbedder({ model: 'fake-embed', baseURL: fake.url, apiKey: 'test' });
  });
  afterAll(() => fake.close());

  it('uses the built-in encoder unless told otherwise', () => {
    expect(loadConfig({}).openai.embeddingsModel).toBe('builtin');
    expect(loadConfig({ KILN_EMBEDDINGS_MODEL: 'none' }).openai.embeddingsModel).toBeUndefined();
    expect(loadConfig({ KILN_EMBEDDINGS_MODEL: 'text-embedding-3-small' }).openai.embeddingsModel).toBe(
      'text-embedding-3-small',
    );
  });

  it('answers a write before its vectors exist; search finds by words meanwhile, and by meaning once they come', async () => {
    const g = gated(endpoint);
    const t = await createTestApp({ embedder: g.embedder });
    try {
      const w = await memoryWorkspace(t, 'vectors-later', { settle: false });
      // The encoder is held: the write still returns, and its chunks wait for their vectors.
      await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
      expect(await w.withoutVector()).toBeGreaterThan(0);
      expect((await w.search('red tyres'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
      // No shared word: only a vector finds it, and there is none yet.
      expect((await w.search('automobile')).map((h) => h.path)).not.toContain('knowledge/garage.md');

      g.open();
      await t.workspaces.vectorsSettled();
      expect(await w.withoutVector()).toBe(0);
      expect((await w.search('automobile', { debug: 'true' }))[0]).toMatchObject({
        path: 'knowledge/garage.md',
        debug: { vector_rank: 1 },
      });
    } finally {
      g.open();
      await t.close();
    }
  });

  it('tries again after a failed embedding; the chunks are found by their words meanwhile', async () => {
    const g = gated(endpoint);
    g.open();
    g.failures = 1;
    const t = await createTestApp({ embedder: g.embedder, vectorRetryMs: 1000 });
    try {
      const w = await memoryWorkspace(t, 'vectors-retry', { settle: false });
      await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
      await t.workspaces.vectorsSettled();
      // A turn failed: a warning, and the chunks still found by their words.
      expect(
        t.logs.some((l) => String(l.msg).startsWith('memory vectors: could not embed')),
        JSON.stringify(t.logs.map((l) => l.msg)),
      ).toBe(true);
      expect(await w.withoutVector()).toBeGreaterThan(0);
      expect((await w.search('red tyres'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
      // The retry embeds everything, the new file's chunks with the rest.
      await vi.waitFor(async () => expect(await w.withoutVector()).toBe(0), { timeout: 10_000, interval: 50 });
      expect((await w.search('automobile'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
    } finally {
      await t.close();
    }
  });

  it('answers by words alone when the query’s vector fails or does not come, and says so in the log once a minute', async () => {
    let query: 'fail' | 'hang' | 'nan' = 'fail';
    let clock = Date.now();
    const t = await createTestApp({
      now: () => clock,
      embedder: {
        model: endpoint.model,
        embed: (texts) => endpoint.embed(texts),
        embedQuery: (text) =>
          query === 'fail'
            ? Promise.reject(new Error('the encoder’s thread is gone'))
            : query === 'nan'
              ? endpoint.embed([text]).then(([v]) => v!.map((x, i) => (i === 7 ? Number.NaN : x)))
              : new Promise<number[]>(() => {}),
      },
    });
    try {
      const w = await memoryWorkspace(t, 'vectors-query');
      await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
      const failed = () =>
        t.logs.filter((l) => l.msg === 'memory search: the query’s vector failed; answered by words alone');
      expect((await w.search('red tyres'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
      expect(failed()).toHaveLength(1);
      // An endpoint down fails every search: the log says so once a minute, not once a search.
      await w.search('red tyres');
      await w.search('tyres');
      expect(failed()).toHaveLength(1);
      clock += 61_000;
      // A vector the database would refuse (an endpoint's NaN) is a failed one, not a 500.
      query = 'nan';
      expect((await w.search('red tyres'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
      expect(failed()).toHaveLength(2);
      expect(failed()[1]).toMatchObject({ unloggedSince: 2 });
      query = 'hang';
      expect((await w.search('red tyres'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
      expect(t.logs.some((l) => String(l.msg).startsWith('memory search: the query’s vector came too late'))).toBe(
        true,
      );
    } finally {
      await t.close();
    }
  });

  it('takes workspaces in turns: a long import does not hold back another workspace’s vectors', async () => {
    const g = gated(endpoint);
    const t = await createTestApp({ embedder: g.embedder });
    try {
      const a = await memoryWorkspace(t, 'vectors-import', { settle: false });
      const b = await memoryWorkspace(t, 'vectors-small', { settle: false });
      // Hundreds of chunks for A (several turns of 32), one file for B, all while the encoder is held.
      await a.put('memory/2026-03-01.md', log('alpha', 300));
      await b.put('knowledge/bravo.md', '# Bravo\n\nbravo is the small one.\n');
      g.open();
      await t.workspaces.vectorsSettled();
      expect(await a.withoutVector()).toBe(0);
      expect(await b.withoutVector()).toBe(0);
      const firstB = g.calls.findIndex((c) => c.some((x) => x.includes('bravo')));
      const lastA = g.calls.length - 1 - [...g.calls].reverse().findIndex((c) => c.some((x) => x.includes('alpha')));
      expect(lastA - g.calls.findIndex((c) => c.some((x) => x.includes('alpha')))).toBeGreaterThan(2);
      expect(firstB).toBeGreaterThan(-1);
      expect(firstB).toBeLessThan(lastA);
    } finally {
      g.open();
      await t.close();
    }
  });

  it('reads the chunks waiting for a vector through an index of those alone, not the workspace’s every chunk', async () => {
    const t = await createTestApp({ embedder: endpoint });
    try {
      const w = await memoryWorkspace(t, 'vectors-index');
      const plan = await t.database.db.transaction(async (tx) => {
        await tx.execute(sql`set local enable_seqscan = off`);
        return rowsOf<{ 'QUERY PLAN': string }>(
          await tx.execute(sql`explain select c.id from memory_chunks c
            where c.workspace_id = ${w.ws} and c.embedding is null order by c.id limit 33`),
        )
          .map((r) => r['QUERY PLAN'])
          .join('\n');
      });
      expect(plan).toContain('memory_chunks_unembedded_idx');
    } finally {
      await t.close();
    }
  });

  it('cuts a text to what the endpoint takes, leaves one it refuses however short to its words, and never lets either hold back the workspace’s other vectors', async () => {
    // A fake of its own: its model changes here, and the refusals it records are this test's.
    const strict = await startFakeOpenAI();
    const refusals = () => strict.refusals.splice(0).map((r) => r.message);
    // A failed turn is not tried again within the test: a chunk left without a vector stays so.
    const t = await createTestApp({
      embedder: openAiEmbedder({ model: 'fake-embed', baseURL: strict.url, apiKey: 'test' }),
      vectorRetryMs: 600_000,
    });
    const vectorSize = async (ws: string, path: string) =>
      rowsOf<{ n: number | null }>(
        await t.database.db.execute(
          sql`select cardinality(embedding) as n from memory_chunks where workspace_id = ${ws} and path = ${path}`,
        ),
      ).map((r) => r.n);
    const warned = (start: string) => t.logs.filter((l) => String(l.msg).startsWith(start)).length;
    try {
      const w = await memoryWorkspace(t, 'vectors-refused');
      // 4,000 Chinese characters on one line: 12,000 bytes, more than the model's 8,192 tokens
      // when every byte may be a token. Before, the chunk went whole, the endpoint refused the
      // turn, and every later write of the workspace waited for a retry that failed the same way.
      await w.put('knowledge/chinese.md', `# 笔记\n\n${'部署流程'.repeat(1000)}\n`);
      await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
      expect(refusals()).toEqual([]);
      expect(await w.withoutVector()).toBe(0);
      expect(await vectorSize(w.ws, 'knowledge/chinese.md')).toEqual([512]);
      expect((await w.search('automobile'))[0]).toMatchObject({ path: 'knowledge/garage.md' });

      // A model served with a 512-token context: a long chunk is cut in half until it is taken,
      // and the texts after it are cut to that size before they are sent.
      strict.embeddings.contextTokens = 512;
      const prose = (word: string) =>
        `# ${word}\n\n${Array.from({ length: 10 }, (_, i) => `${word} line ${i}: ${'the quick brown fox jumps over the lazy dog '.repeat(6)}`).join('\n')}\n`;
      await w.put('knowledge/long.md', prose('alpha'));
      const cut = refusals();
      expect(cut.length).toBeGreaterThan(0);
      for (const m of cut) expect(m).toContain('maximum context length is 512 tokens');
      await w.put('knowledge/longer.md', prose('beta'));
      expect(refusals()).toEqual([]);
      expect(await w.withoutVector()).toBe(0);
      expect(await vectorSize(w.ws, 'knowledge/longer.md')).toEqual([512]);

      // A text the model refuses at any length, and one it answers with NaN: both chunks are
      // left without a vector for good, found by their words; the other chunks of the same
      // commit get theirs, and search by meaning still works.
      strict.embeddings.refuses = (text) => text.includes('quarantined');
      strict.embeddings.nan = (text) => text.includes('glitchy');
      const warnedBefore = warned('memory vectors: the embeddings model gave no usable vector');
      // One commit: the three chunks go to the endpoint in one turn.
      await w.putAll({
        'knowledge/odd.md': 'The quarantined crate sits in bay four.\n',
        'knowledge/nan.md': 'The glitchy sensor reads the garage door.\n',
        'knowledge/pets.md': 'Our kitten sleeps on the sofa.\n',
      });
      expect(refusals().every((m) => m === 'The input could not be processed.')).toBe(true);
      expect(await w.withoutVector()).toBe(0);
      expect(await vectorSize(w.ws, 'knowledge/odd.md')).toEqual([0]);
      expect(await vectorSize(w.ws, 'knowledge/nan.md')).toEqual([0]);
      expect(await vectorSize(w.ws, 'knowledge/pets.md')).toEqual([512]);
      expect(warned('memory vectors: the embeddings model gave no usable vector')).toBeGreaterThan(warnedBefore);
      expect((await w.search('quarantined crate'))[0]).toMatchObject({ path: 'knowledge/odd.md' });
      expect((await w.search('glitchy sensor'))[0]).toMatchObject({ path: 'knowledge/nan.md' });
      const failedBefore = warned('memory search');
      expect((await w.search('feline'))[0]).toMatchObject({ path: 'knowledge/pets.md' });
      expect(warned('memory search')).toBe(failedBefore);

      // An endpoint that refuses everything (a model it does not serve) marks nothing: the chunk
      // waits for a vector, and the turn fails as any outage does.
      strict.embeddings.refuses = () => true;
      await w.put('knowledge/later.md', 'Written while the model is gone.\n');
      refusals();
      expect(await vectorSize(w.ws, 'knowledge/later.md')).toEqual([null]);
      expect(warned('memory vectors: could not embed')).toBeGreaterThan(0);
    } finally {
      await t.close();
      strict.refusals.splice(0);
      await strict.close();
    }
  });

  it('a server stopped before its vectors were made leaves them to the next start, which makes them', async () => {
    const t1 = await createTestApp({ embedder: endpoint });
    const g = gated(endpoint);
    const t2 = await createTestApp({ replicaOf: t1, embedder: g.embedder });
    try {
      // Counted through the first replica's connection: the second's closes with it.
      const w = await memoryWorkspace(t2, 'vectors-stopped', { settle: false, db: t1.database.db });
      await w.put('memory/2026-03-02.md', log('charlie', 120));
      const before = await w.withoutVector();
      expect(before).toBeGreaterThan(32);
      // The stop waits for the turn in progress, then no more.
      const closing = t2.close();
      g.open();
      await closing;
      const left = await w.withoutVector();
      expect(left).toBeGreaterThan(0);
      expect(left).toBeLessThan(before);
      // The next start (the other replica's here) finds them and embeds them.
      await t1.workspaces.reindexStale();
      await t1.workspaces.vectorsSettled();
      expect(await w.withoutVector()).toBe(0);
    } finally {
      g.open();
      await t1.close();
    }
  });
});
