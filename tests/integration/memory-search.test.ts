import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { and, eq, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { memoryChunks, memoryIndex } from '../../apps/api/src/db/schema/index.ts';
import { INDEX_VERSION, WINDOWS } from '../../apps/api/src/memory/chunker.ts';
import { recencyFactor, SNIPPET_CHARS, VECTOR_DEPTH } from '../../apps/api/src/memory/rank.ts';
import { BUILTIN_EMBEDDINGS, openAiEmbedder } from '../../apps/api/src/memory/embeddings.ts';
import { loadConfig } from '../../apps/api/src/config.ts';
import { hasPgvector, nearest, type SearchHit } from '../../apps/api/src/memory/search.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { DRIVERS, type Driver } from '../support/db.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { type MemoryHit, memoryWorkspace } from '../support/memory.ts';

const day = (offset: number) => new Date(Date.now() - offset * 86_400_000).toISOString().slice(0, 10);

type Hit = MemoryHit;

/** A conversation log of one day: one line per turn, as the dream and the condensation write them. */
const chat = (d: string, turns: string[]) =>
  `# ${d}\n\n## Conversation\n\n${turns.map((l, i) => `- ${String(9 + Math.floor(i / 6)).padStart(2, '0')}:${String((i * 7) % 60).padStart(2, '0')} ${l}`).join('\n')}\n`;
const FILLER = [
  'Maya: Good morning! How did the week go?',
  'Leo: Busy, but fine. The weather was nice when we went out.',
  'Maya: Did you do anything fun on the weekend?',
  'Leo: Not much, we stayed home and cooked.',
  'Maya: That sounds relaxing, I should do that more often.',
  'Leo: When did you get back from work yesterday?',
  'Maya: Late again, the trains were slow.',
  'Leo: The same happened to me last month.',
];

describe.each(DRIVERS)('memory search on %s', (driver) => {
  let t: TestApp;
  let w: Awaited<ReturnType<typeof memoryWorkspace>>;

  beforeAll(async () => {
    t = await createTestApp({ driver });
    w = await memoryWorkspace(t, `search-${driver}`);
  });
  afterAll(() => t.close());

  it('indexes the template at creation: built-in skills are searchable, the template boilerplate is not', async () => {
    const hits = await w.search('consolidate budget merge bullets');
    expect(hits.map((h) => h.path)).toContain('skills/builtin/memory-keeping/SKILL.md');
    // MEMORY.md's and knowledge/index.md's template text says nothing about the user.
    expect((await w.search('short factual bullets one per line')).map((h) => h.path)).not.toContain('MEMORY.md');
    expect((await w.search('pages by topic one line each', { path: 'knowledge/' })).length).toBe(0);
  });

  it('finds a fact right after the commit that wrote it; start_line and end_line point at the matching line', async () => {
    await w.put(
      'MEMORY.md',
      '# Core memory\n\n- The staging database is called orchid.\n- Reports go out on Mondays.\n',
    );
    const [hit] = await w.search('staging database');
    expect(hit).toMatchObject({ path: 'MEMORY.md', date: null, heading: 'Core memory' });
    expect(hit!.start_line).toBeLessThanOrEqual(3);
    expect(hit!.end_line).toBeGreaterThanOrEqual(3);
    expect(hit!.snippet).toContain('staging database is called orchid');
    expect(hit!.score).toBeGreaterThan(0);
  });

  it('stems English and drops stop words: "when did we decide" finds "Decided", not the text that shares only "when", "did", "the"', async () => {
    await w.put(
      `memory/${day(200)}.md`,
      chat(day(200), [
        ...FILLER,
        'Maya: We decided the audits happen every quarter, with the blue checklist.',
        ...FILLER,
      ]),
    );
    const hits = await w.search('When did we decide about the audit checklists?');
    expect(hits[0]).toMatchObject({ path: `memory/${day(200)}.md`, date: day(200) });
    expect(hits[0]!.snippet).toContain('decided the audits happen every quarter');
    const line = 5 + FILLER.length + 1;
    expect(hits[0]!.start_line).toBeLessThanOrEqual(line);
    expect(hits[0]!.end_line).toBeGreaterThanOrEqual(line);
    // Only stop words: nothing to look for, so nothing found (not an error).
    expect(await w.search('when did the')).toEqual([]);
  });

  it('finds a word’s other stems: "allergy" (allergi) finds "allergic" (allerg), at half the weight of the word itself', async () => {
    await w.put(
      `memory/${day(210)}.md`,
      chat(day(210), [...FILLER, 'Maya: I am allergic to cats, my eyes swell up.', ...FILLER]),
    );
    await w.put(
      `memory/${day(211)}.md`,
      chat(day(211), [...FILLER, 'Leo: The pharmacy had nothing for allergy season.', ...FILLER]),
    );
    const hits = await w.search('Which animals trigger her allergy?', { debug: 'true' });
    // The word itself first, then its family: both found, the exact stem ahead.
    expect(hits.map((h) => h.path).slice(0, 2)).toEqual([`memory/${day(211)}.md`, `memory/${day(210)}.md`]);
    expect(hits[1]!.snippet).toContain('allergic to cats');
    const terms = (hits[0]!.debug as { terms: { term: string; kind: string; idf: number }[] }).terms;
    const word = terms.find((x) => x.term === 'allergi')!;
    const variant = terms.find((x) => x.term === 'allerg')!;
    expect(variant.kind).toBe('variant');
    expect(variant.idf).toBeCloseTo(word.idf / 2, 3);
    // A short word has no family: "cat" does not bring "catalog".
    await w.put('knowledge/catalog.md', '# Catalog\n\nThe catalog of parts.\n');
    expect((await w.search('cat')).map((h) => h.path)).not.toContain('knowledge/catalog.md');
  });

  it('finds Chinese text (by character pairs) and code identifiers the full-text parser cannot split', async () => {
    await w.put(
      'knowledge/deploy.md',
      '# 部署\n\n我们的部署流程需要先运行冒烟测试，然后再发布。\n\n## Config\n\nCall `load_config()` before `parseConfigFile(path)`.\n',
    );
    expect((await w.search('部署流程'))[0]!.path).toBe('knowledge/deploy.md');
    // Not a substring of the text, but its pairs are.
    expect((await w.search('部署的流程'))[0]!.path).toBe('knowledge/deploy.md');
    expect((await w.search('冒烟测试'))[0]!.snippet).toContain('冒烟测试');
    expect((await w.search('parseConfigFile'))[0]!.path).toBe('knowledge/deploy.md');
    const ident = (await w.search('load_config'))[0]!;
    expect(ident).toMatchObject({ path: 'knowledge/deploy.md', start_line: 7, end_line: 7, heading: 'Config' });
  });

  it('recency only breaks ties: an old relevant line ranks above a recent, less relevant one', async () => {
    const fact = 'Leo: My sister Ines moved to Porto for her new job at the aquarium.';
    await w.put(`memory/${day(330)}.md`, chat(day(330), [...FILLER, fact, ...FILLER]));
    await w.put(`memory/${day(1)}.md`, chat(day(1), [...FILLER, 'Maya: The aquarium was crowded today.', ...FILLER]));
    const hits = await w.search('Where did Ines move for her job?', { debug: 'true' });
    expect(hits[0]!.path).toBe(`memory/${day(330)}.md`);
    expect(hits[0]!.snippet).toContain('moved to Porto');
    // Same text on two days: the newer first, by at most the bounded recency bonus.
    const same = 'Maya: The garden shed key hangs behind the kitchen door.';
    await w.put(`memory/${day(400)}.md`, chat(day(400), [...FILLER, same]));
    await w.put(`memory/${day(3)}.md`, chat(day(3), [...FILLER, same]));
    const pair = (await w.search('garden shed key', { path: 'memory/' })).filter((h) =>
      h.snippet.includes('garden shed'),
    );
    expect(pair.map((h) => h.date)).toEqual([day(3), day(400)]);
    expect(pair[0]!.score / pair[1]!.score).toBeLessThanOrEqual(1.1);
  });

  it('cuts long logs into small overlapping windows; a hit is the matching line and its neighbours, never repeated', async () => {
    const turns = Array.from({ length: 200 }, (_, i) =>
      i === 150 ? 'Maya: The spare key code for the bike lock is marmalade.' : FILLER[i % FILLER.length]!,
    );
    await w.put(`memory/${day(40)}.md`, chat(day(40), turns));
    const hits = await w.search('bike lock key code');
    expect(hits[0]!.path).toBe(`memory/${day(40)}.md`);
    expect(hits[0]!.snippet).toContain('marmalade');
    const line = 5 + 150;
    expect(hits[0]!.start_line).toBeGreaterThanOrEqual(line - 1);
    expect(hits[0]!.end_line).toBeLessThanOrEqual(line + 1);
    expect(hits[0]!.snippet.split('\n').length).toBeLessThanOrEqual(3);
    const rows = await t.database.db
      .select()
      .from(memoryChunks)
      .where(and(eq(memoryChunks.workspaceId, w.ws), eq(memoryChunks.path, `memory/${day(40)}.md`)));
    expect(rows.length).toBeGreaterThanOrEqual(99);
    expect(Math.max(...rows.map((r) => r.endLine - r.startLine))).toBeLessThanOrEqual(3);
    // Windows overlap, results do not: no two hits of a file share a line.
    const all = await w.search('marmalade key', { k: 50 });
    for (const a of all)
      for (const b of all)
        if (a !== b && a.path === b.path)
          expect(
            a.end_line < b.start_line || b.end_line < a.start_line,
            `${a.path}:${a.start_line}-${a.end_line} vs ${b.start_line}-${b.end_line}`,
          ).toBe(true);
  });

  it('shows every line a hit claims: turns next to each other are merged only while their snippet holds them all', async () => {
    // Twelve turns of ~150 characters that all match; every other one matches better. Each hit is
    // a better turn and the one after it, so hits touch, and a merge of several would claim lines
    // a snippet cut at its length does not show.
    const turns = Array.from({ length: 12 }, (_, i) =>
      `${i % 2 ? 'Leo' : 'Maya'}: quince ${i % 2 ? 'medlar ' : ''}turn ${i} and some words about the orchard`.padEnd(
        135,
        '.',
      ),
    );
    const path = `memory/${day(45)}.md`;
    await w.put(path, chat(day(45), turns));
    const file = chat(day(45), turns).split('\n');
    const hits = (await w.search('quince medlar', { k: 50 })).filter((h) => h.path === path);
    expect(hits.length).toBeGreaterThan(1);
    for (const h of hits) {
      expect(h.snippet.length).toBeLessThanOrEqual(2 * SNIPPET_CHARS);
      for (let line = h.start_line; line <= h.end_line; line++)
        if (file[line - 1]!.trim())
          expect(h.snippet, `${path}:${line} is in ${h.start_line}-${h.end_line}`).toContain(file[line - 1]!.trim());
    }
    // Two hits merged: one snippet longer than a single hit's.
    expect(Math.max(...hits.map((h) => h.snippet.length))).toBeGreaterThan(SNIPPET_CHARS);
  });

  it('bounds what a hostile file costs: one huge line gives a short snippet', async () => {
    await w.put('knowledge/huge.md', `# Huge\n\nzebrafish ${'lorem ipsum '.repeat(60_000)}\n`);
    const [hit] = await w.search('zebrafish');
    expect(hit).toMatchObject({ path: 'knowledge/huge.md', start_line: 3, end_line: 3 });
    expect(hit!.snippet.length).toBeLessThanOrEqual(SNIPPET_CHARS);
    expect(hit!.snippet.startsWith('zebrafish lorem')).toBe(true);
  });

  it('filters by path prefix and by the dates of dated logs', async () => {
    const everywhere = 'The lighthouse inspection is booked.';
    await w.put('knowledge/lighthouse.md', `# Lighthouse\n\n${everywhere}\n`);
    await w.put(`memory/${day(100)}.md`, chat(day(100), [`Leo: ${everywhere}`]));
    await w.put(`memory/${day(10)}.md`, chat(day(10), [`Maya: ${everywhere}`]));
    const paths = async (params: Record<string, string>) =>
      (await w.search('lighthouse inspection', params)).map((h) => h.path);
    expect(await paths({ path: 'knowledge/' })).toEqual(['knowledge/lighthouse.md']);
    expect(new Set(await paths({ path: 'memory/' }))).toEqual(
      new Set([`memory/${day(100)}.md`, `memory/${day(10)}.md`]),
    );
    expect(await paths({ since: day(50) })).toEqual([`memory/${day(10)}.md`]);
    expect(await paths({ until: day(50) })).toEqual([`memory/${day(100)}.md`]);
    expect(await paths({ since: day(101), until: day(99) })).toEqual([`memory/${day(100)}.md`]);
    // An explicit path still finds the built-in skills.
    expect((await w.search('consolidate budget', { path: 'skills/builtin/' }))[0]!.path).toBe(
      'skills/builtin/memory-keeping/SKILL.md',
    );
  });

  it('pages with a cursor: the pages together are the first page of a larger k, with no repeats', async () => {
    const whole = await w.search('Maya Leo weekend weather', { k: 6 });
    expect(whole.length).toBe(6);
    const seen: Hit[] = [];
    let cursor: string | null = null;
    for (let page = 0; page < 3; page++) {
      const r = await w.query('Maya Leo weekend weather', { k: 2, ...(cursor ? { cursor } : {}) });
      expect(r.status).toBe(200);
      seen.push(...r.body.data);
      expect(r.body.has_more).toBe(true);
      cursor = r.body.next_cursor;
    }
    expect(seen.map((h) => [h.path, h.start_line])).toEqual(whole.map((h) => [h.path, h.start_line]));
  });

  it('explains its ranking with debug=true, and only then', async () => {
    const [plain] = await w.search('staging database');
    expect(plain!.debug).toBeUndefined();
    const [hit] = await w.search('staging database', { debug: 'true' });
    expect(hit!.debug).toMatchObject({ lexical_rank: 1, vector_rank: null, builtin: 1, recency: 1 });
    expect((hit!.debug as { bm25: number }).bm25).toBeGreaterThan(0);
    expect((hit!.debug as { terms: { term: string }[] }).terms.map((x) => x.term).sort()).toEqual(['databas', 'stage']);
  });

  it('scores with BM25 in the database: term frequency saturates, longer chunks weigh less, rare terms more', async () => {
    const debugOf = async (q: string, path: string) => {
      const [hit] = await w.search(q, { path, debug: 'true' });
      return hit!.debug as { bm25: number; terms: { term: string; idf: number }[] };
    };
    const bm25 = async (q: string, path: string) => (await debugOf(q, path)).bm25;
    const filler = 'The committee met on a Tuesday and went through the agenda item by item without hurry.';
    await w.put('knowledge/bm25/once.md', 'Our mascot is a quokka.\n');
    await w.put('knowledge/bm25/twice.md', 'Our mascot is a quokka, a quokka.\n');
    await w.put('knowledge/bm25/many.md', `Our mascot is ${'a quokka, '.repeat(30)}truly.\n`);
    await w.put('knowledge/bm25/long.md', `Our mascot is a quokka. ${filler.repeat(6)}\n`);
    await w.put('knowledge/bm25/rare.md', 'Our mascot is a quokka and our motto is zyzzogeton.\n');
    const once = await bm25('quokka', 'knowledge/bm25/once.md');
    const twice = await bm25('quokka', 'knowledge/bm25/twice.md');
    const many = await debugOf('quokka', 'knowledge/bm25/many.md');
    expect(once).toBeGreaterThan(0);
    expect(twice).toBeGreaterThan(once);
    expect(twice).toBeLessThan(2 * once);
    // Robertson–Spärck Jones IDF, never negative. However often a term repeats, its weight stays
    // below idf · (k1 + 1).
    expect(many.terms[0]!.idf).toBeGreaterThan(0);
    expect(many.bm25).toBeLessThan(many.terms[0]!.idf * 2.2);
    expect(await bm25('quokka', 'knowledge/bm25/long.md')).toBeLessThan(once);
    // "zyzzogeton" is in one chunk, "mascot" in five: the rare word weighs more in the same chunk.
    expect(await bm25('zyzzogeton', 'knowledge/bm25/rare.md')).toBeGreaterThan(
      await bm25('mascot', 'knowledge/bm25/rare.md'),
    );
  });

  it('answers bad parameters with 400 and the error envelope', async () => {
    const other = (await w.query('lighthouse', { k: 1 })).body.next_cursor as string;
    for (const [q, params, field] of [
      [' ', {}, 'q'],
      ['x', { k: 0 }, 'k'],
      ['x', { k: 51 }, 'k'],
      ['x', { since: '2026-02-30' }, 'since'],
      ['x', { until: 'yesterday' }, 'until'],
      ['x', { since: '2026-05-02', until: '2026-05-01' }, 'since'],
      ['x', { path: '../etc' }, 'path'],
      ['x', { path: '/memory' }, 'path'],
      ['x', { debug: 'yes' }, 'debug'],
      ['x', { cursor: 'not-a-cursor' }, 'cursor'],
      ['other query', { cursor: other }, 'cursor'],
    ] as const) {
      const r = await w.query(q, params as Record<string, string>);
      expect(r.status, `${q} ${JSON.stringify(params)}`).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
      expect(JSON.stringify(r.body.error), `${q} ${JSON.stringify(params)}`).toContain(field);
    }
  });

  it('follows deletes and reverts: chunks of a removed file disappear and come back', async () => {
    await w.put('knowledge/temp.md', '# Temporary\n\nThe zebra protocol is deprecated.\n');
    expect((await w.search('zebra protocol')).map((h) => h.path)).toContain('knowledge/temp.md');
    const del = await t.call('DELETE', `/v1/workspaces/${w.ws}/files?path=knowledge/temp.md`, { key: w.team.key });
    expect(del.body.commit.paths).toEqual(['knowledge/temp.md']);
    expect((await w.search('zebra protocol')).map((h) => h.path)).not.toContain('knowledge/temp.md');
    await t.call('POST', `/v1/workspaces/${w.ws}/commits/${del.body.commit.sha}/revert`, { key: w.team.key });
    expect((await w.search('zebra protocol')).map((h) => h.path)).toContain('knowledge/temp.md');
  });

  it('keeps the statistics BM25 needs (chunks, length, document frequencies) exact through inserts and deletes', async () => {
    const [stats] = await t.database.db.select().from(memoryIndex).where(eq(memoryIndex.workspaceId, w.ws));
    const [actual] = rowsOf<{ n: number; l: number }>(
      await t.database.db.execute(
        sql`select count(*)::int as n, coalesce(sum(len), 0)::int as l from memory_chunks where workspace_id = ${w.ws}`,
      ),
    );
    expect(stats).toMatchObject({ chunks: actual!.n, totalLen: actual!.l, version: INDEX_VERSION });
    // Each term's document frequency, as the triggers kept it, against a recount (zero rows aside).
    const wrong = rowsOf<{ term: string }>(
      await t.database.db.execute(sql`with real as (select k as term, count(*)::int as df from memory_chunks c, jsonb_object_keys(c.tf) k where c.workspace_id = ${w.ws} group by k),
        kept as (select term, df from memory_terms where workspace_id = ${w.ws} and df <> 0)
        select coalesce(r.term, k.term) as term from real r full join kept k on k.term = r.term where r.df is distinct from k.df`),
    );
    expect(wrong).toEqual([]);
    const [{ terms }] = rowsOf<{ terms: number }>(
      await t.database.db.execute(
        sql`select count(*)::int as terms from memory_terms where workspace_id = ${w.ws} and df > 0`,
      ),
    ) as [{ terms: number }];
    expect(terms).toBeGreaterThan(50);
  });
});

describe('a year of daily logs: the answer in one old line comes first, not the built-ins or the template', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await createTestApp({ driver: 'pglite' });
  });
  afterAll(() => t.close());

  it('finds the line from months ago that answers the question', async () => {
    const w = await memoryWorkspace(t, 'year');
    const answerDay = day(290);
    const year: Record<string, string> = {};
    for (let d = 360; d >= 0; d -= 6) {
      const turns = FILLER.map((_l, i) => FILLER[(i + d) % FILLER.length]!);
      if (d === 288)
        turns.splice(
          4,
          0,
          'Leo: Did you end up getting the puppy?',
          'Maya: Yes! We adopted him on Saturday and named him Biscuit.',
        );
      year[`memory/${day(d)}.md`] = chat(day(d), turns);
    }
    await w.putAll(year);
    expect(answerDay).toBe(day(290));
    const hits = await w.search('When did Maya adopt the puppy and what did she name it?');
    expect(hits[0]!.path).toBe(`memory/${day(288)}.md`);
    expect(hits[0]!.snippet).toContain('named him Biscuit');
    expect(hits[0]!.date).toBe(day(288));
    const first = hits.findIndex((h) => h.path.startsWith('skills/') || h.path === 'knowledge/index.md');
    expect(first === -1 || first > 0).toBe(true);
  });
});

describe('a word in every chunk makes no match on its own', () => {
  let fake: FakeOpenAI;
  let t: TestApp;
  /** The query's vector fails while this is set: the search answers by words alone. */
  let wordsAlone = false;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
    const endpoint = openAiEmbedder({ model: 'fake-embed', baseURL: fake.url, apiKey: 'test' });
    t = await createTestApp({
      driver: 'pglite',
      embedder: {
        model: endpoint.model,
        embed: (texts) => endpoint.embed(texts),
        embedQuery: async (q) => {
          if (wordsAlone) throw new Error('the embeddings endpoint is down');
          return (await endpoint.embed([q]))[0]!;
        },
      },
    });
  });
  afterAll(async () => {
    await t.close();
    await fake.close();
  });

  it('with vectors to fuse, a chunk that holds only a name said in every line takes no place by words; by words alone it still does', async () => {
    const w = await memoryWorkspace(t, 'common-words');
    // Three months of a chat where Maya speaks in every window: "maya" is in
    // far more than a fifth of the workspace's chunks.
    const days: Record<string, string> = {};
    for (let d = 90; d >= 0; d -= 3) days[`memory/${day(d)}.md`] = chat(day(d), FILLER);
    await w.putAll(days);
    await w.put('knowledge/work.md', '# Work\n\nJonas was promoted to ward manager in June.\n');
    // Found by words: a words' score (the words' list, or a chunk the vectors found that holds them).
    const byWords = (hits: MemoryHit[]) =>
      hits.filter((h) => (h.debug as { bm25: number }).bm25 > 0).map((h) => h.path);
    const hits = await w.search('What was Maya promoted to?', { debug: 'true' });
    expect(hits[0]!.path).toBe('knowledge/work.md');
    const terms = (hits[0]!.debug as { terms: { term: string; df: number }[] }).terms;
    expect(terms.find((x) => x.term === 'maya')!.df).toBeGreaterThan(50);
    // By words, only the chunk with the rarer word (before: seven that only say "Maya" too, ranked
    // by how often they said it, ahead of the vectors' own).
    expect(byWords(hits)).toEqual(['knowledge/work.md']);
    // Asked for by the name alone, the name's chunks are found by it.
    const named = await w.search('Maya', { debug: 'true' });
    expect(named).toHaveLength(8);
    for (const h of named) expect(h.snippet).toContain('Maya');
    expect(byWords(named)).toHaveLength(8);
    // A chunk the vectors found past the words' list gets the words' score the database gives it
    // when the list is deep enough to hold it.
    type Debug = { bm25: number; lexical_rank: number | null; chunk: { start_line: number } };
    const key = (h: MemoryHit) => `${h.path}:${(h.debug as Debug).chunk.start_line}`;
    const vectorsOnly = named.filter((h) => (h.debug as Debug).lexical_rank === null);
    expect(vectorsOnly.length).toBeGreaterThan(0);
    const deep = new Map((await w.search('Maya', { debug: 'true', k: '50' })).map((h) => [key(h), h.debug as Debug]));
    let compared = 0;
    for (const h of vectorsOnly) {
      const there = deep.get(key(h));
      if (!there || there.lexical_rank === null) continue;
      expect((h.debug as Debug).bm25).toBeCloseTo(there.bm25, 3);
      compared++;
    }
    expect(compared).toBeGreaterThan(0);
    // With no vector for the query, the words' list is all there is: it keeps them.
    wordsAlone = true;
    const alone = await w.search('What was Maya promoted to?', { debug: 'true' });
    expect(alone[0]!.path).toBe('knowledge/work.md');
    expect(byWords(alone).length).toBe(8);
  });
});

describe('the same answers on PGlite and on Postgres', () => {
  it('ranks a workspace with the same files identically on both databases', async () => {
    const results: Record<Driver, unknown> = { postgres: null, pglite: null };
    // One clock for both, the app's: recency moves with every second, and the two apps start a
    // minute apart (scores are shown to four places, so a tiny move crossed a rounding boundary
    // now and then).
    const now = Date.parse('2026-03-01T00:00:00Z');
    for (const driver of DRIVERS) {
      const t = await createTestApp({ driver, now: () => now });
      try {
        const w = await memoryWorkspace(t, `same-${driver}`);
        for (let d = 0; d < 6; d++)
          await w.put(
            `memory/2026-0${d + 1}-15.md`,
            chat(
              `2026-0${d + 1}-15`,
              FILLER.map((_l, i) => FILLER[(i * (d + 1)) % FILLER.length]!),
            ),
          );
        await w.put(
          'knowledge/trains.md',
          '# Trains\n\nThe trains to work are slow in winter; take the 7:40 `rb_12` instead.\n',
        );
        const out = [];
        for (const q of ['slow trains to work', 'weekend cooking at home', 'rb_12', 'weather', '部署'])
          out.push(await w.search(q, { k: 10, debug: 'true' }));
        results[driver] = out;
      } finally {
        await t.close();
      }
    }
    expect(results.pglite).toEqual(results.postgres);
    // The recency shown is the app clock's, not the system's.
    const hits = (results.postgres as SearchHit[][]).flat();
    const jan = hits.find((h) => h.path === 'memory/2026-01-15.md');
    expect(jan?.debug?.recency).toBe(Math.round(recencyFactor('2026-01-15', new Date(now)) * 10_000) / 10_000);
  });
});

describe.each(DRIVERS)('memory search with an embeddings endpoint on %s', (driver) => {
  let fake: FakeOpenAI;
  let t: TestApp;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
    t = await createTestApp({
      driver,
      embedder: openAiEmbedder({ model: 'fake-embed', baseURL: fake.url, apiKey: 'test' }),
    });
  });
  afterAll(async () => {
    await t.close();
    await fake.close();
  });

  it('fuses meaning with words: a synonym with no shared word is found through the vectors', async () => {
    const w = await memoryWorkspace(t, 'vectors');
    await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
    await w.put('knowledge/kitchen.md', '# Kitchen\n\nThe red kettle is broken.\n');
    expect(fake.requests.some((r) => r.path === '/v1/embeddings' && r.body.model === 'fake-embed')).toBe(true);
    const hits = await w.search('automobile', { debug: 'true' });
    expect(hits[0]).toMatchObject({ path: 'knowledge/garage.md' });
    expect(hits[0]!.debug).toMatchObject({ lexical_rank: null, vector_rank: 1 });
    // Found by words and by meaning beats found by words alone (the scores fused).
    const both = await w.search('red car', { debug: 'true' });
    expect(both[0]).toMatchObject({ path: 'knowledge/garage.md', debug: { lexical_rank: 1, vector_rank: 1 } });
    // A deep page fuses the nearest VECTOR_DEPTH by meaning, not as many as it ranks by words.
    await w.put(
      `memory/${day(3)}.md`,
      chat(
        day(3),
        Array.from({ length: 90 }, (_, i) => `${i % 2 ? 'Maya' : 'Leo'}: the car park on level ${i} was red and full`),
      ),
    );
    const withVectors = rowsOf<{ n: number }>(
      await t.database.db.execute(
        sql`select count(*)::int as n from memory_chunks where workspace_id = ${w.ws} and embedding is not null`,
      ),
    )[0]!.n;
    expect(withVectors).toBeGreaterThan(VECTOR_DEPTH);
    const ranks = (await w.search('red car', { k: 50, debug: 'true' })).map((h) => h.debug!.vector_rank);
    expect(Math.max(...ranks.filter((r) => r !== null))).toBeLessThanOrEqual(VECTOR_DEPTH);
    // pgvector ranks in the database where it is installed: PGlite always loads it; a Postgres
    // server has it when its package is there (else the vectors are compared in the API).
    const [avail] = rowsOf<{ ok: boolean }>(
      await t.database.db.execute(
        sql`select exists(select 1 from pg_available_extensions where name = 'vector') as ok`,
      ),
    );
    expect(await hasPgvector(t.database.db)).toBe(driver === 'pglite' || avail!.ok);
    if (driver === 'pglite') expect(avail!.ok).toBe(true);
  });

  it('asks the endpoint for a query’s vector once per search, and not at all for a query the validation refuses', async () => {
    const w = await memoryWorkspace(t, 'early-vector');
    await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
    const asked = (text: string) =>
      fake.requests.filter((r) => r.path === '/v1/embeddings' && JSON.stringify(r.body.input).includes(text)).length;
    // The route starts the vector while it looks the workspace up; the search takes that one.
    expect((await w.search('tyres for the red car'))[0]).toMatchObject({ path: 'knowledge/garage.md' });
    expect(asked('tyres for the red car')).toBe(1);
    const long = `tyres ${'x'.repeat(500)}`;
    expect((await w.query(long)).status).toBe(400);
    expect(asked(long.slice(0, 100))).toBe(0);
  });

  it('reads a large workspace’s vectors through the index, where the planner would compare them all; a small part of a large table is left to the planner; the settings stay the search’s own', async () => {
    const big = await memoryWorkspace(t, 'index-big');
    const small = await memoryWorkspace(t, 'index-small');
    const db = t.database.db;
    // Migration 0022 makes the search's vector functions where pgvector 0.8 or later is: PGlite
    // always. A Postgres server without pgvector (this machine's) compares the vectors exactly,
    // in the API: the other tests of this file search it so.
    const made = rowsOf<{ ok: boolean }>(
      await db.execute(sql`select to_regproc('memory_vector_plan') is not null as ok`),
    )[0]!.ok;
    expect(made).toBe(await hasPgvector(db));
    if (driver === 'pglite') expect(made).toBe(true);
    if (!made) return;
    const counts = async (ws: string) =>
      (await db.select({ chunks: memoryIndex.chunks }).from(memoryIndex).where(eq(memoryIndex.workspaceId, ws)))[0]!
        .chunks;
    const before = [await counts(big.ws), await counts(small.ws)] as const;
    // The indexer's counts, set here to stand for workspaces of those sizes.
    const setChunks = (ws: string, chunks: number) =>
      db.update(memoryIndex).set({ chunks }).where(eq(memoryIndex.workspaceId, ws));
    const plan = async (ws: string) =>
      rowsOf<{ seqscan: string; ef_search: number }>(
        await db.execute(sql`select * from memory_vector_plan(${ws}, 100)`),
      )[0]!;
    const settings = async (tx: typeof db) =>
      rowsOf<{ seq: string; sort: string; scan: string | null }>(
        await tx.execute(sql`select current_setting('enable_seqscan') as seq, current_setting('enable_sort') as sort,
          current_setting('hnsw.iterative_scan', true) as scan`),
      )[0]!;
    const vec = `[${Array.from({ length: 512 }, (_, i) => ((i % 7) - 3) / 10).join(',')}]`;
    try {
      await setChunks(big.ws, 3000);
      await setChunks(small.ws, 10);
      expect(await plan(big.ws)).toEqual({ seqscan: 'off', ef_search: 100 });
      expect(await plan(small.ws)).toMatchObject({ seqscan: 'on' });
      // 3,000 chunks among 103,000: under a twentieth of the table, the planner chooses.
      await setChunks(small.ws, 100_000);
      expect(await plan(big.ws)).toMatchObject({ seqscan: 'on' });
      expect(await plan(small.ws)).toEqual({ seqscan: 'off', ef_search: 100 });
      // The search's settings end with it, even inside a longer transaction.
      const after = await db.transaction(async (t) => {
        const tx = t as unknown as typeof db;
        await tx.execute(
          sql`select count(*) from memory_nearest_512(${small.ws}, ${vec}::vector(512), 10, null, null, null, 100)`,
        );
        return settings(tx);
      });
      expect(after).toEqual({ ...(await settings(db)), seq: 'on', sort: 'on' });
      expect(after.scan).not.toBe('relaxed_order');
    } finally {
      await setChunks(big.ws, before[0]);
      await setChunks(small.ws, before[1]);
    }
  });

  it('re-embeds, at the next start, a workspace another embeddings model indexed', async () => {
    const w = await memoryWorkspace(t, 'other-model');
    await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres.\n');
    await w.put(`memory/${day(2)}.md`, chat(day(2), FILLER));
    // As a server with another model (or none) left it.
    await t.database.db.update(memoryChunks).set({ embedding: null }).where(eq(memoryChunks.workspaceId, w.ws));
    await t.database.db.update(memoryIndex).set({ embedModel: 'old-model' }).where(eq(memoryIndex.workspaceId, w.ws));
    expect((await w.search('automobile')).map((h) => h.path)).not.toContain('knowledge/garage.md');
    await t.workspaces.reindexStale();
    const [stats] = await t.database.db.select().from(memoryIndex).where(eq(memoryIndex.workspaceId, w.ws));
    expect(stats!.embedModel).toBe('fake-embed');
    // The re-index writes the chunks and returns; their vectors are made after it, in the background.
    await t.workspaces.vectorsSettled();
    expect(await w.withoutVector()).toBe(0);
    expect((await w.search('automobile'))[0]!.path).toBe('knowledge/garage.md');
    // With vectors, a log's windows are of two turns.
    expect(await longestWindow(t, w.ws, `memory/${day(2)}.md`)).toBe(WINDOWS.lines.size);
  });
});

/** The most lines a chunk of this file spans (its logs have no blank lines between turns). */
async function longestWindow(t: TestApp, ws: string, path: string): Promise<number> {
  const rows = await t.database.db
    .select({ start: memoryChunks.startLine, end: memoryChunks.endLine })
    .from(memoryChunks)
    .where(and(eq(memoryChunks.workspaceId, ws), eq(memoryChunks.path, path)));
  expect(rows.length).toBeGreaterThan(1);
  return Math.max(...rows.map((r) => r.end - r.start + 1));
}

describe('re-indexing after the chunking or ranking changed', () => {
  it('rebuilds, in the background, the workspaces an older version indexed; search answers meanwhile', async () => {
    const t = await createTestApp();
    try {
      const w = await memoryWorkspace(t, 'reindex');
      await w.put(`memory/${day(5)}.md`, chat(day(5), [...FILLER, 'Maya: The boiler service is on the ninth.']));
      const before = await w.search('boiler service');
      // As an older version left it: one chunk per file (its whole text) and version 0.
      await t.database.db.delete(memoryChunks).where(eq(memoryChunks.workspaceId, w.ws));
      await t.database.db.execute(sql`insert into memory_chunks (team_id, workspace_id, path, start_line, end_line, heading, content, content_hash, search_text, len)
        values (${w.team.id}, ${w.ws}, ${`memory/${day(5)}.md`}, 1, 15, null, 'old chunk: boiler service', 'x', 'old chunk: boiler service', 4)`);
      await t.database.db.update(memoryIndex).set({ version: 0 }).where(eq(memoryIndex.workspaceId, w.ws));
      expect((await w.search('boiler service'))[0]!.snippet).toBe('old chunk: boiler service');

      const job = t.workspaces.reindexStale();
      await job;
      expect(await w.search('boiler service')).toEqual(before);
      const [stats] = await t.database.db.select().from(memoryIndex).where(eq(memoryIndex.workspaceId, w.ws));
      expect(stats!.version).toBe(INDEX_VERSION);
      expect(stats!.chunks).toBeGreaterThan(1);
      // By words alone (this app has no embeddings model), a log's windows are the wider ones.
      expect(await longestWindow(t, w.ws, `memory/${day(5)}.md`)).toBe(WINDOWS.linesByWords.size);
      // Nothing left to do: a second run re-indexes nothing.
      const log = t.logs.length;
      await t.workspaces.reindexStale();
      expect(t.logs.slice(log).some((l) => String(l.msg).includes('re-indexing workspaces'))).toBe(false);
    } finally {
      await t.close();
    }
  });
});

describe('start-up repair after a crash', () => {
  it('removes a stale index lock, commits stranded changes as the system, and mirrors commits the table missed', async () => {
    const t = await createTestApp();
    try {
      const team = await t.team('crash');
      const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'c' } })).body.id;
      const dir = t.workspaces.dirOf(ws);
      const git = (...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });
      // A commit that reached git but not the database (crash between the two)...
      writeFileSync(join(dir, 'MEMORY.md'), '# Core memory\n\n- committed before the crash\n');
      git('add', '-A');
      git(
        '-c',
        'user.name=k',
        '-c',
        'user.email=k@k',
        'commit',
        '-qm',
        'Agent step',
        '-m',
        'Kiln-Kind: memory\nKiln-Author: agent\nKiln-Run: run_crash',
      );
      // ...then a write that never got committed, and git's lock left behind.
      writeFileSync(join(dir, 'knowledge/stranded.md'), '# Stranded\n\nwritten just before the crash\n');
      writeFileSync(join(dir, '.git/index.lock'), '');

      const { repaired } = await t.workspaces.repairAll();
      expect(repaired).toBe(1);
      expect(git('status', '--porcelain')).toBe('');
      const log = await t.call('GET', `/v1/workspaces/${ws}/commits`, { key: team.key });
      expect(log.body.data[0]).toMatchObject({
        author: 'system',
        summary: 'Recover uncommitted changes found at start-up',
        paths: ['knowledge/stranded.md'],
      });
      expect(log.body.data[1]).toMatchObject({ author: 'agent', kind: 'memory', run_id: 'run_crash' });
      expect((await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body.head).toBe(
        git('rev-parse', 'HEAD').trim(),
      );
      const hits = await t.call('GET', `/v1/workspaces/${ws}/memory/search?q=crash`, { key: team.key });
      expect(hits.body.data.map((h: { path: string }) => h.path)).toEqual(
        expect.arrayContaining(['MEMORY.md', 'knowledge/stranded.md']),
      );
      expect((await t.workspaces.repairAll()).repaired).toBe(0);
      git('fsck', '--no-progress');
    } finally {
      await t.close();
    }
  });
});

describe('memory search with the built-in sentence encoder (KILN_EMBEDDINGS_MODEL=builtin)', () => {
  let t: TestApp;
  beforeAll(async () => {
    // The default (the test apps say none unless asked, see tests/support/app.ts).
    expect(loadConfig({}).openai.embeddingsModel).toBe('builtin');
    t = await createTestApp({ driver: 'pglite', env: { KILN_EMBEDDINGS_MODEL: 'builtin' } });
    // Started by the app's start: the encoder's model loaded, the first search waits for no load
    // (on a busy host the load outlasted the search's 2 s wait, and it answered by words alone).
    await t.workspaces.warmSearch();
  });
  afterAll(() => t?.close());

  const chunksOf = async (ws: string, path: string) =>
    (
      await t.database.db
        .select({ id: memoryChunks.id, start: memoryChunks.startLine, embedding: memoryChunks.embedding })
        .from(memoryChunks)
        .where(and(eq(memoryChunks.workspaceId, ws), eq(memoryChunks.path, path)))
    ).sort((a, b) => a.start - b.start);

  it('finds by meaning with no shared word; an appended log keeps the vectors of the chunks it did not change', async () => {
    const w = await memoryWorkspace(t, 'builtin-vectors');
    const turns = [
      'Jonas: I have news... I proposed to Clara this morning, on the beach at Cascais.',
      'Maya: No way! What did she say?',
      'Jonas: She said yes!',
      ...FILLER,
    ];
    await w.put('memory/2026-05-11.md', chat('2026-05-11', turns));
    await w.put(
      'memory/2026-05-12.md',
      chat('2026-05-12', ['Maya: The forecast says rain all week.', 'Jonas: Bring an umbrella then.']),
    );
    const hits = await w.search('wedding engagement', { path: 'memory/', debug: 'true' });
    expect(t.logs.filter((l) => String(l.msg).includes('answered by words alone'))).toEqual([]);
    // Windows of two turns: the nearest is the answer to the news ("She said yes!"), the next the
    // news itself; both found by meaning alone, first and second.
    expect(hits[0]).toMatchObject({ path: 'memory/2026-05-11.md', debug: { lexical_rank: null, vector_rank: 1 } });
    const news = hits.findIndex((h) => h.snippet.includes('proposed to Clara'));
    expect(news).toBeGreaterThanOrEqual(0);
    expect(news).toBeLessThanOrEqual(1);
    expect(hits[news]).toMatchObject({ path: 'memory/2026-05-11.md', debug: { lexical_rank: null } });
    expect((hits[news]!.debug as { vector_rank: number }).vector_rank).toBeLessThanOrEqual(2);
    const [stats] = await t.database.db.select().from(memoryIndex).where(eq(memoryIndex.workspaceId, w.ws));
    expect(stats!.embedModel).toBe(BUILTIN_EMBEDDINGS);
    // The encoder's vectors have their approximate index (migration 0017), and the planner can use
    // it for a search's query (forced here: a table this small is read whole otherwise).
    const plan = await t.database.db.transaction(async (tx) => {
      await tx.execute(sql`set local enable_seqscan = off`);
      const vec = `[${Array.from({ length: 512 }, () => 0.1).join(',')}]`;
      return rowsOf<{ 'QUERY PLAN': string }>(
        await tx.execute(sql`explain select id from memory_chunks c where array_length(c.embedding, 1) = 512
          order by c.embedding::vector(512) <=> ${vec}::vector(512) limit 10`),
      )
        .map((r) => r['QUERY PLAN'])
        .join('\n');
    });
    expect(plan).toContain('memory_chunks_vector_512');

    // A marker in the first chunk's vector: kept if that chunk is not embedded again.
    const before = await chunksOf(w.ws, 'memory/2026-05-11.md');
    expect(before.length).toBeGreaterThan(2);
    expect(before.every((c) => c.embedding?.length === 512)).toBe(true);
    const marker = Array.from({ length: 512 }, () => 0.25);
    await t.database.db.update(memoryChunks).set({ embedding: marker }).where(eq(memoryChunks.id, before[0]!.id));
    await w.put('memory/2026-05-11.md', chat('2026-05-11', [...turns, 'Maya: Congratulations to you both!']));
    const after = await chunksOf(w.ws, 'memory/2026-05-11.md');
    expect(after.length).toBeGreaterThanOrEqual(before.length);
    expect(after[0]!.embedding).toEqual(marker);
    // The new last chunk was embedded (a real vector, not the marker).
    expect(after.at(-1)!.embedding).toHaveLength(512);
    expect(after.at(-1)!.embedding).not.toEqual(marker);
  });

  it("gives each of the words' candidates its own similarity, read where the words found it; a chunk changed since gets none", async () => {
    const w = await memoryWorkspace(t, 'builtin-candidates');
    // More chunks than the nearest a search reads (VECTOR_DEPTH): some of the words' candidates are
    // not among them, and their similarity is read for them alone.
    for (let d = 10; d < 14; d++) await w.put(`memory/2026-05-${d}.md`, chat(`2026-05-${d}`, FILLER));
    const garage = ['brake pads', 'engine oil', 'gearbox', 'windscreen wipers', 'exhaust', 'clutch', 'headlights'];
    await w.put(
      'memory/2026-05-20.md',
      chat(
        '2026-05-20',
        Array.from(
          { length: 42 },
          (_, i) => `Leo: The mechanic checked the ${garage[i % garage.length]} of the van, visit ${i + 1}.`,
        ),
      ),
    );
    await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres before the winter.\n');
    await t.workspaces.vectorsSettled();
    const hits = await w.search('tyres for the red car, whatever the weather', { k: 50, debug: 'true' });
    type Debug = { lexical_rank: number | null; vector_rank: number | null; vector_similarity: number | null };
    const lexical = hits.map((h) => h.debug as Debug).filter((d) => d.lexical_rank !== null);
    expect(lexical.filter((d) => d.vector_rank === null).length).toBeGreaterThan(0);
    for (const d of lexical) expect(d.vector_similarity).not.toBeNull();

    const db = t.database.db;
    const chunks = rowsOf<{ id: number; ctid: string; embedding: number[] }>(
      await db.execute(
        sql`select id, ctid::text as ctid, embedding from memory_chunks where workspace_id = ${w.ws} order by id`,
      ),
    );
    expect(chunks.length).toBeGreaterThan(3);
    const qv = chunks[0]!.embedding.map(Number);
    const exact = new Map(
      rowsOf<{ id: number; s: number }>(
        await db.execute(sql`select id, (1 - (embedding::vector(512) <=> ${`[${qv.join(',')}]`}::vector(512)))::float8 as s
          from memory_chunks where workspace_id = ${w.ws}`),
      ).map((r) => [Number(r.id), Number(r.s)]),
    );
    const { similarity } = await nearest(db, w.ws, qv, 3, {}, chunks, []);
    expect([...similarity.keys()].sort((a, b) => a - b)).toEqual(chunks.map((c) => Number(c.id)));
    // The query goes as whole numbers (queryVectorParam): single precision's rounding, no more.
    for (const [id, s] of similarity) expect(s).toBeCloseTo(exact.get(id)!, 5);
    // A chunk written again since the words read it: its old address holds no live row.
    const moved = chunks[1]!;
    await db.execute(sql`update memory_chunks set heading = heading where id = ${moved.id}`);
    const stale = await nearest(db, w.ws, qv, 3, {}, [moved], []);
    expect(stale.similarity.has(Number(moved.id))).toBe(false);
    const [now] = rowsOf<{ ctid: string }>(
      await db.execute(sql`select ctid::text as ctid from memory_chunks where id = ${moved.id}`),
    );
    expect(now!.ctid).not.toBe(moved.ctid);
    const fresh = await nearest(db, w.ws, qv, 3, {}, [{ id: moved.id, ctid: now!.ctid }], []);
    expect(fresh.similarity.get(Number(moved.id))).toBeCloseTo(exact.get(Number(moved.id))!, 5);

    // Of a nearest chunk's term frequencies, only the query's come back (a file can give a chunk thousands).
    const [page] = rowsOf<{ id: number; embedding: number[]; tf: Record<string, number> | string }>(
      await db.execute(
        sql`select id, embedding, tf from memory_chunks where workspace_id = ${w.ws} and path = 'knowledge/garage.md'`,
      ),
    );
    const stored = (typeof page!.tf === 'string' ? JSON.parse(page!.tf) : page!.tf) as Record<string, number>;
    expect(Object.keys(stored).length).toBeGreaterThan(3);
    const { near } = await nearest(db, w.ws, page!.embedding.map(Number), 3, {}, [], ['tyre', 'winter', 'absent']);
    const own = near.find((n) => Number(n.c.id) === Number(page!.id))!;
    const tf = (typeof own.words.tf === 'string' ? JSON.parse(own.words.tf) : own.words.tf) as Record<string, number>;
    expect(tf).toEqual({ tyre: stored.tyre, winter: stored.winter });
    for (const n of near) {
      const keys = Object.keys(typeof n.words.tf === 'string' ? JSON.parse(n.words.tf) : n.words.tf);
      expect(keys.every((k) => ['tyre', 'winter', 'absent'].includes(k))).toBe(true);
    }
  });

  it('reads the nearest vectors in one statement, through the index, with the filters a search gives', async () => {
    const w = await memoryWorkspace(t, 'builtin-nearest');
    await w.put('memory/2026-05-11.md', chat('2026-05-11', FILLER));
    await w.put('memory/2026-06-02.md', chat('2026-06-02', [...FILLER].reverse()));
    await w.put('knowledge/garage.md', '# Garage\n\nThe red car needs new tyres before the winter.\n');
    await t.workspaces.vectorsSettled();
    const db = t.database.db;
    // Standing for a workspace of 3,000 chunks: read through the index whatever the planner thinks.
    await db.update(memoryIndex).set({ chunks: 3000 }).where(eq(memoryIndex.workspaceId, w.ws));
    const [one] = await chunksOf(w.ws, 'knowledge/garage.md');
    const vec = `[${one!.embedding!.join(',')}]`;
    // Exact: every vector compared (the planner would read the approximate index here, at its
    // default 40 candidates of all the workspaces' vectors, past what one small workspace has).
    const exact = await db.transaction(async (tx) => {
      await tx.execute(sql`set local enable_indexscan = off`);
      return rowsOf<{ id: number }>(
        await tx.execute(sql`select id from memory_chunks where workspace_id = ${w.ws} and array_length(embedding, 1) = 512
          order by embedding::vector(512) <=> ${vec}::vector(512), id`),
      ).map((r) => r.id);
    });
    expect(exact.length).toBeGreaterThan(3);
    const near = async (pathLike: string | null, since: string | null, until: string | null) =>
      rowsOf<{ id: number; path: string; day: string | null; similarity: number }>(
        await db.execute(sql`select * from memory_nearest_512(${w.ws}, ${vec}::vector(512), 50, ${pathLike}::text,
          ${since}::date, ${until}::date, 100)`),
      );
    // In the index's relaxed order: sorted as the search sorts them.
    const all = (await near(null, null, null)).sort((a, b) => b.similarity - a.similarity || a.id - b.id);
    expect(all.map((r) => r.id)).toEqual(exact);
    expect(all[0]!.similarity).toBeCloseTo(1, 5);
    expect((await near('memory/%', null, null)).map((r) => r.path)).toEqual(
      all.filter((r) => r.path.startsWith('memory/')).map((r) => r.path),
    );
    const june = await near(null, '2026-06-01', '2026-06-30');
    expect(june.length).toBeGreaterThan(0);
    expect(june.every((r) => r.day === '2026-06-02')).toBe(true);
  });
});
