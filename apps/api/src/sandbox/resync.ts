import { constants } from 'node:fs';
import { open, realpath } from 'node:fs/promises';
import { dirname, join, sep } from 'node:path';
import { gitIn } from '../workspace/git.ts';

/** A file of the workspace to write into a sandbox's copy (or, with null, to delete there). */
export interface FileWrite {
  path: string;
  data: Buffer | null;
}

/**
 * What changed in a workspace's working tree since the commit `since` (a paused sandbox's copy
 * was of it): each file changed or added, with its bytes as they are now, and each deleted, with
 * null. Names come from git, never from a shell; a file is read through a descriptor opened
 * without following a link, and only when its directory is inside the workspace, so a path a
 * tenant made into a link never reads anything else of the host. A commit git no longer knows
 * (the history was rewritten) is an error: the caller then gives the session a new sandbox.
 */
export async function changesSince(workspaceDir: string, since: string): Promise<FileWrite[]> {
  if (!/^[0-9a-f]{40}$/.test(since)) throw new Error(`not a commit: ${since}`);
  const git = gitIn(workspaceDir, dirname(workspaceDir), { tenant: true });
  const out = await git(['diff', '--no-renames', '--name-status', '-z', since, 'HEAD', '--']);
  const fields = out.split('\0');
  const writes: FileWrite[] = [];
  const root = await realpath(workspaceDir);
  for (let i = 0; i + 1 < fields.length; i += 2) {
    const status = fields[i];
    const path = fields[i + 1];
    if (!path || path === '.git' || path.startsWith('.git/')) continue;
    writes.push({ path, data: status === 'D' ? null : await readInside(root, path) });
  }
  return writes;
}

/** A regular file's bytes, read without following links; null (delete it there) when it is no such file now. */
async function readInside(root: string, path: string): Promise<Buffer | null> {
  const full = join(root, path);
  try {
    const parent = await realpath(dirname(full));
    if (parent !== root && !parent.startsWith(root + sep)) return null;
    const fh = await open(full, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      if (!(await fh.stat()).isFile()) return null;
      return await fh.readFile();
    } finally {
      await fh.close();
    }
  } catch {
    return null;
  }
}
