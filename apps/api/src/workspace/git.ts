import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export type Git = (args: string[]) => Promise<string>;

/** Settings every workspace git command runs with: no hooks, no signing, paths printed as-is. */
const CONFIG = ['-c', 'core.hooksPath=/dev/null', '-c', 'commit.gpgsign=false', '-c', 'core.quotepath=off', '-c', 'gc.auto=0'];

/**
 * Runs git in a workspace with argument arrays (never a shell) and a minimal environment:
 * nothing of the server's (editors, pagers, credentials) reaches git.
 *
 * Why not simple-git: its completion detection waits an extra 50 ms after every command that
 * prints nothing (`add`, `commit -q`, a clean `status`), which made one commit cost ~160 ms.
 */
export function gitIn(dir: string, home: string): Git {
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: home,
    LANG: 'C.UTF-8',
    GIT_CONFIG_NOSYSTEM: '1',
    GIT_TERMINAL_PROMPT: '0',
    GIT_COMMITTER_NAME: 'Kiln',
    GIT_COMMITTER_EMAIL: 'system@kiln.invalid',
  };
  return (args) =>
    new Promise((resolve, reject) => {
      execFile('git', ['-C', dir, ...CONFIG, ...args], { env, encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`git ${args[0]} failed: ${(stderr || err.message).trim()}`));
        else resolve(stdout);
      });
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
