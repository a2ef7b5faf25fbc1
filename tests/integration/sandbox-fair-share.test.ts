import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../apps/api/src/config.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { removeCgroupTree, teamGroup } from '../../apps/api/src/sandbox/docker/cgroups.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import type { ContainerRequest, SandboxContainer } from '../../apps/api/src/sandbox/backend.ts';
import type { SandboxRuntime } from '../../apps/api/src/workspace/settings.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const ROOT = '/sys/fs/cgroup';
const V2 = existsSync(join(ROOT, 'cgroup.controllers'));
// A parent of this test's own, so that it shares nothing with a server on this host.
const PARENT = `kiln-test-${process.pid}`;
const OWNER = `fair-share-test-${process.pid}`;
const limits = { memoryMb: 256, cpus: 1, pids: 128, timeoutS: 30, diskMb: 64 };

/** A container request of this test: its own owner and sandbox id, for `teamId`. */
const requestFor = (suffix: string, teamId: string, over: Partial<ContainerRequest> = {}): ContainerRequest => ({
  image: process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest',
  sandboxId: `sbx_fairtest${process.pid}${suffix}`,
  instance: OWNER,
  teamId,
  sessionId: 'ses_fairtest',
  expiresAt: new Date(Date.now() + 600_000),
  limits,
  runtime: 'runc',
  ...over,
});

/** Where the CPU weight of a group (a path under the parent) is, and its value in cgroup v2 units. */
function cpuWeight(group: string): number {
  if (V2) return Number(readFileSync(join(ROOT, PARENT, group, 'cpu.weight'), 'utf8'));
  return Math.round((Number(readFileSync(join(ROOT, 'cpu', PARENT, group, 'cpu.shares'), 'utf8')) * 100) / 1024);
}
const groupDir = (group: string) => (V2 ? join(ROOT, PARENT, group) : join(ROOT, 'cpu', PARENT, group));

/** The CPU cgroup of the container's main process, as the kernel reports it. */
async function cgroupOf(id: string): Promise<string> {
  const { State } = await docker.getContainer(id).inspect();
  const lines = readFileSync(`/proc/${State.Pid}/cgroup`, 'utf8').trim().split('\n');
  const line = V2 ? lines.find((l) => l.startsWith('0::')) : lines.find((l) => /^\d+:cpu(,[^:]*)?:/.test(l));
  return line!.split(':')[2]!;
}

describe('fair share: each team in a cgroup of its own under one parent (KILN_SANDBOX_FAIR_SHARE=on)', () => {
  const backend = new DockerBackend(docker, { fairShare: { parent: PARENT, parentWeight: 30, teamWeight: 200 } });
  const made: SandboxContainer[] = [];
  let n = 0;
  const create = async (teamId: string, runtime: SandboxRuntime = 'runc') => {
    const c = await backend.create(requestFor(`x${n++}`, teamId, { runtime }));
    made.push(c);
    await backend.start(c);
    return c;
  };
  const remove = async (c: SandboxContainer) => {
    await backend.remove(c.id);
    made.splice(made.indexOf(c), 1);
  };

  afterAll(async () => {
    for (const c of made) await backend.remove(c.id).catch(() => undefined);
    const left = await docker.listContainers({ all: true, filters: { label: [`kiln.owner=${OWNER}`] } });
    for (const c of left) await docker.getContainer(c.Id).remove({ force: true });
    await removeCgroupTree(PARENT);
  });

  it("puts a team's sandboxes in its group, another team's in another, with the configured weights", async () => {
    const a1 = await create('team_alpha');
    const a2 = await create('team_alpha');
    const b = await create('team_beta');
    const [ga, gb] = [teamGroup('team_alpha'), teamGroup('team_beta')];
    expect(ga).not.toBe(gb);
    expect(await cgroupOf(a1.id)).toBe(`/${PARENT}/${ga}/${a1.id}`);
    expect(await cgroupOf(a2.id)).toBe(`/${PARENT}/${ga}/${a2.id}`);
    expect(await cgroupOf(b.id)).toBe(`/${PARENT}/${gb}/${b.id}`);
    expect(cpuWeight('')).toBe(30);
    expect(cpuWeight(ga)).toBe(200);
    expect(cpuWeight(gb)).toBe(200);
  });

  it("keeps a team's group while it has a sandbox, removes it with the last, and makes it again for the next", async () => {
    const [a1, a2] = made.filter((c) => c.id !== made[2]!.id);
    const ga = teamGroup('team_alpha');
    await remove(a1!);
    expect(existsSync(groupDir(ga))).toBe(true);
    await remove(a2!);
    expect(existsSync(groupDir(ga))).toBe(false);
    const again = await create('team_alpha');
    expect(await cgroupOf(again.id)).toBe(`/${PARENT}/${ga}/${again.id}`);
    expect(cpuWeight(ga)).toBe(200);
  });

  it('a team group another process removed between its making and the start (its sweep, its last sandbox leaving) gets its weight back', async () => {
    const c = await backend.create(requestFor(`x${n++}`, 'team_swept'));
    made.push(c);
    const group = teamGroup('team_swept');
    expect(cpuWeight(group)).toBe(200);
    // What another replica on this engine does to a team group it sees empty.
    for (const dir of V2 ? [join(ROOT, PARENT, group)] : readdirSync(ROOT).map((h) => join(ROOT, h, PARENT, group)))
      if (existsSync(dir)) rmdirSync(dir);
    expect(existsSync(groupDir(group))).toBe(false);
    // The runtime makes the group again at the start, with the kernel's default weight; the backend its own.
    await backend.start(c);
    expect(await cgroupOf(c.id)).toBe(`/${PARENT}/${group}/${c.id}`);
    expect(cpuWeight(group)).toBe(200);
    await remove(c);
  });

  it('names groups by a hash of the team id: a hostile id makes no path outside the parent', async () => {
    const hostile = '../../../escape';
    expect(teamGroup(hostile)).toMatch(/^team-[0-9a-f]{16}$/);
    const c = await create(hostile);
    expect(await cgroupOf(c.id)).toBe(`/${PARENT}/${teamGroup(hostile)}/${c.id}`);
    expect(existsSync(V2 ? join(ROOT, 'escape') : join(ROOT, 'cpu', 'escape'))).toBe(false);
    await remove(c);
    expect(existsSync(groupDir(teamGroup(hostile)))).toBe(false);
  });

  it("caps a team's CPUs together when configured, and no sandbox of it above the cap", async () => {
    const capped = new DockerBackend(docker, {
      fairShare: {
        parent: PARENT,
        parentWeight: 30,
        teamWeight: 200,
        teamCpus: 1,
      },
    });
    const c = await capped.create(requestFor('cap', 'team_capped', { limits: { ...limits, cpus: 2 } }));
    try {
      await capped.start(c);
      const group = teamGroup('team_capped');
      expect(await cgroupOf(c.id)).toBe(`/${PARENT}/${group}/${c.id}`);
      const max = V2
        ? readFileSync(join(groupDir(group), 'cpu.max'), 'utf8').trim()
        : `${readFileSync(join(groupDir(group), 'cpu.cfs_quota_us'), 'utf8').trim()} ${readFileSync(join(groupDir(group), 'cpu.cfs_period_us'), 'utf8').trim()}`;
      expect(max).toBe('100000 100000');
      expect((await docker.getContainer(c.id).inspect()).HostConfig.NanoCpus).toBe(1e9);
    } finally {
      await capped.remove(c.id);
    }
    expect(existsSync(groupDir(teamGroup('team_capped')))).toBe(false);
  });

  it("holds a gVisor sandbox's whole sandbox (sentry and gofer) in its team's group", async () => {
    const c = await create('team_gamma', 'gvisor');
    const { State } = await docker.getContainer(c.id).inspect();
    // The container's main process runs inside gVisor; on the host, every runsc process of this container is in its group.
    expect(State.Running).toBe(true);
    const pids = readFileSync(join(groupDir(`${teamGroup('team_gamma')}/${c.id}`), 'cgroup.procs'), 'utf8')
      .trim()
      .split('\n');
    const comms = pids.map((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[0]);
    expect(comms).toEqual(expect.arrayContaining(['runsc-sandbox', 'runsc-gofer']));
    await remove(c);
  });

  it('a backend starting up removes the empty team groups a killed process left, never one that holds a container', async () => {
    const live = await create('team_live');
    const leftover = teamGroup('team_killed');
    mkdirSync(groupDir(leftover), { recursive: true });
    const next = new DockerBackend(docker, { fairShare: { parent: PARENT, parentWeight: 30, teamWeight: 200 } });
    expect((await next.capabilities()).teamBound).toBe(true);
    expect(existsSync(groupDir(leftover))).toBe(false);
    expect(await cgroupOf(live.id)).toBe(`/${PARENT}/${teamGroup('team_live')}/${live.id}`);
    await remove(live);
  });
});

describe('fair share through the API: warm containers made in the team group of the teams that claimed last', () => {
  const parent = `kiln-test-api-${process.pid}`;
  let t: TestApp;
  let replica: TestApp | undefined;
  const env = {
    KILN_SANDBOX_FAIR_SHARE: 'on',
    KILN_SANDBOX_CGROUP: parent,
    KILN_SANDBOX_POOL_SIZE: '2',
  };

  beforeAll(async () => {
    t = await createTestApp({ env });
    await t.engine.poolSettled();
  });
  afterAll(async () => {
    await replica?.close();
    await t?.close();
    await removeCgroupTree(parent);
  });

  /** This app's containers that no session of these teams holds: the warm pool, with each one's team and cgroup. */
  const warm = async (app: TestApp, teams: { key: string }[]) => {
    const owner = (app.engine as unknown as { opts: { instance: string } }).opts.instance;
    const live = new Set<string>();
    for (const team of teams)
      for (const s of (await app.call('GET', '/v1/sandboxes', { key: team.key })).body.data) live.add(s.id);
    const listed = await docker.listContainers({ filters: { label: [`kiln.owner=${owner}`] } });
    return Promise.all(
      listed
        .filter((c) => !live.has(c.Labels['kiln.sandbox']!))
        .map(async (c) => ({
          team: c.Labels['kiln.team'],
          sandbox: c.Labels['kiln.sandbox'],
          cgroup: await cgroupOf(c.Id),
        })),
    );
  };

  it("claims a warm container made in its team's group; another team's first sandbox starts cold in its own", async () => {
    const [a, b] = [await t.team('fair-a'), await t.team('fair-b')];
    expect(await warm(t, [a, b])).toEqual([]);
    const first = await exec(t, a.key, (await sessionIn(t, a)).session, 'print(1)');
    expect(first.stdout).toBe('1\n');
    await t.engine.poolSettled();
    const made = await warm(t, [a, b]);
    expect(made).toHaveLength(2);
    for (const w of made) {
      expect(w.team).toBe(a.id);
      expect(w.cgroup).toMatch(new RegExp(`^/${parent}/${teamGroup(a.id)}/[0-9a-f]{64}$`));
    }
    const second = await exec(t, a.key, (await sessionIn(t, a)).session, 'print(2)');
    expect(made.map((w) => w.sandbox)).toContain(second.sandbox_id);

    const other = await exec(t, b.key, (await sessionIn(t, b)).session, 'print(3)');
    expect(made.map((w) => w.sandbox)).not.toContain(other.sandbox_id);
    const [c] = await docker.listContainers({ filters: { label: [`kiln.sandbox=${other.sandbox_id}`] } });
    expect(await cgroupOf(c!.Id)).toBe(`/${parent}/${teamGroup(b.id)}/${c!.Id}`);
    await t.engine.poolSettled();
    expect((await warm(t, [a, b])).map((w) => w.team).sort()).toEqual([a.id, b.id].sort());

    // A replica started later makes its warm containers for the teams that started sandboxes last.
    replica = await createTestApp({ env, replicaOf: t });
    await replica.engine.poolSettled();
    const seeded = await warm(replica, [a, b]);
    expect(seeded.map((w) => w.team).sort()).toEqual([a.id, b.id].sort());
    for (const w of seeded) expect(w.cgroup.startsWith(`/${parent}/${teamGroup(w.team!)}/`)).toBe(true);
  });
});

describe('fair share configuration', () => {
  // A backend that decides `auto` here makes the test's parent group again: it goes too.
  afterAll(() => removeCgroupTree(PARENT));

  it('is auto by default: on where the host allows it, with warm containers; off turns it off; a bad name is refused', () => {
    const auto = loadConfig({});
    expect(auto.sandbox.fairShare).toEqual({ parent: 'kiln', parentWeight: 50, teamWeight: 100, auto: true });
    expect([auto.sandbox.poolSize, auto.sandbox.preparedPoolSize, auto.templates.poolSize]).toEqual([2, 2, 1]);
    expect(loadConfig({ KILN_SANDBOX_FAIR_SHARE: 'off' }).sandbox.fairShare).toBeUndefined();
    const on = loadConfig({ KILN_SANDBOX_FAIR_SHARE: 'on', KILN_SANDBOX_CPU_WEIGHT: '20' });
    expect(on.sandbox.fairShare).toEqual({ parent: 'kiln', parentWeight: 20, teamWeight: 100, auto: false });
    expect(() => loadConfig({ KILN_SANDBOX_FAIR_SHARE: 'on', KILN_SANDBOX_CGROUP: '../etc' })).toThrow(
      /KILN_SANDBOX_CGROUP/,
    );
  });

  it('auto: on this host (local engine, cgroupfs, root) it binds containers to their team; where it cannot make its group, it is off and says why', async () => {
    const here = new DockerBackend(docker, {
      fairShare: {
        parent: PARENT,
        parentWeight: 50,
        teamWeight: 100,
        auto: true,
      },
    });
    expect((await here.capabilities()).teamBound).toBe(true);
    const warnings: unknown[] = [];
    const log = { warn: (o: unknown) => warnings.push(o), info: () => undefined } as unknown as Logger;
    const nowhere = new DockerBackend(docker, {
      fairShare: {
        parent: PARENT,
        parentWeight: 50,
        teamWeight: 100,
        auto: true,
        root: '/nonexistent-cgroup-root',
        log,
      },
    });
    expect((await nowhere.capabilities()).teamBound).toBe(false);
    expect(warnings).toEqual([{ reason: 'no cgroup file system at /nonexistent-cgroup-root' }]);
    // Its sandboxes stay in Docker's default parent, each with its own limits.
    const c = await nowhere.create(requestFor('auto', 'team_auto'));
    try {
      expect((await docker.getContainer(c.id).inspect()).HostConfig.CgroupParent).toBe('');
    } finally {
      await nowhere.remove(c.id);
    }
  });
});
