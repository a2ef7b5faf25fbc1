import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The layer table of docs/architecture.md, enforced: every file of the server belongs to one row,
 * and no import climbs to a row above its own.
 */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SRC = join(ROOT, 'apps/api/src');

/** A cell's text without what is in parentheses (descriptions, links), however deeply nested. */
function outsideParens(text: string): string {
  let depth = 0;
  let out = '';
  for (const ch of text) {
    if (ch === '(') depth++;
    else if (ch === ')') depth = Math.max(0, depth - 1);
    else if (depth === 0) out += ch;
  }
  return out;
}

/** The rows of the table, top first: each a layer name and the parts it names (`x/` or `x.ts`). */
function layerTable(markdown: string): { layer: string; parts: string[] }[] {
  const lines = markdown.split('\n');
  const start = lines.findIndex((l) => /^\|\s*layer\s*\|\s*parts\s*\|/.test(l));
  if (start < 0) throw new Error('docs/architecture.md has no "| layer | parts |" table');
  const rows: { layer: string; parts: string[] }[] = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const [, layer = '', parts = ''] = line.split('|').map((c) => c.trim());
    const named = [...outsideParens(parts).matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    rows.push({ layer, parts: named.filter((p) => p.endsWith('/') || /\.(ts|mjs)$/.test(p)) });
  }
  return rows;
}

function sources(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && /\.(ts|mjs)$/.test(e.name))
    .map((e) => join(e.parentPath, e.name));
}

/** Relative imports of a file (static, side-effect and dynamic), resolved to paths. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const specs = [...text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|^\s*import\s+)['"](\.{1,2}\/[^'"]+)['"]/gm)];
  return specs.map((m) => resolve(dirname(file), m[1]!));
}

describe('the layer table of docs/architecture.md', () => {
  const rows = layerTable(readFileSync(join(ROOT, 'docs/architecture.md'), 'utf8'));
  /** The row of a source path: the most specific part that names it (a file before its folder). */
  const rowOf = (path: string): number | undefined => {
    const rel = relative(SRC, path);
    let best: { row: number; length: number } | undefined;
    rows.forEach(({ parts }, row) => {
      for (const part of parts) {
        const hit = part.endsWith('/') ? rel.startsWith(part) : rel === part;
        if (hit && (!best || part.length > best.length)) best = { row, length: part.length };
      }
    });
    return best?.row;
  };

  it('has its rows and names each part once', () => {
    expect(rows.length).toBeGreaterThan(5);
    const all = rows.flatMap((r) => r.parts);
    expect(new Set(all).size).toBe(all.length);
  });

  it('places every source file of the server in a row', () => {
    const homeless = sources(SRC)
      .filter((f) => rowOf(f) === undefined)
      .map((f) => relative(SRC, f));
    expect(homeless, 'files no row of the table names: give their folder a row').toEqual([]);
  });

  it('has no import that climbs to a row above its own', () => {
    const climbing: string[] = [];
    for (const file of sources(SRC)) {
      const from = rowOf(file)!;
      for (const target of importsOf(file)) {
        if (!target.startsWith(SRC)) continue;
        const to = rowOf(target);
        if (to !== undefined && to < from)
          climbing.push(
            `${relative(SRC, file)} (${rows[from]!.layer}) imports ${relative(SRC, target)} (${rows[to]!.layer})`,
          );
      }
    }
    expect(climbing).toEqual([]);
  });

  it('catches a climbing import (the check itself)', () => {
    // sandbox/ is below agent/: an import the other way round is what the test above refuses.
    const sandbox = rowOf(join(SRC, 'sandbox/engine.ts'))!;
    const agent = rowOf(join(SRC, 'agent/run-loop.ts'))!;
    expect(agent).toBeLessThan(sandbox);
    expect(rowOf(join(SRC, 'webhooks/events.ts'))).toBeGreaterThan(rowOf(join(SRC, 'webhooks/service.ts'))!);
    const markdown = '| layer | parts |\n|---|---|\n| a | `x/` (not `y/`) |\n| b | `y/`, `z.ts` |\n';
    expect(layerTable(markdown)).toEqual([
      { layer: 'a', parts: ['x/'] },
      { layer: 'b', parts: ['y/', 'z.ts'] },
    ]);
  });
});
