import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { lstat, open, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { ApiError } from '../lib/errors.ts';
import { MODE_MASK, TMP_FILE } from './copy-tree.ts';

/**
 * Shipping a workspace's working tree to a backend that keeps a copy of it on its own host (a
 * sandbox node, node/tree-store.ts), so that a new sandbox there is sent what changed since the
 * last one instead of the whole tree.
 *
 * The API lists the tree (a manifest: every directory and regular file with its size, mode and
 * SHA-256), the backend answers which files its copy lacks, and the API sends only those, each as
 * a frame (`[4 bytes: header length][header JSON {p, s}][s bytes]`). The backend hashes what it
 * receives and takes its copy as the tree only when every file of the manifest is there with its
 * hash: a file that changed meanwhile makes the fill fail as stale, and the API asks again.
 * What is listed is what the tar path and copy-tree.ts copy: no top-level .git, no host
 * temporary files, directories and regular files only (a symbolic link is neither followed nor
 * sent), modes without setuid/setgid/sticky or group/other write.
 */

/** One directory (`d`) or regular file of a tree: path relative to its root, with `/`. */
export interface TreeEntry {
  p: string;
  /** A directory. */
  d?: true;
  /** A file's size in bytes. */
  s?: number;
  /** A file's SHA-256, hex. */
  h?: string;
  /** Mode bits, masked with 0o755. */
  m: number;
}

/** Most entries a manifest may have (the node refuses more). */
export const MAX_TREE_ENTRIES = 200_000;
/** Longest path of an entry, in bytes. */
export const MAX_TREE_PATH = 4096;

/**
 * A path a tree may hold: relative, `/`-separated, no empty, `.` or `..` part, no NUL or
 * backslash, each part at most 255 bytes. What the node checks every path from the API against.
 */
export function isTreePath(p: string): boolean {
  if (!p || Buffer.byteLength(p) > MAX_TREE_PATH || p.includes('\0') || p.includes('\\')) return false;
  return p.split('/').every((part) => part !== '' && part !== '.' && part !== '..' && Buffer.byteLength(part) <= 255);
}

interface Known {
  ino: bigint;
  size: bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
  h: string;
}

/** Workspaces whose file hashes are remembered (the most recently listed). */
const MEMO_TREES = 64;
/** dir -> path -> what a file was when it was hashed: a file whose inode, size and times are unchanged is not read again. */
const memo = new Map<string, Map<string, Known>>();

async function sha256Of(path: string): Promise<string | null> {
  let fd: Awaited<ReturnType<typeof open>>;
  try {
    fd = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch {
    return null;
  }
  try {
    if (!(await fd.stat()).isFile()) return null;
    const hash = createHash('sha256');
    for await (const chunk of fd.createReadStream({ autoClose: false, highWaterMark: 1 << 16 })) hash.update(chunk);
    return hash.digest('hex');
  } finally {
    await fd.close();
  }
}

/**
 * The manifest of a working tree (see the module's comment), directories before what they
 * hold. Files unchanged since the last listing of the same directory (inode, size, change and
 * modification times) keep their hash; the others are read.
 */
export async function manifestOf(dir: string): Promise<TreeEntry[]> {
  const before = memo.get(dir) ?? new Map<string, Known>();
  const now = new Map<string, Known>();
  const out: TreeEntry[] = [];
  const stack = [''];
  for (let rel = stack.pop(); rel !== undefined; rel = stack.pop()) {
    for (const e of await readdir(join(dir, rel), { withFileTypes: true })) {
      if ((rel === '' && e.name === '.git') || TMP_FILE.test(e.name)) continue;
      const p = rel ? `${rel}/${e.name}` : e.name;
      if (!isTreePath(p)) continue;
      if (out.length >= MAX_TREE_ENTRIES)
        throw new ApiError(
          'payload_too_large',
          `the workspace has more than ${MAX_TREE_ENTRIES} files and directories, more than a sandbox node takes`,
        );
      const st = await lstat(join(dir, p), { bigint: true }).catch(() => null);
      if (!st) continue;
      if (st.isDirectory()) {
        out.push({ p, d: true, m: Number(st.mode) & MODE_MASK });
        stack.push(p);
      } else if (st.isFile()) {
        const k = before.get(p);
        const same =
          k && k.ino === st.ino && k.size === st.size && k.mtimeNs === st.mtimeNs && k.ctimeNs === st.ctimeNs;
        const h = same ? k.h : await sha256Of(join(dir, p));
        if (h === null) continue;
        now.set(p, { ino: st.ino, size: st.size, mtimeNs: st.mtimeNs, ctimeNs: st.ctimeNs, h });
        out.push({ p, s: Number(st.size), h, m: Number(st.mode) & MODE_MASK });
      }
    }
  }
  memo.delete(dir);
  memo.set(dir, now);
  while (memo.size > MEMO_TREES) memo.delete(memo.keys().next().value!);
  return out;
}

/** A frame's header: the file's path and the bytes that follow it. */
function fileHeader(p: string, s: number): Buffer {
  const json = Buffer.from(JSON.stringify({ p, s }));
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(json.length);
  return Buffer.concat([head, json]);
}

/**
 * The frames of the wanted files of `dir`, as the manifest says them: each file read through a
 * descriptor opened without following links, exactly the manifest's size (a file that grew is cut,
 * one that shrank or became something else is padded with zeros: its hash then differs and the
 * node refuses the fill as stale).
 */
export async function* fileFrames(dir: string, wanted: readonly TreeEntry[]): AsyncGenerator<Buffer> {
  for (const e of wanted) {
    const size = e.s ?? 0;
    yield fileHeader(e.p, size);
    let left = size;
    const fd = await open(
      join(dir, e.p),
      constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY,
    ).catch(() => null);
    try {
      if (fd && (await fd.stat()).isFile()) {
        const buf = Buffer.allocUnsafe(Math.min(1 << 20, Math.max(1, size)));
        while (left > 0) {
          const { bytesRead } = await fd.read(buf, 0, Math.min(buf.length, left), null);
          if (bytesRead === 0) break;
          yield Buffer.from(buf.subarray(0, bytesRead));
          left -= bytesRead;
        }
      }
    } finally {
      await fd?.close();
    }
    for (; left > 0; left -= Math.min(left, 1 << 20)) yield Buffer.alloc(Math.min(left, 1 << 20));
  }
}
