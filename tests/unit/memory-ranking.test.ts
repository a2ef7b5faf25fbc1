import { describe, expect, it } from 'vitest';
import { cutToBytes } from '../../apps/api/src/memory/embeddings.ts';
import { boilerplateLines, chunkFile, dayOfPath, toLogLines, WINDOWS } from '../../apps/api/src/memory/chunker.ts';
import { cjkPairs, isDay, parseQuery, wordCount } from '../../apps/api/src/memory/query.ts';
import {
  adjusted,
  BUILTIN_FACTOR,
  type Fusable,
  fuseScores,
  WORDS_WEIGHT,
  mergeHits,
  RECENCY_MAX,
  recencyFactor,
  snippetLines,
  snippetText,
  SNIPPET_CHARS,
  type Hit,
} from '../../apps/api/src/memory/rank.ts';
import {
  decodeCursor,
  encodeCursor,
  filterProblem,
  isPathPrefix,
  lineScore,
  queryVectorParam,
} from '../../apps/api/src/memory/search.ts';

describe('query terms', () => {
  it('sends words to full-text search and identifiers and CJK text to substring search', () => {
    expect(parseQuery('When did Maya adopt the puppy?')).toEqual({
      words: ['when', 'did', 'maya', 'adopt', 'the', 'puppy'],
      cjk: [],
      substrings: [],
    });
    expect(parseQuery('call load_config() and parseConfigFile, v2.3.1')).toEqual({
      words: ['call', 'load', 'config', 'and', 'parseconfigfile', 'v2', '3', '1'],
      cjk: [],
      substrings: ['load_config', 'parseconfigfile', 'v2.3.1'],
    });
    expect(parseQuery('部署流程 test')).toEqual({ words: ['test'], cjk: ['部署', '署流', '流程'], substrings: [] });
    expect(parseQuery('   ,;!? ')).toEqual({ words: [], cjk: [], substrings: [] });
  });

  it('bounds what a long query costs', () => {
    const q = parseQuery(
      `${Array.from({ length: 100 }, (_, i) => `word${'x'.repeat(i % 7)}${String.fromCharCode(97 + (i % 26))}`).join(' ')} ${'漢字'.repeat(50)}`,
    );
    expect(q.words.length).toBeLessThanOrEqual(16);
    expect(q.cjk.length).toBeLessThanOrEqual(12);
  });

  it('cuts CJK runs into overlapping pairs, and counts words and CJK characters', () => {
    expect(cjkPairs('冒烟测试')).toEqual(['冒烟', '烟测', '测试']);
    expect(cjkPairs('字')).toEqual(['字']);
    expect(wordCount('Maya: we adopted him, 部署 done')).toBe(7);
  });
});

describe('chunking', () => {
  const log = (n: number) =>
    `# 2025-03-04\n\n## Conversation\n\n${Array.from({ length: n }, (_, i) => `- 10:${String(i).padStart(2, '0')} turn ${i + 1}`).join('\n')}\n`;

  it('cuts logs into small windows overlapping by half, with exact line numbers, the date and the heading', () => {
    const chunks = chunkFile('memory/2025-03-04.md', log(9));
    const { size, step } = WINDOWS.lines;
    // Nine turns on lines 5–13: windows of `size` lines, `step` apart, the last ending on line 13.
    expect(size).toBe(2 * step);
    const starts = Array.from({ length: Math.floor((13 - 5 - size + 1) / step) + 1 }, (_, i) => 5 + i * step);
    expect(chunks.map((c) => [c.startLine, c.endLine])).toEqual(
      [...starts, ...(starts.at(-1)! + size - 1 < 13 ? [13 - size + 1] : [])].map((s) => [s, s + size - 1]),
    );
    expect(chunks.at(-1)!.endLine).toBe(13);
    for (const c of chunks) {
      expect(c).toMatchObject({ day: '2025-03-04', heading: 'Conversation', builtin: false });
      const lines = log(9).split('\n');
      expect(c.content).toBe(lines.slice(c.startLine - 1, c.endLine).join('\n'));
    }
    // Every line is in some window, and the windows overlap.
    const covered = new Set(
      chunks.flatMap((c) => Array.from({ length: c.endLine - c.startLine + 1 }, (_, i) => c.startLine + i)),
    );
    expect([...covered].sort((a, b) => a - b)).toEqual([5, 6, 7, 8, 9, 10, 11, 12, 13]);
  });

  it('starts a section at each heading (not inside code fences) and windows prose more widely', () => {
    const text = `# Page\n\nintro\n\n## Setup\n\n\`\`\`sh\n# not a heading\nrun it\n\`\`\`\n\n${Array.from({ length: 20 }, (_, i) => `para ${i}`).join('\n')}\n`;
    const chunks = chunkFile('knowledge/page.md', text);
    expect(chunks[0]).toMatchObject({ heading: 'Page', startLine: 3, endLine: 3, day: null });
    expect(chunks.slice(1).every((c) => c.heading === 'Setup')).toBe(true);
    expect(chunks[1]!.content).toContain('# not a heading');
    expect(Math.max(...chunks.map((c) => c.content.split('\n').filter((l) => l.trim()).length))).toBe(
      WINDOWS.prose.size,
    );
  });

  it('shows template boilerplate but does not search it; built-in skills are searched whole', () => {
    const boiler = boilerplateLines(['# Core memory\n\nShort, factual bullets that stay true.\n']);
    const [c] = chunkFile(
      'MEMORY.md',
      '# Core memory\n\nShort, factual bullets that stay true.\n- The staging database is orchid.\n',
      boiler,
    );
    expect(c!.content).toContain('Short, factual bullets');
    expect(c!.searchText).toBe('- The staging database is orchid.');
    expect(chunkFile('MEMORY.md', '# Core memory\n\nShort, factual bullets that stay true.\n', boiler)).toEqual([]);
    const [s] = chunkFile(
      'skills/builtin/x/SKILL.md',
      '# Core memory\n\nShort, factual bullets that stay true.\n',
      boiler,
    );
    expect(s).toMatchObject({ builtin: true, searchText: 'Core memory\nShort, factual bullets that stay true.' });
  });

  it('dates only real days under memory/', () => {
    expect(dayOfPath('memory/2025-02-28.md')).toBe('2025-02-28');
    expect(dayOfPath('memory/dreams/2025-02-28.md')).toBe('2025-02-28');
    expect(dayOfPath('memory/2025-02-30.md')).toBeNull();
    expect(dayOfPath('knowledge/2025-02-28.md')).toBeNull();
    expect(dayOfPath('memory/notes.md')).toBeNull();
  });

  it('turns a model\u2019s daily log into one bullet per line', () => {
    expect(
      toLogLines(
        '### Session a\n\nMaya asked for the report.\nIt was sent.\n  - nested detail\n1. numbered\n\n<!-- kiln-logged: ab -->',
      ),
    ).toBe(
      '### Session a\n- Maya asked for the report.\n- It was sent.\n- nested detail\n- numbered\n<!-- kiln-logged: ab -->',
    );
  });
});

describe('ranking', () => {
  it('adjusts a score below 0 in the same direction as one above: recency raises, built-in lowers', () => {
    for (const base of [0.8, 0.1, -0.1, -0.8]) {
      const recent = adjusted(base, 1 + RECENCY_MAX, 1);
      expect(recent, `recent ${base}`).toBeGreaterThan(base);
      const builtin = adjusted(base, 1, BUILTIN_FACTOR);
      expect(builtin, `builtin ${base}`).toBeLessThan(base);
      // Order kept among the adjusted: a better score stays better under the same factors.
      expect(adjusted(base + 0.05, 1.05, BUILTIN_FACTOR)).toBeGreaterThan(adjusted(base, 1.05, BUILTIN_FACTOR));
    }
    expect(adjusted(0, 1.1, 0.5)).toBe(0);
  });

  it('lets recency add at most a bounded bonus, so it only breaks ties', () => {
    const now = new Date('2026-06-01T12:00:00Z');
    expect(recencyFactor(null, now)).toBe(1);
    expect(recencyFactor('2026-06-01', now)).toBeLessThanOrEqual(1 + RECENCY_MAX);
    expect(recencyFactor('2026-06-01', now)).toBeGreaterThan(recencyFactor('2025-06-01', now));
    expect(recencyFactor('2016-06-01', now)).toBeGreaterThanOrEqual(1);
    // A match 11 % better, ten years old, still beats today's weaker one.
    expect(1.11 * recencyFactor('2016-06-01', now)).toBeGreaterThan(1 * recencyFactor('2026-06-01', now));
    expect(BUILTIN_FACTOR).toBeLessThan(1);
  });

  it("fuses the words' and the meaning's scores: by how much a chunk won, not its place", () => {
    const items = new Map<string, Fusable>([
      ['words', { bm25: 8, similarity: 0.3 }], // the best by words, the least similar of the scale
      ['both', { bm25: 6, similarity: 0.65 }],
      ['meaning', { bm25: 0, similarity: 0.7 }], // the nearest, sharing no word
      ['small-talk', { bm25: 0, similarity: 0.31 }],
      ['no-vector', { bm25: 4, similarity: null }],
    ]);
    const scale = ['words', 'both', 'meaning', 'small-talk'];
    const fused = fuseScores(items, scale);
    expect(fused.get('words')).toBeCloseTo(WORDS_WEIGHT, 10);
    expect(fused.get('meaning')).toBeCloseTo(1 - WORDS_WEIGHT, 10);
    expect(fused.get('no-vector')).toBeCloseTo(WORDS_WEIGHT / 2, 10);
    // Near in meaning by far beats near by a hair; found well by both beats either alone.
    expect(fused.get('meaning')!).toBeGreaterThan(fused.get('words')!);
    expect(fused.get('both')!).toBeGreaterThan(fused.get('meaning')!);
    expect(fused.get('small-talk')!).toBeLessThan(fused.get('words')!);
    // A deeper page adds chunks outside the scale: every score already given stays, so pages agree.
    const deeper = new Map([...items, ['deep', { bm25: 1, similarity: 0.1 }] as const]);
    const again = fuseScores(deeper, scale);
    for (const [k, v] of fused) expect(again.get(k)).toBe(v);
    expect(again.get('deep')!).toBeLessThan(fused.get('small-talk')!);
    // No vector anywhere (the encoder is still filling): the words alone order, no NaN.
    const wordsOnly = fuseScores(
      new Map<string, Fusable>([
        ['a', { bm25: 2, similarity: null }],
        ['b', { bm25: 1, similarity: null }],
      ]),
      ['a', 'b'],
    );
    expect(wordsOnly.get('a')!).toBeGreaterThan(wordsOnly.get('b')!);
    expect([...wordsOnly.values()].every(Number.isFinite)).toBe(true);
  });

  it('merges hits that overlap or touch in a file, keeps apart what does not, and never repeats a line', () => {
    const h = (path: string, from: number, to: number, score: number): Hit<null> => ({
      path,
      from,
      to,
      score,
      extra: null,
    });
    expect(
      mergeHits([h('a', 10, 11, 3), h('a', 11, 12, 2), h('b', 11, 12, 1), h('a', 30, 30, 1), h('a', 10, 10, 0.5)]),
    ).toEqual([{ ...h('a', 10, 12, 3), merged: true }, h('b', 11, 12, 1), h('a', 30, 30, 1)]);
    // Too long to merge: the weaker hit keeps only the lines the better one does not show.
    expect(mergeHits([h('a', 10, 15, 3), h('a', 14, 19, 2)])).toEqual([h('a', 10, 15, 3), h('a', 16, 19, 2)]);
    // Too many characters to merge (long turns): kept apart the same way.
    const chars = (_: string, from: number, to: number) => (to - from + 1) * 250;
    expect(mergeHits([h('a', 10, 11, 3), h('a', 11, 12, 2)], chars)).toEqual([h('a', 10, 11, 3), h('a', 12, 12, 2)]);
    expect(mergeHits([h('a', 10, 10, 3), h('a', 11, 11, 2)], chars)).toEqual([{ ...h('a', 10, 11, 3), merged: true }]);
  });

  it('builds a snippet around the best-matching line and its neighbours, within the character budget', () => {
    const lines = ['- a: hello', '- b: did you name the puppy?', '', '- a: yes, Biscuit', '- b: nice'];
    expect(snippetLines(lines, [0, 3, 0, 1, 0])).toEqual({ from: 0, to: 3 });
    expect(snippetText(lines, 0, 3)).toEqual({
      text: '- a: hello\n- b: did you name the puppy?\n- a: yes, Biscuit',
      to: 3,
    });
    // In a conversation: the turn, what follows it, and the turn before only when it asks.
    expect(snippetLines(lines, [0, 3, 0, 1, 0], true)).toEqual({ from: 1, to: 3 });
    expect(snippetLines(lines, [0, 1, 0, 3, 0], true)).toEqual({ from: 1, to: 4 });
    expect(snippetLines(lines, [0, 0, 0, 1, 3], true)).toEqual({ from: 4, to: 4 });
    const long = ['x'.repeat(200), 'needle', 'y'.repeat(200)];
    expect(snippetLines(long, [0, 1, 0])).toEqual({ from: 1, to: 2 });
    expect(snippetText(['z'.repeat(1000)], 0, 0).text.length).toBe(SNIPPET_CHARS);
    // Whole lines while they fit: the range ends at the last line shown, never at one cut off.
    const turns = ['a'.repeat(150), 'b'.repeat(150), 'c'.repeat(150)];
    expect(snippetText(turns, 0, 2)).toEqual({ text: `${turns[0]}\n${turns[1]}`, to: 1 });
    expect(snippetText(turns, 0, 2, 2 * SNIPPET_CHARS).to).toBe(2);
  });
});

describe('line scores for snippets', () => {
  it('matches a stem at the start of a word (and y for a final i), CJK and identifiers as substrings', () => {
    const terms = [
      { term: 'adopt', kind: 'word', idf: 2 },
      { term: 'citi', kind: 'word', idf: 1 },
      { term: '部署', kind: 'cjk', idf: 3 },
      { term: 'load_config', kind: 'substring', idf: 4 },
    ];
    expect(lineScore('Maya: we adopted him!', terms)).toBe(2);
    expect(lineScore('The city was loud', terms)).toBe(1);
    expect(lineScore('two cities', terms)).toBe(1);
    expect(lineScore('readopt', terms)).toBe(0);
    expect(lineScore('我们的部署流程', terms)).toBe(3);
    expect(lineScore('call LOAD_CONFIG() first', terms)).toBe(4);
    expect(lineScore('nothing here', terms)).toBe(0);
  });
});

describe('search parameters', () => {
  it('checks days and path prefixes', () => {
    expect(isDay('2024-02-29')).toBe(true);
    expect(isDay('2023-02-29')).toBe(false);
    expect(isDay('2024-2-9')).toBe(false);
    expect(isPathPrefix('memory/')).toBe(true);
    for (const bad of ['/etc', '../x', 'a/../b', 'a\\b', 'a\nb', '']) expect(isPathPrefix(bad), bad).toBe(false);
    expect(filterProblem({ since: '2024-05-02', until: '2024-05-01' })).toMatch(/since/);
    expect(filterProblem({ path: 'memory/', since: '2024-05-01' })).toBeNull();
  });

  it('makes cursors that only the same query and filters accept', () => {
    const c = encodeCursor(8, 'puppy', { path: 'memory/' });
    expect(decodeCursor(c, 'puppy', { path: 'memory/' })).toBe(8);
    expect(decodeCursor(c, 'puppy', {})).toBeNull();
    expect(decodeCursor(c, 'kitten', { path: 'memory/' })).toBeNull();
    expect(decodeCursor('%%%', 'puppy', {})).toBeNull();
    expect(decodeCursor(Buffer.from('{"o":-1}').toString('base64url'), 'puppy', {})).toBeNull();
  });

  it('writes a query vector as whole numbers in single precision and int4, at the direction of the vector', () => {
    const cos = (a: number[], b: number[]) => {
      let dot = 0;
      let na = 0;
      let nb = 0;
      for (const [i, x] of a.entries()) {
        dot += x * b[i]!;
        na += x * x;
        nb += b[i]! * b[i]!;
      }
      return dot / Math.sqrt(na * nb);
    };
    for (const v of [
      [0.1, -1 / 3, 1e-9, -2.5e-7, 0, 0.049008440226316452, Math.PI / 100],
      // An endpoint's vector need not be normalised: components past int4's range, too.
      [123456.789, -9e9, 3, 0],
      [0, 0, 0],
    ]) {
      const ints = queryVectorParam(v).slice(1, -1).split(',').map(Number);
      expect(ints).toHaveLength(v.length);
      for (const n of ints) {
        expect(Number.isInteger(n)).toBe(true);
        expect(Math.abs(n)).toBeLessThanOrEqual(2 ** 23);
        expect(Math.fround(n)).toBe(n);
      }
      if (v.some((x) => x !== 0)) expect(cos(v, ints)).toBeGreaterThan(1 - 1e-12);
      else expect(ints).toEqual([0, 0, 0]);
    }
  });
});

describe('texts cut for an embeddings endpoint', () => {
  it('keeps at most the given UTF-8 bytes and never cuts a character', () => {
    expect(cutToBytes('hello', 8000)).toBe('hello');
    expect(cutToBytes('abcdef', 4)).toBe('abcd');
    // 3 bytes a character: 7 bytes hold two.
    expect(cutToBytes('部署流程', 7)).toBe('部署');
    // A character outside the BMP (4 bytes, two UTF-16 units) is kept whole or not at all.
    expect(cutToBytes('a😀b', 4)).toBe('a');
    expect(cutToBytes('a😀b', 5)).toBe('a😀');
    const long = '字'.repeat(9000);
    expect(Buffer.byteLength(cutToBytes(long, 8000))).toBeLessThanOrEqual(8000);
    expect(cutToBytes(long, 8000)).toHaveLength(2666);
  });
});
