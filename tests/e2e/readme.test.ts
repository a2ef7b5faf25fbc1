import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startKiln, type KilnProcess } from '../support/server.ts';

/** The README links here for the first steps; the commands a new user pastes live in this page. */
const GETTING_STARTED = fileURLToPath(new URL('../../docs/getting-started.md', import.meta.url));

/** The first ```sh block under a heading of docs/getting-started.md, as written. */
function shellBlock(heading: string): string {
  const text = readFileSync(GETTING_STARTED, 'utf8');
  const at = text.indexOf(`\n## ${heading}\n`);
  if (at < 0) throw new Error(`docs/getting-started.md has no "## ${heading}" section`);
  const m = /```sh\n([\s\S]*?)```/.exec(text.slice(at));
  if (!m) throw new Error(`"## ${heading}" has no sh block`);
  return m[1]!;
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
