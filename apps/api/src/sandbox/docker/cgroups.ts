import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ApiError } from '../../lib/errors.ts';

/**
 * The fair share of the host (KILN_SANDBOX_FAIR_SHARE=on): every sandbox's container is created
 * in the cgroup of its team, `<parent>/team-<hash>`, under one parent for all sandboxes.
 *
 *   <root>/<parent>            cpu/io weight `parentWeight` (below the default 100: the API,
 *                              dockerd and everything else on the host keep their share)
 *   <root>/<parent>/team-<h>   cpu/io weight `teamWeight`, one per team with a live sandbox
 *   <root>/<parent>/team-<h>/<container id>   made by the runtime: the sandbox's own limits
 *
 * The kernel shares CPU (and block I/O) between sibling groups by weight, so a team with ten
 * busy sandboxes gets as much as a team with one, not ten times as much. The group's name is a
 * hash of the team id, never the id itself: nothing a tenant names reaches a path. Weights are
 * written in cgroup v2's units (1–10000, default 100) and scaled on cgroup v1 (cpu.shares is
 * 1024 per 100; blkio.bfq.weight / blkio.weight, 1–1000). Needs Docker's cgroupfs driver (a
 * CgroupParent is then a path) and the API on the Docker host as root, with /sys/fs/cgroup
 * writable. A team's group is removed when its last sandbox of this process is; the runtime
 * re-creates a removed one (with the kernel's defaults) for a container created meanwhile by
 * another replica, whose backend then writes the group's weights again (`settle`).
 */
export interface FairShareOptions {
  /** The parent group's name under the cgroup root: letters, digits, `_`, `-`. */
  parent: string;
  parentWeight: number;
  teamWeight: number;
  /** A cap on each team's CPUs together (cpu.max / cfs quota of its group); unset, none (weights only). */
  teamCpus?: number;
  /** The cgroup file system; /sys/fs/cgroup unless a test points elsewhere. */
  root?: string;
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;
const CONTROLLERS = ['cpu', 'io', 'memory', 'pids'];
const PERIOD_US = 100_000;

/** The team's group name: a hash of its id, so no id can name a path (or tell one team's group from its id). */
export function teamGroup(teamId: string): string {
  return `team-${createHash('sha256').update(teamId).digest('hex').slice(0, 16)}`;
}

export class TeamCgroups {
  private readonly root: string;
  private ready?: Promise<'v1' | 'v2'>;
  /** Containers of this process in each team group, by group name. */
  private readonly holders = new Map<string, number>();

  constructor(private readonly opts: FairShareOptions) {
    if (!NAME.test(opts.parent)) throw new Error(`not a cgroup name: ${opts.parent}`);
    this.root = opts.root ?? '/sys/fs/cgroup';
  }

  /** Resolves once the parent group is made with its weight; rejects with the host's reason when it cannot be. */
  async check(): Promise<void> {
    await this.setUp(true);
  }

  /**
   * Removes the team groups that hold no container (a process killed before it could remove
   * its own): the kernel refuses to remove one that holds any, so a live team's group stays. One
   * another process made a moment ago for a container it is creating is made again by the
   * runtime, with the default weight.
   */
  async sweep(): Promise<number> {
    const version = await this.setUp();
    const parents =
      version === 'v2'
        ? [join(this.root, this.opts.parent)]
        : (await readdir(this.root)).map((h) => join(this.root, h, this.opts.parent)).filter((d) => existsSync(d));
    let removed = 0;
    for (const parent of parents)
      for (const e of await readdir(parent, { withFileTypes: true }))
        if (e.isDirectory() && /^team-[0-9a-f]{16}$/.test(e.name) && !this.holders.has(e.name))
          removed += await rmdir(join(parent, e.name)).then(
            () => 1,
            (err: { code?: string }) => {
              if (err.code !== 'ENOENT' && err.code !== 'EBUSY') throw err;
              return 0;
            },
          );
    return removed;
  }

  /** The CgroupParent of a new container of this team (the group is made, with its weights, first). */
  async enter(teamId: string): Promise<string> {
    const version = await this.setUp();
    const group = teamGroup(teamId);
    this.holders.set(group, (this.holders.get(group) ?? 0) + 1);
    try {
      // Another process's sweep may remove the group between its mkdir and its weights: once more.
      await this.makeTeam(version, group).catch((err: { code?: string }) => {
        if (err.code !== 'ENOENT') throw err;
        return this.makeTeam(version, group);
      });
    } catch (err) {
      this.leaveCount(group);
      throw err;
    }
    return `/${this.opts.parent}/${group}`;
  }

  /**
   * Writes the team group's weights (and cap) again, once a container of the team has started in
   * it: another process on this host (a replica's sweep, or its team's last sandbox leaving) may
   * have removed the group between `enter` and the start, and the runtime then made it again
   * with the kernel's defaults. A started container keeps its group (the kernel refuses to
   * remove one that holds a process), so what is written now stays.
   */
  async settle(teamId: string): Promise<void> {
    await this.makeTeam(await this.setUp(), teamGroup(teamId));
  }

  /** A team group with the team weight and cap, made where it is not. */
  private makeTeam(version: 'v1' | 'v2', group: string): Promise<void> {
    return this.make(version, `${this.opts.parent}/${group}`, this.opts.teamWeight, this.opts.teamCpus);
  }

  /** A container of this team is gone (or was never made): its group goes with the team's last one. */
  async leave(teamId: string): Promise<void> {
    const group = teamGroup(teamId);
    if (this.leaveCount(group) > 0) return;
    await this.removeGroup(group);
  }

  private leaveCount(group: string): number {
    const left = (this.holders.get(group) ?? 1) - 1;
    if (left > 0) this.holders.set(group, left);
    else this.holders.delete(group);
    return left;
  }

  /** The cgroup version, once the parent group is made with its weight. */
  private setUp(raw = false): Promise<'v1' | 'v2'> {
    this.ready ??= (async () => {
      const version = existsSync(join(this.root, 'cgroup.controllers'))
        ? 'v2'
        : existsSync(join(this.root, 'cpu'))
          ? 'v1'
          : undefined;
      if (!version) throw new Error(`no cgroup file system at ${this.root}`);
      if (version === 'v2') await enable(this.root);
      await this.make(version, this.opts.parent, this.opts.parentWeight);
      return version;
    })();
    this.ready.catch(() => {
      this.ready = undefined;
    });
    if (raw) return this.ready;
    return this.ready.catch((err) => {
      throw new ApiError(
        'unavailable',
        `KILN_SANDBOX_FAIR_SHARE=on but the sandboxes' cgroup cannot be set up (${(err as Error).message}); the API must run as root on the Docker host`,
      );
    });
  }

  private async make(version: 'v1' | 'v2', path: string, weight: number, cpus?: number): Promise<void> {
    const quota = cpus === undefined ? undefined : Math.round(cpus * PERIOD_US);
    if (version === 'v2') {
      const dir = join(this.root, path);
      await mkdir(dir, { recursive: true });
      await enable(dir);
      await writeFile(join(dir, 'cpu.weight'), String(weight));
      if (quota) await writeFile(join(dir, 'cpu.max'), `${quota} ${PERIOD_US}`);
      // io.weight exists where the io controller is enabled and the kernel has a weight-based I/O policy.
      if (existsSync(join(dir, 'io.weight'))) await writeFile(join(dir, 'io.weight'), `default ${weight}`);
      return;
    }
    const cpu = join(this.root, 'cpu', path);
    await mkdir(cpu, { recursive: true });
    await writeFile(join(cpu, 'cpu.shares'), String(Math.max(2, Math.round((weight * 1024) / 100))));
    if (quota) {
      await writeFile(join(cpu, 'cpu.cfs_period_us'), String(PERIOD_US));
      await writeFile(join(cpu, 'cpu.cfs_quota_us'), String(quota));
    }
    const blkio = join(this.root, 'blkio', path);
    if (!existsSync(join(this.root, 'blkio'))) return;
    await mkdir(blkio, { recursive: true });
    for (const file of ['blkio.bfq.weight', 'blkio.weight'])
      if (existsSync(join(blkio, file)))
        await writeFile(join(blkio, file), String(Math.min(1000, Math.max(1, weight))));
  }

  /** Removes the group from every hierarchy that has it; one still holding a container (EBUSY) stays. */
  private async removeGroup(group: string): Promise<void> {
    const version = await this.setUp();
    // A container of the team made meanwhile (enter) keeps it.
    if (this.holders.has(group)) return;
    const path = `${this.opts.parent}/${group}`;
    const dirs =
      version === 'v2'
        ? [join(this.root, path)]
        : (await readdir(this.root)).map((h) => join(this.root, h, path)).filter((d) => existsSync(d));
    for (const dir of dirs)
      await rmdir(dir).catch((err: { code?: string }) => {
        if (err.code !== 'ENOENT' && err.code !== 'EBUSY') throw err;
      });
  }
}

/** Lets the group's children use the CPU, I/O, memory and pid controllers (cgroup v2; those the kernel has). */
async function enable(dir: string): Promise<void> {
  const have = (await readFile(join(dir, 'cgroup.controllers'), 'utf8')).split(/\s+/);
  const wanted = CONTROLLERS.filter((c) => have.includes(c));
  if (wanted.length) await writeFile(join(dir, 'cgroup.subtree_control'), wanted.map((c) => `+${c}`).join(' '));
}

/** Removes the parent group and its (empty) team groups from every hierarchy: for tests and benchmarks with a parent of their own. */
export async function removeCgroupTree(parent: string, root = '/sys/fs/cgroup'): Promise<void> {
  if (!NAME.test(parent)) throw new Error(`not a cgroup name: ${parent}`);
  const hierarchies = existsSync(join(root, 'cgroup.controllers')) ? [''] : await readdir(root);
  for (const h of hierarchies) {
    const dir = join(root, h, parent);
    if (!existsSync(dir)) continue;
    for (const e of await readdir(dir, { withFileTypes: true })) if (e.isDirectory()) await rmdir(join(dir, e.name));
    await rmdir(dir);
  }
}
