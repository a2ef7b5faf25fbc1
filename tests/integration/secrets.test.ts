import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WorkspaceRepos, type CommitOutcome } from '../../apps/api/src/workspace/git-repos.ts';
import { scanSecrets } from '../../apps/api/src/workspace/secrets.ts';
import { TEMPLATE } from '../support/app.ts';

/**
 * Secret redaction on the real commit path (real git): whatever reaches a commit has been
 * scanned, with secretlint's recommended rules plus Kiln's own, in every encoding.
 */
describe('secrets never reach a commit', () => {
  let root: string;
  let repos: WorkspaceRepos;
  let n = 0;
  beforeAll(() => {
    root = mkdtempSync(join(tmpdir(), 'kiln-secrets-'));
    repos = new WorkspaceRepos(root, TEMPLATE);
  });
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  /** A fresh workspace with `files` written into its working tree, then committed as the agent would. */
  async function commit(
    files: Record<string, string | Buffer>,
  ): Promise<{ id: string; outcome: CommitOutcome; show: (p: string) => Buffer | null }> {
    const id = `ws_secrets${++n}`;
    await repos.init(id);
    const dir = repos.dirOf(id);
    for (const [p, data] of Object.entries(files)) {
      execFileSync('mkdir', ['-p', join(dir, p, '..')]);
      writeFileSync(join(dir, p), data);
    }
    const outcome = await repos.commitPending(id, { author: 'agent' });
    const show = (p: string) => {
      try {
        return execFileSync('git', ['-C', dir, 'show', `HEAD:${p}`]);
      } catch {
        return null;
      }
    };
    return { id, outcome, show };
  }

  // Each a secret the hand-written list of 12 patterns missed; `value` must not be committed.
  const MISSED: [string, string, string][] = [
    ['gitlab', 'token = glpat-Abcdefghij1234567890', 'glpat-Abcdefghij1234567890'],
    [
      'slack webhook',
      'url: https://hooks.slack.com/services/T01ABCDEF/B01ABCDEF/abcdefghijklmnopqrstuvwx',
      'abcdefghijklmnopqrstuvwx',
    ],
    ['sendgrid', 'SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG', 'SG.abcdefghijklmnopqrstuv'],
    [
      'npm',
      '//registry.npmjs.org/:_authToken=npm_abcdefghijklmnopqrstuvwxyz0123456789',
      'npm_abcdefghijklmnopqrstuvwxyz0123456789',
    ],
    ['hugging face', 'HF = hf_abcdefghijklmnopqrstuvwxyzABCDEFGH', 'hf_abcdefghijklmnopqrstuvwxyzABCDEFGH'],
    [
      'pypi',
      'password = pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0LXV2d3h5ejAxMjM0NQACKlszLCJhYmMiXQ',
      'pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdo',
    ],
    [
      'azure',
      'DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=q83Zmx0Yb2VUq1NWqGdOJfS5XhKg3ZbmC2pXr7sT9uVwAbCdEfGhIjKlMnOpQrStUvWxYz0123456789AB==;EndpointSuffix=core.windows.net',
      'q83Zmx0Yb2VUq1NWqGdOJfS5XhKg3Z',
    ],
    ['postgres url', 'DATABASE_URL=postgres://app:Hunter2Secret@db.internal:5432/app', 'Hunter2Secret'],
    ['unquoted password', 'password=Hunter2Secret', 'Hunter2Secret'],
    ['json password', '{"user": "app", "password": "Hunter2Secret"}', 'Hunter2Secret'],
    ['yaml password', 'db:\n  password: Hunter2Secret\n', 'Hunter2Secret'],
    [
      'pgp private key',
      '-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF0abcdefghijklmnop\n=abcd\n-----END PGP PRIVATE KEY BLOCK-----\n',
      'lQOYBF0abcdefghijklmnop',
    ],
  ];

  it.each(MISSED)('redacts a %s secret in a text file', async (_name, text, value) => {
    const { outcome, show } = await commit({ 'notes/config.txt': `before\n${text}\nafter\n` });
    const committed = show('notes/config.txt')!.toString();
    expect(committed).not.toContain(value);
    expect(committed).toContain('[REDACTED:');
    expect(committed.startsWith('before\n') && committed.endsWith('after\n')).toBe(true);
    expect(outcome.redactions.length).toBeGreaterThan(0);
    expect(outcome.redactions[0]!.line).toBe(2 + (text.startsWith('db:') ? 1 : 0));
  });

  it('keeps Kiln\u2019s own names for what its patterns find, and leaves placeholders alone', async () => {
    const { outcome, show } = await commit({
      'a.py': 'key = "AKIAABCDEFGHIJKLMNOP"\npassword = os.environ["DB_PASSWORD"]\ntoken: ${TOKEN}\n',
    });
    expect(outcome.redactions.map((r) => r.type)).toEqual(['aws_access_key']);
    expect(show('a.py')!.toString()).toBe(
      'key = "[REDACTED:aws_access_key]"\npassword = os.environ["DB_PASSWORD"]\ntoken: ${TOKEN}\n',
    );
  });

  it('scans UTF-16 files (with and without a byte-order mark) and writes them back in UTF-16', async () => {
    const text = 'line one\npassword = "Hunter2Secret"\ntoken ghp_abcdefghijklmnopqrstuvwxyz0123456789\n';
    const le = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(text, 'utf16le')]);
    const be = Buffer.from(text, 'utf16le').swap16();
    const { outcome, show } = await commit({ 'le.txt': le, 'be.txt': be });
    expect(outcome.redactions.map((r) => `${r.path}:${r.line}:${r.type}`).sort()).toEqual([
      'be.txt:2:password_assignment',
      'be.txt:3:github_token',
      'le.txt:2:password_assignment',
      'le.txt:3:github_token',
    ]);
    const leOut = show('le.txt')!;
    expect([leOut[0], leOut[1]]).toEqual([0xff, 0xfe]);
    expect(leOut.subarray(2).toString('utf16le')).toBe(
      'line one\npassword = "[REDACTED:password_assignment]"\ntoken [REDACTED:github_token]\n',
    );
    expect(Buffer.from(show('be.txt')!).swap16().toString('utf16le')).toContain('[REDACTED:github_token]');
  });

  it('refuses a binary file (a NUL byte) that holds a secret, and commits the rest', async () => {
    const binary = Buffer.concat([
      Buffer.from([0, 1, 2, 0, 255]),
      Buffer.from('ghp_abcdefghijklmnopqrstuvwxyz0123456789'),
      Buffer.from([0, 0, 7]),
    ]);
    const { outcome, show } = await commit({
      'blob.bin': binary,
      'clean.bin': Buffer.from([0, 1, 2, 3]),
      'ok.md': 'fine\n',
    });
    expect(outcome.refused.map((r) => r.path)).toEqual(['blob.bin']);
    expect(outcome.refused[0]!.reason).toMatch(/binary file that holds a secret \(github_token\)/);
    expect(show('blob.bin')).toBeNull();
    expect(outcome.commit!.paths).toEqual(['clean.bin', 'ok.md']);
  });

  it('looks at file names: key stores are refused, every value of an .env, .netrc or .pgpass is redacted', async () => {
    const { outcome, show } = await commit({
      '.ssh/id_ed25519': 'not even a key format\n',
      'certs/client.p12': Buffer.from([0x30, 0x82, 1, 2]),
      '.env': '# settings\nDB_HOST=db.internal\nSESSION_SIGNING=q9Zr4tYx81\nEMPTY=\nQUOTED="a b c d"\n',
      '.env.example': 'DB_HOST=localhost\n',
      '.netrc': 'machine api.example.com login me password s3cr3tPass\n',
      '.pgpass': 'db.internal:5432:app:app:pgS3cret\n',
    });
    expect(outcome.refused.map((r) => r.path).sort()).toEqual(['.ssh/id_ed25519', 'certs/client.p12']);
    expect(show('.ssh/id_ed25519')).toBeNull();
    expect(show('.env')!.toString()).toBe(
      '# settings\nDB_HOST=[REDACTED:env_file_value]\nSESSION_SIGNING=[REDACTED:env_file_value]\nEMPTY=\nQUOTED="[REDACTED:env_file_value]"\n',
    );
    expect(show('.env.example')!.toString()).toBe('DB_HOST=localhost\n');
    expect(show('.netrc')!.toString()).toBe('machine api.example.com login me password [REDACTED:netrc_password]\n');
    expect(show('.pgpass')!.toString()).toBe('db.internal:5432:app:app:[REDACTED:pgpass_password]\n');
  });

  it('scans in a thread of its own: the event loop keeps turning while a large file is scanned', async () => {
    const big = Buffer.from(
      `${'lorem ipsum dolor sit amet '.repeat(150_000)}\ntoken ghp_abcdefghijklmnopqrstuvwxyz0123456789\n`,
    );
    let ticks = 0;
    let spinning = true;
    const spin = () => {
      ticks++;
      if (spinning) setImmediate(spin);
    };
    setImmediate(spin);
    const [verdict] = await scanSecrets([{ path: 'big.txt', data: big }]);
    spinning = false;
    expect(verdict!.kind).toBe('redacted');
    expect(ticks).toBeGreaterThan(10);
  });

  it('commits hundreds of files with one scan round trip per batch, every one of them scanned', async () => {
    const files: Record<string, string> = {};
    for (let i = 0; i < 600; i++)
      files[`data/f${i}.txt`] = i === 567 ? 'token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n' : `row ${i}\n`;
    const { outcome, show } = await commit(files);
    expect(outcome.commit!.paths).toHaveLength(600);
    expect(outcome.redactions).toEqual([{ path: 'data/f567.txt', line: 1, type: 'github_token' }]);
    expect(show('data/f567.txt')!.toString()).toBe('token [REDACTED:github_token]\n');
  }, 180_000);

  it('a file that cannot be scanned before its deadline is refused, and the next scan works', async () => {
    const big = Buffer.from('password = "Hunter2Secret"\n'.repeat(200_000));
    const [late] = await scanSecrets([{ path: 'slow.txt', data: big }], 1);
    expect(late).toMatchObject({
      kind: 'refused',
      reason: expect.stringMatching(/could not be scanned for secrets within/),
    });
    const [next] = await scanSecrets([{ path: 'next.txt', data: Buffer.from('password = "Hunter2Secret"\n') }]);
    expect(next!.kind).toBe('redacted');
  });

  it('another tenant\u2019s file running past its deadline does not refuse a file scanned beside it', async () => {
    const big = Buffer.from('password = "Hunter2Secret"\n'.repeat(200_000));
    const [late, beside] = await Promise.all([
      scanSecrets([{ path: 'slow.txt', data: big }], 1).then((v) => v[0]!),
      scanSecrets([{ path: 'beside.txt', data: Buffer.from('token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n') }]).then(
        (v) => v[0]!,
      ),
    ]);
    expect(late.kind).toBe('refused');
    expect(beside).toMatchObject({ kind: 'redacted', redactions: [{ type: 'github_token' }] });
  });
});
