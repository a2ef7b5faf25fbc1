import { execFile } from 'node:child_process';

const MAX_WORKSPACE_TAR = 256 * 1024 * 1024;

/** A tar of a workspace's working tree without its .git, to copy into a sandbox. */
export function tarWorkspace(dir: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    execFile(
      'tar',
      ['-C', dir, '--exclude=./.git', '--exclude=.kiln-*.tmp', '--no-xattrs', '--numeric-owner', '--owner=10001', '--group=10001', '-cf', '-', '.'],
      { encoding: 'buffer', maxBuffer: MAX_WORKSPACE_TAR },
      (err, stdout) => (err ? reject(err) : resolve(stdout)),
    );
  });
}
