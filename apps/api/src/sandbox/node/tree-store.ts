import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { chmod, mkdir, open, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { copyTree } from '../copy-tree.ts';
import { isTreePath, MAX_TREE_ENTRIES, type TreeEntry } from '../tree-sync.ts';

/** A workspace's key on a node: the API's workspace id. */
const KEY = /^[A-Za-z0-9_-]{1,128}$/;
/** Longest header of a file frame. */
const MAX_HEADER = 8192;

/** The files of the manifest the node's copy lacks were not all sent, or not as listed: ask again. */
export class StaleTree extends Error {}

interface Kept {
  bytes: number;
  usedAt: number;
}

/**
 * A sandbox node's copies of the workspace trees its sandboxes were given (tree-sync.ts), one
 * directory per workspace under `dir` (root-only), so that the next sandbox of a workspace is
 * sent only the files that changed: `wants` says which, `fill` takes them, brings the copy to the
 * manifest and copies it into the new sandbox's workspace mount (as copy-tree.ts copies on one
 * machine). Everything the API sends is checked: paths (tree-sync.ts `isTreePath`), sizes and
 * hashes against the manifest; the copy becomes the manifest's tree only when every file is
 * there with its hash. Copies of the workspaces used least recently go past `maxBytes`.
 */
export class TreeStore {
  private readonly locks = new Map<string, Promise<unknown>>();
  private readonly kept = new Map<string, Kept>();
  private scanned: Promise<void> | undefined;

  constructor(
    private readonly dir: string,
    private readonly maxBytes: number,
    private readonly log?: Logger,
  ) {}

  private base(key: string): string {
    if (!KEY.test(key)) throw new Error(`bad workspace key ${key}`);
    return join(this.dir, key);
  }

  /** One operation on a workspace's copy at a time. */
  private locked<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const settled = next.catch(() => undefined);
    this.locks.set(key, settled);
    void settled.then(() => {
      if (this.locks.get(key) === settled) this.locks.delete(key);
    });
    return next;
  }

  /** The copy's manifest by path; empty when there is none (never made, or an update did not finish). */
  private async manifest(key: string): Promise<Map<string, TreeEntry>> {
    const text = await readFile(join(this.base(key), 'manifest.json'), 'utf8').catch(() => null);
    if (text === null) return new Map();
    try {
      return new Map((JSON.parse(text) as TreeEntry[]).map((e) => [e.p, e]));
    } catch {
      return new Map();
    }
  }

  /** The files of `entries` this node's copy does not have as listed (their paths). */
  async wants(key: string, entries: readonly TreeEntry[]): Promise<string[]> {
    check(entries);
    return this.locked(key, async () => {
      const have = await this.manifest(key);
      return entries.filter((e) => !e.d && have.get(e.p)?.h !== e.h).map((e) => e.p);
    });
  }

  /**
   * Takes the frames of the files the copy lacks, brings it to `entries` and copies it into
   * `into.dir` (a new sandbox's empty workspace mount) owned by `into.uid`. Throws StaleTree
   * (the copy kept as it was) when a file is missing, differs from the manifest, or was not asked.
   * Returns the files and bytes received.
   */
  async fill(
    key: string,
    entries: readonly TreeEntry[],
    frames: AsyncIterable<Buffer>,
    into: { dir: string; uid: number },
  ): Promise<{ files: number; bytes: number }> {
    check(entries);
    const base = this.base(key);
    return this.locked(key, async () => {
      const have = await this.manifest(key);
      const tree = join(base, 'tree');
      const staging = join(base, 'in');
      await mkdir(this.dir, { recursive: true, mode: 0o700 });
      await mkdir(base, { recursive: true, mode: 0o700 });
      await rm(staging, { recursive: true, force: true });
      await mkdir(staging, { mode: 0o700 });
      const files = new Map(entries.filter((e) => !e.d).map((e) => [e.p, e]));
      const received = await receive(frames, staging, files);
      try {
        for (const e of files.values())
          if (!received.paths.has(e.p) && have.get(e.p)?.h !== e.h)
            throw new StaleTree(`${e.p} was neither sent nor in the node's copy as listed`);
        // From here the copy changes: without its manifest until it is whole again, so that an
        // update cut short (a crash) leaves a copy that is emptied and sent again in full.
        await rm(join(base, 'manifest.json'), { force: true });
        if (!have.size) await rm(tree, { recursive: true, force: true });
        await mkdir(tree, { recursive: true, mode: 0o700 });
        const next = new Map(entries.map((e) => [e.p, e]));
        // Gone or turned into the other kind: removed, deepest first.
        for (const p of [...have.keys()].sort().reverse()) {
          const now = next.get(p);
          if (!now || Boolean(now.d) !== Boolean(have.get(p)!.d))
            await rm(join(tree, p), { recursive: true, force: true });
        }
        for (const e of [...entries].sort((a, b) => (a.p < b.p ? -1 : 1))) {
          const to = join(tree, e.p);
          if (e.d) {
            await mkdir(to, { recursive: true, mode: 0o700 });
            await chmod(to, e.m | 0o700);
          } else if (received.paths.has(e.p)) {
            await mkdir(dirname(to), { recursive: true, mode: 0o700 });
            await rm(to, { recursive: true, force: true });
            await rename(join(staging, e.p), to);
            await chmod(to, e.m);
          } else if (have.get(e.p)?.m !== e.m) {
            // Same content, another mode (made executable, say): not sent again.
            await chmod(to, e.m);
          }
        }
        await writeFile(join(base, 'manifest.json'), JSON.stringify(entries), { mode: 0o600 });
        const bytes = entries.reduce((n, e) => n + (e.s ?? 0), 0);
        this.kept.set(key, { bytes, usedAt: Date.now() });
        await copyTree(tree, into.dir, into.uid);
        return { files: received.paths.size, bytes: received.bytes };
      } finally {
        await rm(staging, { recursive: true, force: true });
        await this.evict(key).catch((err) => this.log?.warn({ err }, 'node: could not trim the workspace copies'));
      }
    });
  }

  /** Removes the copies used least recently (not `keep`) while all of them take more than maxBytes. */
  private async evict(keep: string): Promise<void> {
    this.scanned ??= this.scan();
    await this.scanned;
    let total = [...this.kept.values()].reduce((n, k) => n + k.bytes, 0);
    const oldest = [...this.kept.entries()].filter(([k]) => k !== keep).sort((a, b) => a[1].usedAt - b[1].usedAt);
    for (const [key, k] of oldest) {
      if (total <= this.maxBytes) break;
      await this.locked(key, () => rm(this.base(key), { recursive: true, force: true }));
      this.kept.delete(key);
      total -= k.bytes;
      this.log?.info({ workspace: key, bytes: k.bytes }, 'node: dropped the copy of a workspace used least recently');
    }
  }

  /** The copies an earlier life of the node left, with their sizes (as their manifests say). */
  private async scan(): Promise<void> {
    for (const key of await readdir(this.dir).catch(() => [] as string[])) {
      if (!KEY.test(key) || this.kept.has(key)) continue;
      const m = await this.manifest(key);
      this.kept.set(key, { bytes: [...m.values()].reduce((n, e) => n + (e.s ?? 0), 0), usedAt: 0 });
    }
  }
}

/** The manifest's own checks: bounded, valid paths once each, sizes and hashes for files. */
function check(entries: readonly TreeEntry[]): void {
  if (entries.length > MAX_TREE_ENTRIES) throw new Error(`a tree of more than ${MAX_TREE_ENTRIES} entries`);
  const seen = new Set<string>();
  for (const e of entries) {
    if (!isTreePath(e.p) || seen.has(e.p)) throw new Error('a tree entry with a bad or repeated path');
    seen.add(e.p);
    if (!Number.isInteger(e.m) || e.m < 0 || e.m > 0o755 || (e.m & ~0o755) !== 0)
      throw new Error(`bad mode for ${e.p}`);
    if (!e.d && (!Number.isSafeInteger(e.s) || e.s! < 0 || typeof e.h !== 'string' || !/^[0-9a-f]{64}$/.test(e.h)))
      throw new Error(`bad size or hash for ${e.p}`);
  }
  // Every entry's directory is listed as one (a file inside a file is refused).
  const dirs = new Set(entries.filter((e) => e.d).map((e) => e.p));
  for (const p of seen) {
    const parent = p.includes('/') ? p.slice(0, p.lastIndexOf('/')) : '';
    if (parent && !dirs.has(parent)) throw new Error(`${p}: its directory is not listed`);
  }
}

/**
 * Reads file frames into `staging`: each path asked once, a file of the manifest, exactly its size,
 * written without following links; hashed on the way. A file whose hash is not the manifest's
 * is a stale tree (the API sends again from a new listing).
 */
async function receive(
  frames: AsyncIterable<Buffer>,
  staging: string,
  files: Map<string, TreeEntry>,
): Promise<{ paths: Set<string>; bytes: number }> {
  const paths = new Set<string>();
  let bytes = 0;
  let buf: Buffer = Buffer.alloc(0);
  let cur: {
    e: TreeEntry;
    left: number;
    fd: Awaited<ReturnType<typeof open>>;
    hash: ReturnType<typeof createHash>;
  } | null = null;
  const finish = async () => {
    const { e, fd, hash } = cur!;
    cur = null;
    await fd.close();
    if (hash.digest('hex') !== e.h) throw new StaleTree(`${e.p} changed while it was sent`);
    paths.add(e.p);
  };
  try {
    for await (const chunk of frames) {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      while (buf.length) {
        if (cur) {
          const n = Math.min(cur.left, buf.length);
          const part = buf.subarray(0, n);
          cur.hash.update(part);
          await cur.fd.write(part);
          cur.left -= n;
          bytes += n;
          buf = buf.subarray(n);
          if (cur.left === 0) await finish();
          continue;
        }
        if (buf.length < 4) break;
        const len = buf.readUInt32BE(0);
        if (len > MAX_HEADER) throw new Error('a file frame header over its bound');
        if (buf.length < 4 + len) break;
        const head = JSON.parse(buf.subarray(4, 4 + len).toString('utf8')) as { p?: unknown; s?: unknown };
        buf = buf.subarray(4 + len);
        const e = typeof head.p === 'string' ? files.get(head.p) : undefined;
        if (!e || paths.has(e.p) || head.s !== e.s) throw new Error('a file frame the manifest does not ask for');
        const to = join(staging, e.p);
        await mkdir(dirname(to), { recursive: true, mode: 0o700 });
        const fd = await open(
          to,
          constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
          0o600,
        );
        cur = { e, left: e.s!, fd, hash: createHash('sha256') };
        if (cur.left === 0) await finish();
      }
    }
    if (cur || buf.length) throw new Error('the file frames ended inside a file');
  } catch (err) {
    await (cur as { fd: { close(): Promise<void> } } | null)?.fd.close().catch(() => undefined);
    throw err;
  }
  return { paths, bytes };
}
