import { execFile } from 'node:child_process';
import { ApiError } from '../lib/errors.ts';

/** Above KILN_WORKSPACE_MAX_BYTES' own maximum, with room for tar headers of many small files. */
const WORKSPACE_TAR_MAX_BYTES = 256 * 1024 * 1024;

/** A tar of a workspace's working tree without its .git, to copy into a sandbox. */
export function tarWorkspace(dir: string, maxBytes = WORKSPACE_TAR_MAX_BYTES): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    execFile(
      'tar',
      [
        '-C',
        dir,
        '--exclude=./.git',
        '--exclude=.kiln-*.tmp',
        '--no-xattrs',
        '--numeric-owner',
        '--owner=10001',
        '--group=10001',
        '-cf',
        '-',
        '.',
      ],
      { encoding: 'buffer', maxBuffer: maxBytes },
      (err, stdout) => {
        if (!err) return resolve(stdout);
        // The workspace quota keeps working trees well below this; one that is not (a quota
        // raised after the fact, files added on the host) is the tenant's to shrink, not a 500.
        if ((err as { code?: string }).code === 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER') {
          return reject(
            new ApiError(
              'payload_too_large',
              `the workspace is too large to copy into a sandbox (over ${maxBytes} bytes as a tar); delete files from it through the files API`,
            ),
          );
        }
        reject(err);
      },
    );
  });
}
