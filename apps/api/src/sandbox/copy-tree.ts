import { constants } from 'node:fs';
import { chmod, chown, copyFile, lutimes, mkdir, open, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import pLimit from 'p-limit';
import { ApiError } from '../lib/errors.ts';

/** Files copied at once: enough to keep libuv's thread pool busy, never enough to run out of descriptors. */
const COPY_CONCURRENCY = 16;
/** What the tar path's data filter keeps of a mode: no setuid, setgid or sticky bit, no group or other write. */
export const MODE_MASK = 0o755;
export const TMP_FILE = /^\.kiln-.*\.tmp$/;

/** Why a new sandbox could not take the workspace (a 413), by either copy. */
export const WORKSPACE_TOO_LARGE =
  "the workspace is larger than its sandbox's /workspace (sandbox.disk_mb and sandbox.memory_mb size it); " +
  'delete files from it through the files API or raise those settings';

/**
 * Copies a workspace's working tree into a sandbox's own (fresh, empty) directory on this
 * host, as the tar path does: without the top-level .git and the host's temporary files,
 * regular files and directories only (a symbolic link, FIFO, socket or device is skipped,
 * never followed or recreated), modes without setuid/setgid/sticky or group/other write,
 * file times kept, everything owned by the sandbox's uid. A source file is opened with
 * O_NOFOLLOW and copied through its descriptor, so a path swapped for a link between the
 * listing and the copy is refused rather than followed. The destination is written only while
 * no code of the sandbox runs (a warm container that was never claimed, before its first
 * exec). Returns the files and bytes copied; a tree larger than the destination is a 413.
 */
export async function copyTree(src: string, dst: string, uid: number): Promise<{ files: number; bytes: number }> {
  const limit = pLimit(COPY_CONCURRENCY);
  const copies: Promise<number>[] = [];
  // The first copy that failed. Every copy gets its handler when it is queued, not when the walk
  // is over: the walk awaits the file system between directories, and a copy that fails meanwhile
  // (ENOSPC on a full mount) would otherwise be a rejection nobody handles, which ends the process.
  let failed: { err: unknown } | undefined;
  const stack: [string, string][] = [['', src]];
  const queue = (task: () => Promise<number>) => {
    const p = limit(() => (failed ? Promise.resolve(-1) : task()));
    p.catch((err: unknown) => {
      failed ??= { err };
    });
    copies.push(p);
  };
  try {
    for (let top = stack.pop(); top; top = stack.pop()) {
      if (failed) throw failed.err;
      const [rel, dir] = top;
      for (const e of await readdir(dir, { withFileTypes: true })) {
        if ((rel === '' && e.name === '.git') || TMP_FILE.test(e.name)) continue;
        const from = join(dir, e.name);
        const to = join(dst, rel, e.name);
        if (e.isDirectory()) {
          await mkdir(to, { mode: 0o700 });
          stack.push([join(rel, e.name), from]);
          queue(() => ownDir(from, to, uid));
        } else if (e.isFile()) {
          queue(() => copyOne(from, to, uid));
        }
      }
    }
    const sizes = await Promise.all(copies);
    return { files: sizes.filter((n) => n >= 0).length, bytes: sizes.reduce((a, n) => a + Math.max(0, n), 0) };
  } catch (err) {
    // Nothing is left writing to the destination when this returns (the caller removes it): the
    // copies still queued see the failure and return at once.
    await Promise.allSettled(copies);
    if ((err as { code?: string }).code === 'ENOSPC') {
      throw new ApiError('payload_too_large', WORKSPACE_TOO_LARGE);
    }
    throw err;
  }
}

/** A directory's mode (masked) and owner; -1, it is no file. */
async function ownDir(from: string, to: string, uid: number): Promise<number> {
  const fd = await open(from, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_DIRECTORY);
  try {
    const st = await fd.stat();
    await chmod(to, (st.mode & MODE_MASK) | 0o700);
    await chown(to, uid, uid);
  } finally {
    await fd.close();
  }
  return -1;
}

/** One regular file; its size, or -1 when it turned out to be something else (skipped). */
async function copyOne(from: string, to: string, uid: number): Promise<number> {
  let fd: Awaited<ReturnType<typeof open>>;
  try {
    fd = await open(from, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch (err) {
    // ELOOP: it became a symbolic link; ENOENT: it was deleted since the listing.
    if (['ELOOP', 'ENOENT'].includes((err as { code?: string }).code ?? '')) return -1;
    throw err;
  }
  try {
    const st = await fd.stat();
    if (!st.isFile()) return -1;
    // Through the descriptor's /proc entry: the very file opened above, whatever its path is now.
    await copyFile(`/proc/self/fd/${fd.fd}`, to, constants.COPYFILE_EXCL);
    await chown(to, uid, uid);
    await chmod(to, st.mode & MODE_MASK);
    await lutimes(to, st.atime, st.mtime);
    return st.size;
  } finally {
    await fd.close();
  }
}
