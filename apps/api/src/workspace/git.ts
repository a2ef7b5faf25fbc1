import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/** Runs one git command; `input` is written to its standard input. */
export type Git = (args: string[], input?: string) => Promise<string>;

/** Settings every git command runs with: no hooks, no signing, paths printed as-is. */
const CONFIG = [
  '-c',
  'core.hooksPath=/dev/null',
  '-c',
  'commit.gpgsign=false',
  '-c',
  'core.quotepath=off',
  '-c',
  'gc.auto=0',
];
/**
 * What a tenant's files must never change about git in a workspace: no global or system
 * attributes or ignore files (in-tree ones are neutralised by the repository itself, see
 * WorkspaceRepos), git's refusal of NTFS and HFS+ spellings of .git on, no line-ending
 * conversion, and every path argument taken literally (a file named "*" or ":(top)" is that file).
 */
const TENANT_CONFIG = [
  '-c',
  'core.attributesFile=/dev/null',
  '-c',
  'core.excludesFile=/dev/null',
  '-c',
  'core.protectNTFS=true',
  '-c',
  'core.protectHFS=true',
  '-c',
  'core.autocrlf=false',
];
const TENANT_ENV = { GIT_ATTR_NOSYSTEM: '1', GIT_LITERAL_PATHSPECS: '1' };

/**
 * Runs git in a workspace with argument arrays (never a shell) and a minimal environment:
 * nothing of the server's (editors, pagers, credentials) reaches git.
 *
 * Why not simple-git: its completion detection waits an extra 50 ms after every command that
 * prints nothing (`add`, `commit -q`, a clean `status`), which made one commit cost ~160 ms.
 */
export function gitIn(dir: string, home: string, opts: { tenant?: boolean } = {}): Git {
  const env = {
    ...(opts.tenant ? TENANT_ENV : {}),
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: home,
    LANG: 'C.UTF-8',
    GIT_CONFIG_NOSYSTEM: '1',
    GIT_TERMINAL_PROMPT: '0',
    GIT_COMMITTER_NAME: 'Kiln',
    GIT_COMMITTER_EMAIL: 'system@kiln.invalid',
  };
  const config = opts.tenant ? [...CONFIG, ...TENANT_CONFIG] : CONFIG;
  return (args, input) =>
    new Promise((resolve, reject) => {
      const child = execFile(
        'git',
        ['-C', dir, ...config, ...args],
        { env, encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 },
        (err, stdout, stderr) => {
          if (err) reject(new Error(`git ${args[0]} failed: ${(stderr || err.message).trim()}`));
          else resolve(stdout);
        },
      );
      // git may exit before reading its input (it failed): that is reported above, not here.
      child.stdin?.on('error', () => undefined).end(input ?? '');
    });
}

/**
 * HEAD's sha read from `.git` directly (no git process): null when HEAD is not a loose ref.
 * Every change to a workspace is a commit, so this names the working tree's content.
 *
 * Read synchronously on purpose: it runs before every model call to decide whether the prompt
 * files must be read again, and two reads of a 41-byte local file cost microseconds this way
 * against two thread-pool round trips (a tenth of a millisecond or more) when awaited.
 */
export function readHead(dir: string): string | null {
  const read = (p: string) => {
    try {
      return readFileSync(join(dir, '.git', p), 'utf8').trim();
    } catch {
      return '';
    }
  };
  const head = read('HEAD');
  const ref = /^ref: (refs\/heads\/[\w./-]+)$/.exec(head)?.[1];
  const sha = ref ? read(ref) : head;
  return /^[0-9a-f]{40}$/.test(sha) ? sha : null;
}
