import { describe, expect, it } from 'vitest';
import {
  boilerplateLines,
  chunkFile,
  dayOfPath,
  isBuiltin,
  isIndexed,
  toLogLines,
  WINDOWS,
  type Chunk,
} from '../../apps/api/src/memory/chunker.ts';

const numbered = (n: number, word = 'fact') => Array.from({ length: n }, (_, i) => `- ${word} number ${i + 1}`);
const spans = (chunks: Chunk[]) => chunks.map((c) => [c.startLine, c.endLine]);
/** The lines of `text` a chunk claims to span, as the file has them. */
const linesOf = (text: string, c: Chunk) =>
  text
    .split('\n')
    .slice(c.startLine - 1, c.endLine)
    .join('\n');

describe('which files are indexed', () => {
  it('Markdown under memory/, knowledge/ and skills/, and MEMORY.md at the root; nothing else', () => {
    for (const p of [
      'MEMORY.md',
      'memory/2025-03-04.md',
      'memory/dreams/x.md',
      'knowledge/a/b/c.md',
      'skills/csv/SKILL.md',
      'skills/builtin/x/SKILL.md',
    ]) {
      expect(isIndexed(p), p).toBe(true);
    }
    for (const p of [
      'README.md',
      'notes/MEMORY.md',
      'memory/log.txt',
      'memoryx/a.md',
      'knowledge.md',
      'MEMORY.MD',
      'memory.md',
      'data/skills/a.md',
      '',
    ]) {
      expect(isIndexed(p), p).toBe(false);
    }
  });

  it('only skills/builtin/ is built in', () => {
    expect(isBuiltin('skills/builtin/memory-keeping/SKILL.md')).toBe(true);
    expect(isBuiltin('skills/my-builtin/SKILL.md')).toBe(false);
    expect(isBuiltin('knowledge/skills/builtin/x.md')).toBe(false);
  });
});

describe('the day of a log', () => {
  it('is the real calendar date in the file name under memory/, with or without a suffix', () => {
    expect(dayOfPath('memory/2024-02-29.md')).toBe('2024-02-29');
    expect(dayOfPath('memory/2025-03-04-standup.md')).toBe('2025-03-04');
    expect(dayOfPath('memory/2025/2025-12-31.md')).toBe('2025-12-31');
  });

  it('is null for impossible dates, dates not at the start of the name, folders named by date and other files', () => {
    for (const p of [
      'memory/2025-02-29.md',
      'memory/2025-13-01.md',
      'memory/2025-00-10.md',
      'memory/2025-04-31.md',
      'memory/x2025-03-04.md',
      'memory/2025-03-04/notes.md',
      'memory/2025-03-04.txt',
      'MEMORY.md',
      'memory/25-03-04.md',
      '',
    ]) {
      expect(dayOfPath(p), p).toBeNull();
    }
  });

  it('dates every chunk of a dated log, and no chunk of any other file', () => {
    const text = `# Log\n\n${numbered(3).join('\n')}\n`;
    const days = chunkFile('memory/2025-03-04.md', text).map((c) => c.day);
    expect(days.length).toBeGreaterThan(1);
    expect(new Set(days)).toEqual(new Set(['2025-03-04']));
    expect(chunkFile('knowledge/2025-03-04.md', text).map((c) => c.day)).toEqual([null]);
  });
});

describe('windows per kind of file', () => {
  it('core memory and logs: windows of two lines, one apart; knowledge and skills: twelve, eight apart', () => {
    const text = `${numbered(30).join('\n')}\n`;
    for (const path of ['MEMORY.md', 'memory/2025-03-04.md', 'memory/notes.md']) {
      const chunks = chunkFile(path, text);
      expect(
        chunks.every((c) => c.endLine - c.startLine + 1 <= WINDOWS.lines.size),
        path,
      ).toBe(true);
      expect(chunks.map((c) => c.startLine).slice(0, 3), path).toEqual([
        1,
        1 + WINDOWS.lines.step,
        1 + 2 * WINDOWS.lines.step,
      ]);
    }
    for (const path of ['knowledge/page.md', 'skills/csv/SKILL.md']) {
      const chunks = chunkFile(path, text);
      expect(spans(chunks), path).toEqual([
        [1, 12],
        [9, 20],
        [17, 28],
        [19, 30],
      ]);
    }
  });

  it('a section no longer than a window is one chunk; one line more makes a second, aligned to the end', () => {
    const { size } = WINDOWS.prose;
    expect(spans(chunkFile('knowledge/a.md', numbered(1).join('\n')))).toEqual([[1, 1]]);
    expect(spans(chunkFile('knowledge/a.md', numbered(size).join('\n')))).toEqual([[1, size]]);
    expect(spans(chunkFile('knowledge/a.md', numbered(size + 1).join('\n')))).toEqual([
      [1, size],
      [2, size + 1],
    ]);
  });

  it('by words alone (no vectors), logs get wider windows; prose is cut the same either way', () => {
    const text = `${numbered(30).join('\n')}\n`;
    const { size, step } = WINDOWS.linesByWords;
    expect(size).toBeGreaterThan(WINDOWS.lines.size);
    for (const path of ['MEMORY.md', 'memory/2025-03-04.md']) {
      const chunks = chunkFile(path, text, new Set(), false);
      expect(spans(chunks).slice(0, 2), path).toEqual([
        [1, size],
        [1 + step, step + size],
      ]);
      expect(spans(chunks)).not.toEqual(spans(chunkFile(path, text)));
    }
    expect(spans(chunkFile('knowledge/page.md', text, new Set(), false))).toEqual(
      spans(chunkFile('knowledge/page.md', text)),
    );
  });

  it('counts only lines with text: blank lines are inside a window\u2019s span but not in its size', () => {
    const text = numbered(8).join('\n\n\n');
    const chunks = chunkFile('MEMORY.md', text);
    const { size } = WINDOWS.lines;
    expect(chunks[0]).toMatchObject({ startLine: 1, endLine: 1 + 3 * (size - 1) });
    expect(chunks[0]!.content).toBe(linesOf(text, chunks[0]!));
    expect(chunks[0]!.searchText.split('\n')).toEqual(numbered(size));
  });

  it('never lets a window cross a heading; a heading with nothing under it makes no chunk', () => {
    const text = ['# One', ...numbered(3, 'a'), '## Two', '## Three', ...numbered(3, 'b'), '# Empty', ''].join('\n');
    const chunks = chunkFile('knowledge/x.md', text);
    expect(chunks.map((c) => c.heading)).toEqual(['One', 'Three']);
    expect(spans(chunks)).toEqual([
      [2, 4],
      [7, 9],
    ]);
    expect(chunks[1]!.searchText).toBe(['Three', ...numbered(3, 'b')].join('\n'));
  });

  it('keeps front matter with the first window, before any heading', () => {
    const text = '---\nname: csv-summary\ndescription: Summarise a CSV file\n---\n\n# Steps\n\n1. read it\n';
    const [front, steps] = chunkFile('skills/csv/SKILL.md', text);
    expect(front).toMatchObject({ startLine: 1, endLine: 4, heading: null });
    expect(front!.searchText).toContain('description: Summarise a CSV file');
    expect(steps).toMatchObject({ startLine: 8, heading: 'Steps' });
  });

  it('makes no chunk of an empty file, blank lines or headings alone', () => {
    for (const text of ['', '\n', '\n\n   \n\t\n', '# A\n\n## B\n'])
      expect(chunkFile('knowledge/a.md', text), JSON.stringify(text)).toEqual([]);
  });

  it('a file without a final newline is chunked like the same file with one', () => {
    const text = numbered(5).join('\n');
    expect(chunkFile('MEMORY.md', text)).toEqual(chunkFile('MEMORY.md', `${text}\n`));
  });

  it('gives exact line numbers in a CRLF file, and its content is the file\u2019s lines as they are', () => {
    const text = `${numbered(6).join('\r\n')}\r\n`;
    const chunks = chunkFile('MEMORY.md', text);
    expect(spans(chunks)).toEqual([
      [1, 2],
      [2, 3],
      [3, 4],
      [4, 5],
      [5, 6],
    ]);
    for (const c of chunks) expect(c.content).toBe(linesOf(text, c));
  });

  it('finds the headings of a CRLF file: sections and heading text as in the same file with LF', () => {
    const lf = ['# One', ...numbered(3, 'a'), '## Two', ...numbered(3, 'b'), ''].join('\n');
    const crlf = lf.replaceAll('\n', '\r\n');
    const chunks = chunkFile('knowledge/x.md', crlf);
    expect(chunks.map((c) => c.heading)).toEqual(['One', 'Two']);
    expect(spans(chunks)).toEqual(spans(chunkFile('knowledge/x.md', lf)));
    expect(chunks[1]!.searchText.split('\n')[0]).toBe('Two');
  });

  it('counts words for length and pairs CJK characters, and a chunk is never of length zero', () => {
    const [c] = chunkFile('knowledge/a.md', '# 部署\n\n部署流程 runs on Mondays 😀\n');
    expect(c!.cjk.split(' ').sort()).toEqual(['流程', '署流', '部署'].sort());
    expect(c!.len).toBe(2 + 4 + 3);
    const [symbols] = chunkFile('knowledge/a.md', '--- *** ---\n');
    expect(symbols!.len).toBe(1);
  });

  it('cuts a huge log in linear steps: every line in a window, the last window ending at the last line', () => {
    const lines = 100_000;
    const text = `${numbered(lines).join('\n')}\n`;
    const chunks = chunkFile('memory/2025-03-04.md', text);
    const { size, step } = WINDOWS.lines;
    expect(chunks).toHaveLength(Math.ceil((lines - size) / step) + 1);
    expect(chunks.at(-1)!.endLine).toBe(lines);
    expect(chunks.at(-1)!.content.split('\n').at(-1)).toBe(`- fact number ${lines}`);
    let covered = 0;
    for (const c of chunks) {
      expect(c.startLine).toBeLessThanOrEqual(covered + 1);
      covered = Math.max(covered, c.endLine);
    }
    expect(covered).toBe(lines);
  });
});

describe('template boilerplate', () => {
  it('is every line of the templates of three characters or more, trimmed, CRLF or not', () => {
    const set = boilerplateLines([
      '# Core memory\r\n\r\n  Short, factual bullets.  \r\n--\r\n',
      'ok\nKnowledge index\n',
    ]);
    expect([...set].sort()).toEqual(['# Core memory', 'Knowledge index', 'Short, factual bullets.']);
    expect(boilerplateLines([])).toEqual(new Set());
  });

  it('is shown but not searched, whatever its indentation; a boilerplate heading still names the section', () => {
    const boiler = boilerplateLines(['# Core memory\n\nShort, factual bullets.\n']);
    const [c] = chunkFile(
      'MEMORY.md',
      '# Core memory\n\n   Short, factual bullets.\n- The staging database is orchid.\n',
      boiler,
    );
    expect(c).toMatchObject({ heading: 'Core memory', searchText: '- The staging database is orchid.' });
    expect(c!.content).toBe('   Short, factual bullets.\n- The staging database is orchid.');
    // A user's own line that only contains a template line is the user's.
    const [own] = chunkFile('MEMORY.md', '- Short, factual bullets. Always.\n', boiler);
    expect(own!.searchText).toBe('- Short, factual bullets. Always.');
  });

  it('windows still count boilerplate lines, so line numbers stay exact around them', () => {
    const boiler = new Set(['template line']);
    const text = ['template line', 'template line', 'template line', 'template line', ...numbered(2)].join('\n');
    const chunks = chunkFile('MEMORY.md', text, boiler);
    // [1, 2], [2, 3] and [3, 4] hold only the template's lines: no chunk.
    expect(spans(chunks)).toEqual([
      [4, 5],
      [5, 6],
    ]);
    expect(chunks[0]!.searchText.split('\n')).toEqual(numbered(1));
    expect(chunks[1]!.searchText.split('\n')).toEqual(numbered(2));
  });
});

describe('daily-log lines', () => {
  it('makes every line of text a bullet of its own: paragraphs split, numbered and nested bullets flattened', () => {
    expect(toLogLines('Maya asked.\n\n    + nested plus\n  2) second\n10. tenth\n* star\n-not a bullet')).toBe(
      '- Maya asked.\n- nested plus\n- second\n- tenth\n- star\n- -not a bullet',
    );
  });

  it('keeps headings and comments as they are, and the inside of a code fence verbatim', () => {
    const out = toLogLines(
      '## 10:00 Session\n<!-- kiln-logged: ab -->\n```py\n  x = 1\n\n# not a heading\n```\nafter the fence\n',
    );
    const lines = out.split('\n');
    expect(lines.slice(0, 2)).toEqual(['## 10:00 Session', '<!-- kiln-logged: ab -->']);
    expect(lines).toContain('  x = 1');
    expect(lines).toContain('# not a heading');
    expect(lines.filter((l) => l.startsWith('```') || l.startsWith('- ```'))).toEqual(['```py', '```']);
    expect(lines.at(-1)).toBe('- after the fence');
  });

  it('leaves no carriage return and no blank line, and is empty for empty or blank text', () => {
    expect(toLogLines('first\r\n\r\n## Heading\r\nsecond   \r\n')).toBe('- first\n## Heading\n- second');
    expect(toLogLines('')).toBe('');
    expect(toLogLines(' \n\t\n\r\n')).toBe('');
  });

  it('keeps unicode as it is, and very long lines whole', () => {
    expect(toLogLines('Léa a dit : « d’accord » 😀\n部署完成')).toBe('- Léa a dit : « d’accord » 😀\n- 部署完成');
    const long = `${`${'-'.repeat(200_000)} x\n`.repeat(20)}1.${' '.repeat(200_000)}`;
    const out = toLogLines(long).split('\n');
    expect(out).toHaveLength(21);
    expect(out[0]).toBe(`- ${'-'.repeat(200_000)} x`);
    expect(out.at(-1)).toBe('- 1.');
  });
});
