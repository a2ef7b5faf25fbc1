import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const read = (path: string) => readFileSync(join(ROOT, path), 'utf8');

/**
 * The names of the environment variables config.ts reads, taken from its source: the keys of the
 * zod schema every setting is parsed with, and any `env.NAME` / `env['NAME']` read beside it.
 */
function configEnvVars(): string[] {
  const src = read('apps/api/src/config.ts');
  const start = src.indexOf('const schema = z.object({');
  if (start < 0)
    throw new Error('apps/api/src/config.ts no longer declares `const schema = z.object({`: update this test');
  const end = src.indexOf('\n});', start);
  const body = src.slice(start, end);
  const names = new Set([...body.matchAll(/^\s*([A-Z][A-Z0-9_]*)\s*:/gm)].map((m) => m[1]!));
  for (const m of src.matchAll(/\benv(?:\.([A-Z][A-Z0-9_]*)|\[['"]([A-Z][A-Z0-9_]*)['"]\])/g))
    names.add((m[1] ?? m[2])!);
  return [...names].sort();
}

/** Markdown without fenced code blocks and inline code, where a `[x](y)` is not a link. */
function withoutCode(md: string): string {
  return md.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`+[^`\n]*`+/g, '');
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes, repeats numbered. */
function headingSlugs(md: string): Set<string> {
  const slugs = new Set<string>();
  const seen = new Map<string, number>();
  for (const m of withoutCodeBlocks(md).matchAll(/^#{1,6}[ \t]+(.+?)[ \t#]*$/gm)) {
    const text = m[1]!.replace(/`/g, '').replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\p{M} _-]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    slugs.add(n === 0 ? base : `${base}-${n}`);
  }
  return slugs;
}
const withoutCodeBlocks = (md: string) => md.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');

const markdownFiles = (): string[] => [
  'README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

interface Problem {
  file: string;
  link: string;
  why: string;
}

function checkLinks(file: string, content: string = read(file)): Problem[] {
  const problems: Problem[] = [];
  const text = withoutCode(content);
  for (const m of text.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
    const link = m[1]!;
    if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue; // http:, https:, mailto: — not a file of the repository
    const [pathPart, anchor] = link.split('#', 2) as [string, string | undefined];
    const target = pathPart === '' ? join(ROOT, file) : resolve(ROOT, dirname(file), decodeURIComponent(pathPart));
    const rel = relative(ROOT, target);
    if (rel.startsWith('..') || rel.split(sep)[0] === '..') {
      problems.push({ file, link, why: 'points outside the repository' });
      continue;
    }
    if (!existsSync(target)) {
      problems.push({ file, link, why: `no file ${rel}` });
      continue;
    }
    if (anchor !== undefined && anchor !== '' && statSync(target).isFile() && target.endsWith('.md')) {
      const slugs = headingSlugs(readFileSync(target, 'utf8'));
      if (!slugs.has(decodeURIComponent(anchor).toLowerCase())) {
        problems.push({ file, link, why: `no heading #${anchor} in ${rel} (it has: ${[...slugs].join(', ')})` });
      }
    }
  }
  return problems;
}

describe('documentation', () => {
  it('docs/configuration.md names every environment variable config.ts reads', () => {
    const names = configEnvVars();
    // A parse that finds next to nothing means config.ts changed shape, not that the docs are complete.
    expect(names.length, `found only ${names.join(', ')} in config.ts`).toBeGreaterThan(20);
    const doc = read('docs/configuration.md');
    const missing = names.filter((n) => !doc.includes(`\`${n}\``));
    expect(missing, `not documented in docs/configuration.md: ${missing.join(', ')}`).toEqual([]);
  });

  it('every relative link in README.md and docs/*.md reaches a file (and heading) of the repository', () => {
    const files = markdownFiles();
    expect(files.length).toBeGreaterThan(1);
    const problems = files.flatMap((f) => checkLinks(f));
    const report = problems.map((p) => `${p.file}: (${p.link}) ${p.why}`).join('\n');
    expect(problems, `broken links:\n${report}`).toEqual([]);
  });

  it('the link checker itself catches a missing file, a missing heading and a link out of the repository', () => {
    // Guards the guard: the checks above pass vacuously if link extraction breaks.
    expect(headingSlugs('# Data flow of one message\n## The `kiln` CLI\n## A\n## A\n')).toEqual(
      new Set(['data-flow-of-one-message', 'the-kiln-cli', 'a', 'a-1']),
    );
    const sample =
      '[a](nope.md) [b](architecture.md#nope) [c](../../outside.md) [d](architecture.md#layout) `[e](nope.md)` [f](https://example.com)';
    expect(checkLinks('docs/sample.md', sample).map((p) => p.link)).toEqual([
      'nope.md',
      'architecture.md#nope',
      '../../outside.md',
    ]);
  });
});
