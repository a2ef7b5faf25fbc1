import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../apps/api/src/config.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { removeCgroupTree, teamGroup } from '../../apps/api/src/sandbox/docker/cgroups.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import type { SandboxContainer } from '../../apps/api/src/sandbox/backend.ts';
import type { SandboxRuntime } from '../../apps/api/src/workspace/settings.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const ROOT = '/sys/fs/cgroup';
const V2 = existsSync(join(ROOT, 'cgroup.controllers'));
// A parent of this test's own, so that it shares nothing with a server on this host.
const PARENT = `kiln-test-${process.pid}`;
const OWNER = `fair-share-test-${process.pid}`;
const limits = { memoryMb: 256, cpus: 1, pids: 128, timeoutS: 30, diskMb: 64 };

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
  const backend = new DockerBackend(docker, undefined, { parent: PARENT, parentWeight: 30, teamWeight: 200 });
  const made: SandboxContainer[] = [];
  let n = 0;
  const create = async (teamId: string, runtime: SandboxRuntime = 'runc') => {
    const c = await backend.create({
      image: process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest',
      sandboxId: `sbx_fairtest${process.pid}x${n++}`,
      owner: OWNER,
      teamId,
      sessionId: 'ses_fairtest',
      expiresAt: new Date(Date.now() + 600_000),
      limits,
      runtime,
    });
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
    const capped = new DockerBackend(docker, undefined, {
      parent: PARENT,
      parentWeight: 30,
      teamWeight: 200,
      teamCpus: 1,
    });
    const c = await capped.create({
      image: process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest',
      sandboxId: `sbx_fairtest${process.pid}cap`,
      owner: OWNER,
      teamId: 'team_capped',
      sessionId: 'ses_fairtest',
      expiresAt: new Date(Date.now() + 600_000),
      limits: { ...limits, cpus: 2 },
      runtime: 'runc',
    });
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
});

describe('fair share configuration', () => {
  it('is off by default; on, it names the parent and weights and keeps no warm containers', () => {
    expect(loadConfig({}).sandbox.fairShare).toBeUndefined();
    const on = loadConfig({ KILN_SANDBOX_FAIR_SHARE: 'on', KILN_SANDBOX_CPU_WEIGHT: '20' });
    expect(on.sandbox.fairShare).toEqual({ parent: 'kiln', parentWeight: 20, teamWeight: 100 });
    expect([on.sandbox.poolSize, on.sandbox.preparedPoolSize, on.templates.poolSize]).toEqual([0, 0, 0]);
    expect(() => loadConfig({ KILN_SANDBOX_FAIR_SHARE: 'on', KILN_SANDBOX_CGROUP: '../etc' })).toThrow(
      /KILN_SANDBOX_CGROUP/,
    );
  });
});
