import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';

export const gitSync = (dir: string, ...args: string[]) =>
  execFileSync('git', ['-C', dir, '-c', 'user.name=test', '-c', 'user.email=test@kiln.invalid', ...args], {
    encoding: 'utf8',
  }).trim();

/**
 * A git checkout of the project as it is in `root` now, uncommitted changes included (committed
 * on top as one snapshot), with `root`'s node_modules linked in: what a self-update patches.
 */
export function cloneProject(root: string, dest: string): void {
  execFileSync('git', ['clone', '-q', root, dest]);
  const list = (...args: string[]) =>
    execFileSync('git', ['-C', root, 'ls-files', '-z', ...args], { encoding: 'utf8' })
      .split('\0')
      .filter(Boolean);
  for (const f of list('--cached', '--others', '--exclude-standard')) {
    if (!existsSync(join(root, f))) continue;
    mkdirSync(dirname(join(dest, f)), { recursive: true });
    copyFileSync(join(root, f), join(dest, f));
  }
  for (const f of list('--deleted')) execFileSync('rm', ['-f', join(dest, f)]);
  gitSync(dest, 'add', '-A');
  if (gitSync(dest, 'status', '--porcelain')) gitSync(dest, 'commit', '-q', '-m', 'snapshot of the working tree');
  symlinkSync(join(root, 'node_modules'), join(dest, 'node_modules'));
}

/** A port free right now, for a server that must keep its address across restarts. */
export const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
