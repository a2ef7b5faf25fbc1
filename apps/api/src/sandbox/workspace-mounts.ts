import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chown, mkdir, readdir, readFile, rmdir, statfs, writeFile } from 'node:fs/promises';
import { basename, isAbsolute, join, normalize } from 'node:path';
import { promisify } from 'node:util';
import type { Logger } from 'pino';

const run = promisify(execFile);
/** The source name of every mount made here, as /proc/self/mountinfo shows it. */
const FSNAME = 'kiln-workspace';

export interface WorkspaceMountOptions {
  /** auto: mount when possible, else the tar path; on: mount or refuse to start; off: always the tar path. */
  mode: 'auto' | 'on' | 'off';
  /** Where each sandbox's directory is made: <dir>/<instance>/<sandbox id>. */
  dir: string;
  /** What this instance's mounts together may be sized at (MiB of host memory); past it, new sandboxes take the tar path. */
  maxMb: number;
  /**
   * The backend's sandboxes can mount a directory of this host (its capabilities, which the engine
   * fills in); false takes the tar path, as for an engine on another host.
   */
  hostMounts?: boolean;
}

/**
 * Per-sandbox workspace directories on this host: each its own tmpfs, sized like the
 * container's /workspace tmpfs would be, nosuid and nodev, mode 0755 and owned by the
 * sandbox's uid, bind-mounted at /workspace when the container is created. The host copies
 * the working tree into it when a session claims the sandbox (copy-tree.ts) instead of sending
 * a tar through the runner's frames; everything the sandbox changes still comes back through
 * the runner and the host's guards. Unmounted when the container goes.
 *
 * The pages the host copies in are charged to this process's memory cgroup (those the sandbox
 * writes, to the container's): `maxMb` bounds the sum of all mount sizes of this instance.
 */
export class WorkspaceMounts {
  /** Sandbox id -> size (MiB) of the mounts made by this instance and not yet removed. */
  private readonly sizes = new Map<string, number>();
  /** Sandbox id -> the mount of another replica of this host, taken over with its sandbox (`adoptForeign`). */
  private readonly foreign = new Map<string, string>();

  private constructor(
    /** <dir>/<instance>: this instance's directories only, never another replica's. */
    readonly root: string,
    private readonly maxMb: number,
    private readonly log: Logger,
  ) {}

  /**
   * Decides once, at start-up, whether sandboxes get a mounted workspace (and logs which):
   * null means the tar path. With mode "on", a host that cannot mount is an error.
   */
  static async open(opts: WorkspaceMountOptions, instance: string, log: Logger): Promise<WorkspaceMounts | null> {
    if (opts.mode === 'off') {
      log.info({ workspace_copy: 'tar', reason: 'KILN_SANDBOX_WORKSPACE_MOUNT=off' }, 'sandbox workspaces: tar copy');
      return null;
    }
    const mounts = new WorkspaceMounts(join(opts.dir, instance), opts.maxMb, log);
    let reason: string | undefined;
    if (!opts.hostMounts)
      reason =
        "the sandbox backend cannot mount this host's directories (its Docker Engine is not on a unix socket of this host)";
    else if (process.getuid?.() !== 0) reason = 'the API does not run as root, so it cannot mount';
    else reason = await mounts.probe();
    if (reason) {
      if (opts.mode === 'on') throw new Error(`KILN_SANDBOX_WORKSPACE_MOUNT=on, but ${reason}`);
      log.warn({ workspace_copy: 'tar', reason }, 'sandbox workspaces: tar copy (cannot mount them)');
      return null;
    }
    log.info({ workspace_copy: 'mount', dir: mounts.root, max_mb: opts.maxMb }, 'sandbox workspaces: host mounts');
    return mounts;
  }

  /** Mounts and unmounts a small tmpfs; the reason it failed, or undefined. */
  private async probe(): Promise<string | undefined> {
    const id = `probe-${randomBytes(4).toString('hex')}`;
    try {
      const dir = await this.create(id, 1);
      if (!dir) return 'no room for a probe mount';
      await writeFile(join(dir, 'probe'), 'ok');
      return undefined;
    } catch (err) {
      return `mounting a tmpfs failed: ${(err as Error).message.split('\n')[0]}`;
    } finally {
      await this.remove(id).catch(() => undefined);
    }
  }

  dirOf(sandboxId: string): string {
    if (!/^[A-Za-z0-9_-]+$/.test(sandboxId)) throw new Error(`bad sandbox id ${sandboxId}`);
    return this.foreign.get(sandboxId) ?? join(this.root, sandboxId);
  }

  /**
   * Takes over the workspace mount another replica of this host made for a sandbox this one
   * takes over (its row says where): true when `dir` is a plain absolute path named after the
   * sandbox and mounted here as a workspace tmpfs. From then on it counts against this
   * instance's budget, and `remove` unmounts it; the replica that made it leaves it alone
   * (the reaper asks the database whose it is).
   */
  async adoptForeign(sandboxId: string, dir: string): Promise<boolean> {
    if (!/^[A-Za-z0-9_-]+$/.test(sandboxId) || !isAbsolute(dir) || normalize(dir) !== dir) return false;
    if (basename(dir) !== sandboxId || !(await this.mounted()).has(dir)) return false;
    if (dir !== join(this.root, sandboxId)) this.foreign.set(sandboxId, dir);
    await this.adopt(sandboxId);
    return true;
  }

  /** MiB of host memory the mounts of this instance are sized at now. */
  get mountedMb(): number {
    let n = 0;
    for (const mb of this.sizes.values()) n += mb;
    return n;
  }

  /**
   * Makes the sandbox's directory, a tmpfs of `sizeMb`, owned by root until `own`; undefined
   * when it would take this instance's mounts past their budget (the sandbox then gets the
   * container's own tmpfs and the tar copy).
   */
  async create(sandboxId: string, sizeMb: number): Promise<string | undefined> {
    if (this.mountedMb + sizeMb > this.maxMb) {
      this.log.warn(
        { sandbox: sandboxId, size_mb: sizeMb, mounted_mb: this.mountedMb, max_mb: this.maxMb },
        'sandbox workspace mounts are at their budget (KILN_SANDBOX_MOUNT_MAX_MB); this sandbox gets a tar copy',
      );
      return undefined;
    }
    const dir = this.dirOf(sandboxId);
    this.sizes.set(sandboxId, sizeMb);
    try {
      await mkdir(this.root, { recursive: true, mode: 0o700 });
      await mkdir(dir, { mode: 0o700 });
      await run('mount', ['-t', 'tmpfs', '-o', `size=${sizeMb}m,mode=0755,nosuid,nodev`, FSNAME, dir]);
      return dir;
    } catch (err) {
      await this.remove(sandboxId).catch(() => undefined);
      throw err;
    }
  }

  /** Gives the mount's root to the sandbox's uid (known once its container is created). */
  async own(dir: string, uid: number): Promise<void> {
    await chown(dir, uid, uid);
  }

  /** Unmounts and removes the sandbox's directory; resolves also when it was never there. */
  async remove(sandboxId: string): Promise<void> {
    const dir = this.dirOf(sandboxId);
    if ((await this.mounted()).has(dir)) {
      try {
        await run('umount', [dir]);
      } catch (err) {
        // Still busy (a runtime that has not let go yet): detached now, freed when the last user goes.
        this.log.warn({ err, dir }, 'sandbox workspace mount busy; detaching it');
        await run('umount', ['-l', dir]);
      }
    }
    await rmdir(dir).catch((err: { code?: string }) => {
      if (err.code !== 'ENOENT') throw err;
    });
    this.sizes.delete(sandboxId);
    this.foreign.delete(sandboxId);
  }

  /**
   * Removes every directory (and mount) of this instance whose sandbox `keep` does not claim:
   * at start-up, what a previous life of this instance left; later, those of containers the
   * reaper removed. A mount kept that this process did not make (a paused sandbox's, made by
   * its previous life) counts against the budget from now on, at its size. `elsewhere` is asked
   * once, of those `keep` does not claim, which are now another replica's (it took their sandbox
   * over): those stay, outside this instance's budget. Returns how many went.
   */
  async sweep(
    keep: (sandboxId: string) => boolean,
    elsewhere: (sandboxIds: string[]) => Promise<Set<string>> = async () => new Set(),
  ): Promise<number> {
    const names = new Set<string>();
    const mounted = new Set<string>();
    for (const dir of await this.mounted())
      if (dir.startsWith(`${this.root}/`)) mounted.add(dir.slice(this.root.length + 1));
    for (const name of mounted) names.add(name);
    const listed = await readdir(this.root).catch((err: { code?: string }) => {
      if (err.code === 'ENOENT') return [] as string[];
      throw err;
    });
    for (const name of listed) names.add(name);
    for (const name of names) if (name.includes('/') || !/^[A-Za-z0-9_-]+$/.test(name)) names.delete(name);
    const unclaimed = [...names].filter((name) => !keep(name));
    const others = unclaimed.length ? await elsewhere(unclaimed) : new Set<string>();
    let removed = 0;
    for (const name of names) {
      if (others.has(name)) continue;
      if (keep(name)) {
        if (mounted.has(name) && !this.sizes.has(name)) await this.adopt(name);
        continue;
      }
      await this.remove(name).then(
        () => removed++,
        (err) => this.log.warn({ err, sandbox: name }, 'could not remove a sandbox workspace mount'),
      );
    }
    return removed;
  }

  /** Counts a mount this process did not make at its size (a tmpfs's blocks), so the budget holds across restarts. */
  private async adopt(sandboxId: string): Promise<void> {
    const fs = await statfs(this.dirOf(sandboxId)).catch(() => undefined);
    // Not read (gone meanwhile): nothing to count.
    if (fs) this.sizes.set(sandboxId, Math.ceil((fs.blocks * fs.bsize) / 2 ** 20));
  }

  /** Mount points of this process's mount namespace that are workspace mounts. */
  private async mounted(): Promise<Set<string>> {
    const out = new Set<string>();
    for (const line of (await readFile('/proc/self/mountinfo', 'utf8')).split('\n')) {
      // id parent major:minor root mount-point options [optional...] - fstype source super-options
      const fields = line.split(' ');
      const sep = fields.indexOf('-');
      if (sep < 0 || fields[sep + 2] !== FSNAME) continue;
      out.add(unescapeMountPath(fields[4] ?? ''));
    }
    return out;
  }
}

/** /proc/self/mountinfo writes space, tab, newline and backslash in a path as octal escapes. */
const unescapeMountPath = (p: string) =>
  p.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
