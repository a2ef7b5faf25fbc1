import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startKiln, type KilnProcess } from '../support/server.ts';

/** The README links here for the first steps; the commands a new user pastes live in this page. */
const GETTING_STARTED = fileURLToPath(new URL('../../docs/getting-started.md', import.meta.url));

const API = fileURLToPath(new URL('../../docs/api.md', import.meta.url));

/** The first ```sh block under a heading of a docs page (docs/getting-started.md by default), as written. */
function shellBlock(heading: string, page = GETTING_STARTED): string {
  const text = readFileSync(page, 'utf8');
  const at = text.indexOf(`\n## ${heading}\n`);
  if (at < 0) throw new Error(`${page} has no "## ${heading}" section`);
  const m = /```sh\n([\s\S]*?)```/.exec(text.slice(at));
  if (!m) throw new Error(`"## ${heading}" has no sh block`);
  return m[1]!;
}

/** The JSON values in text that holds several, one after another (as curl prints its answers). */
function jsonValues(text: string): any[] {
  const values: any[] = [];
  let depth = 0;
  let start = -1;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (inString) {
      if (ch === '\\') i++;
      else if (ch === '"') inString = false;
    } else if (ch === '"') inString = true;
    else if (ch === '{' || ch === '[') {
      if (depth++ === 0) start = i;
    } else if ((ch === '}' || ch === ']') && --depth === 0) values.push(JSON.parse(text.slice(start, i + 1)));
  }
  return values;
}

const bash = (script: string, cwd: string) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(
      'bash',
      ['--norc', '--noprofile', '-e', '-o', 'pipefail', '-c', script],
      { cwd, env: { PATH: process.env.PATH!, HOME: cwd }, timeout: 60_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });

/**
 * The getting-started commands (linked from the README) are pasted by new users as they are: run them, unchanged but for the
 * server's address (the test server listens on a port of its own, not 7700), against a real
 * server started the way `npm start` starts it, from a directory holding its `data/`.
 */
describe('README commands', () => {
  let dir: string;
  let kiln: KilnProcess;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kiln-readme-'));
    mkdirSync(join(dir, 'data'));
    kiln = await startKiln({ KILN_DATA_DIR: join(dir, 'data') });
  });
  afterAll(async () => {
    kiln.child.kill('SIGTERM');
    await kiln.exited;
    rmSync(dir, { recursive: true, force: true });
  });

  it('"First steps with the API" works when pasted', async () => {
    const script = shellBlock('First steps with the API');
    expect(script).toContain('localhost:7700');
    const host = new URL(kiln.url).host;
    const out = await bash(script.replaceAll('localhost:7700', host), dir);
    expect(out.stderr).toBe('');
    expect(out.code).toBe(0);
    const result = JSON.parse(out.stdout.trim().split('\n').at(-1)!);
    expect(result).toMatchObject({ exit_code: 0, stdout: '(3, 11)\n' });
  });

  it("pasted a second time, the first steps stop at once with the server's own answer (the team exists)", async () => {
    const script = shellBlock('First steps with the API').replaceAll('localhost:7700', new URL(kiln.url).host);
    const out = await bash(script, dir);
    expect(out.code).not.toBe(0);
    expect(out.stderr.trim()).toBe('conflict: a team named "acme" already exists');
    expect(out.stdout).toBe('');
  });

  it('docs/api.md: files, history, revert and memory search work when pasted after the first steps', async () => {
    const steps = shellBlock('First steps with the API').replace('{"name":"acme"}', '{"name":"acme-files"}');
    const files = shellBlock('Workspace files, history and memory', API);
    const host = new URL(kiln.url).host;
    const out = await bash(`${steps}\n${files}`.replaceAll('localhost:7700', host), dir);
    expect(out.stderr).toBe('');
    expect(out.code).toBe(0);
    // curl prints each answer without a newline: the JSON values follow one another.
    const answers = jsonValues(out.stdout).slice(1);
    const [written, json, read, listing, history, commit, reverted, search, deleted] = answers;
    expect(written.commit).toMatchObject({ kind: 'knowledge', paths: ['knowledge/pricing.md'] });
    expect(json.commit.paths).toEqual(['notes/todo.md']);
    expect(read).toMatchObject({ encoding: 'utf-8', content: '# Pricing\n\nThe Pro plan costs 40 EUR per seat.\n' });
    expect(listing.entries.map((e: { name: string }) => e.name)).toContain('pricing.md');
    expect(history.data[0].paths).toEqual(['notes/todo.md']);
    expect(commit.sha).toBe(history.data[0].sha);
    expect(commit.diff).toContain('+- call the bank');
    expect(reverted.commit.summary).toMatch(/^Revert/);
    expect(search.data[0]).toMatchObject({ path: 'knowledge/pricing.md' });
    expect(search).toHaveProperty('next_cursor');
    expect(deleted.commit.paths).toEqual(['knowledge/pricing.md']);
  });

  it('a body sent the way plain `curl -d` sends it is refused with a message that says what to send', async () => {
    const key = readFileSync(join(dir, 'data', 'admin.key'), 'utf8').trim();
    const out = await bash(
      `curl -s -w '\\n%{http_code}' -XPOST ${kiln.url}/v1/teams -H "Authorization: Bearer ${key}" -d '{"name":"acme"}'`,
      dir,
    );
    const [body, status] = out.stdout.split('\n');
    expect(status).toBe('415');
    const err = JSON.parse(body!).error;
    expect(err.code).toBe('unsupported_media_type');
    expect(err.message).toContain('Content-Type: application/json');
    expect(err.message).toContain('application/x-www-form-urlencoded');
  });
});
