import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxes, sandboxNodes } from '../../apps/api/src/db/schema/index.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { FleetBackend } from '../../apps/api/src/sandbox/node/fleet.ts';
import { issue, type KeyPair, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { RemoteBackend } from '../../apps/api/src/sandbox/node/remote.ts';
import { type RunningNode, startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { RunnerClient } from '../../apps/api/src/sandbox/runner-client.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const tag = randomBytes(3).toString('hex');
/** Node names of this file's own (its containers carry them), so that nothing else's are touched. */
const NODE_A = `pause-a-${tag}`;
const NODE_B = `pause-b-${tag}`;
const IDLE_S = 60;

/**
 * Paused sandboxes on a fleet (issue 28, item 7): a sandbox on a sandbox node is checkpointed on
 * that node's host and resumed there, through the node protocol; a node lost while it holds a
 * checkpoint loses it, and the session is told. The nodes are real node servers over the
 * machine's Docker Engine with gVisor, on loopback with mutual TLS.
 */
describe('paused sandboxes on sandbox nodes', () => {
  let now = Date.now();
  let t: TestApp;
  let fleet: FleetBackend;
  let team: { id: string; key: string };
  let ca: KeyPair;
  const nodes = new Map<string, RunningNode>();
  const onNode = (name: string) => new DockerBackend(docker, { node: name });
  const rowOf = async (id: string) => (await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, id)))[0]!;
  const gvisor = { sandbox: { runtime: 'gvisor', idle_s: IDLE_S } };
  const startOn = async (name: string, port = 0) => {
    const n = await startNode({
      backend: onNode(name),
      credentials: await issue(ca, { role: 'node', name, hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port,
    });
    nodes.set(name, n);
    return n;
  };
  /** The container of a sandbox on its node: whether it runs, or null when the node's engine has none. */
  const containerOf = async (containerId: string) => {
    const [node, id] = containerId.split('/') as [string, string];
    const [c] = await docker.listContainers({ all: true, filters: { id: [id], label: [`kiln.node=${node}`] } });
    return c ? { running: c.State === 'running' } : null;
  };

  beforeAll(async () => {
    await ensureSandboxImage();
    ca = await makeAuthority('fleet-pause-test');
    const replica = await issue(ca, { role: 'api', name: 'replica-1' });
    t = await createTestApp({
      sandbox: { poolSize: 0, perTeamMax: 20, now: () => now },
      env: { KILN_SANDBOX_PAUSED_TTL_S: '3600' },
      // Rounds only when the test asks (refresh), so that a node is declared lost exactly when it says.
      backend: (db) => (fleet = new FleetBackend({ db, credentials: replica, heartbeatMs: 3_600_000, lostGraceMs: 0 })),
    });
    for (const name of [NODE_A, NODE_B]) {
      const n = await startOn(name);
      const added = await t.call('POST', '/v1/system/nodes', { key: t.adminKey, body: { name, url: n.url } });
      expect(added.status).toBe(201);
      expect(added.body.runtimes).toContainEqual(expect.objectContaining({ runtime: 'gvisor' }));
    }
    team = await t.team('fleet-pause');
  });
  afterAll(async () => {
    // Paused sandboxes outlive their server by design: this file's go before it stops.
    for (const row of await t.database.db.select().from(sandboxes).where(eq(sandboxes.state, 'paused')))
      await t.engine.removeForTeam(row.teamId, row.id).catch(() => undefined);
    await t?.close();
    for (const n of nodes.values()) await n.close();
    for (const name of [NODE_A, NODE_B]) for (const c of await onNode(name).list()) await onNode(name).remove(c.id);
  });

  it('pauses a sandbox on its node (checkpoint on that host) and resumes it there with its variables, again and again', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const first = await exec(t, team.key, session, 'import os\nx = 41\nblob = os.urandom(20 * 2**20)');
    expect(first.error).toBeUndefined();
    const placed = (await rowOf(first.sandbox_id)).containerId;
    expect(placed.split('/')[0]).toMatch(/^pause-[ab]-/);

    const paused = await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key });
    expect(paused.status).toBe(200);
    const row = await rowOf(first.sandbox_id);
    expect(row).toMatchObject({ state: 'paused', containerId: placed });
    // The memory went to that host's disk (random bytes: nothing to leave out or compress).
    expect(row.checkpointBytes).toBeGreaterThan(20 * 2 ** 20);
    expect(await containerOf(placed)).toEqual({ running: false });

    const again = await exec(t, team.key, session, 'x += 1\nprint(x, len(blob))');
    expect(again.stdout).toBe(`42 ${20 * 2 ** 20}\n`);
    expect(again.restarted).toBe(false);
    expect(again.sandbox_id).toBe(first.sandbox_id);
    expect((again as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
    expect((await rowOf(first.sandbox_id)).containerId).toBe(placed);
    expect(await containerOf(placed)).toEqual({ running: true });

    // Paused at idle by the reaper, and resumed a second time on the same host.
    now += IDLE_S * 1000 + 1000;
    await t.engine.reap();
    expect(await rowOf(first.sandbox_id)).toMatchObject({ state: 'paused', removedReason: null });
    const third = await exec(t, team.key, session, 'x += 1\nprint(x)');
    expect(third.stdout).toBe('43\n');
    expect((third as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
  });

  it('a node lost while it holds a checkpoint: the session is told its variables are gone and gets a sandbox on another node; the node back, what it held is reaped', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const first = await exec(t, team.key, session, 'kept = "before"');
    const placed = (await rowOf(first.sandbox_id)).containerId;
    const [name] = placed.split('/') as [string];
    expect((await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key })).status).toBe(200);
    const node = nodes.get(name)!;
    await node.close();
    // No replica has heard from it for longer than the grace period (0 here): the next round declares it lost.
    await t.database.db
      .update(sandboxNodes)
      .set({ lastHeardAt: new Date(Date.now() - 60_000) })
      .where(eq(sandboxNodes.name, name));
    await fleet.refresh();
    expect(await rowOf(first.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'node_lost' });
    const got = await t.call('GET', `/v1/sessions/${session}`, { key: team.key });
    expect(got.status).toBe(200);
    expect(got.body.sandbox).toBeNull();

    const next = await exec(t, team.key, session, 'print(globals().get("kept"))');
    expect(next).toMatchObject({ stdout: 'None\n', restarted: true, restart_reason: 'node_lost' });
    const moved = (await rowOf(next.sandbox_id)).containerId;
    expect(moved.split('/')[0]).not.toBe(name);

    // Back at its address: the paused container it still holds was replaced, and the reaper removes it.
    expect(await containerOf(placed)).toEqual({ running: false });
    await startOn(name, node.port);
    await fleet.refresh();
    await t.engine.reap();
    expect(await containerOf(placed)).toBeNull();
  });

  it('a paused sandbox on a node outlives the replica that paused it: another takes it over with its variables, and the first, back, leaves it alone', async () => {
    const instance = `fleet-pause-a-${tag}`;
    const credentials = await issue(ca, { role: 'api', name: 'replica-a' });
    const fleets: FleetBackend[] = [];
    const replicaA = async () => {
      const app = await createTestApp({
        replicaOf: t,
        sandbox: { poolSize: 0, perTeamMax: 20, now: () => now },
        env: { KILN_INSTANCE_ID: instance, KILN_SANDBOX_PAUSED_TTL_S: '3600' },
        backend: (db) => {
          const f = new FleetBackend({ db, credentials, heartbeatMs: 3_600_000, lostGraceMs: 0 });
          fleets.push(f);
          return f;
        },
      });
      await fleets.at(-1)!.refresh();
      return app;
    };
    const a = await replicaA();
    let back: TestApp | undefined;
    const { session } = await sessionIn(a, team, gvisor);
    try {
      const first = await exec(a, team.key, session, 'kept = "across replicas"');
      expect((await a.call('POST', `/v1/sessions/${session}/pause`, { key: team.key })).status).toBe(200);
      const placed = (await rowOf(first.sandbox_id)).containerId;
      // Replica A goes for good (no pause at shutdown in tests: what it paused stays paused, on the node).
      await a.close();
      expect(await rowOf(first.sandbox_id)).toMatchObject({ state: 'paused', instance: instance });

      // The next execution reaches another replica (A is not heard from), which resumes it on its node.
      const resumed = await exec(t, team.key, session, 'print(kept)');
      expect(resumed).toMatchObject({ stdout: 'across replicas\n', restarted: false, sandbox_id: first.sandbox_id });
      const row = await rowOf(first.sandbox_id);
      expect(row.state).toBe('ready');
      expect(row.instance).not.toBe(instance);
      expect(await containerOf(placed)).toEqual({ running: true });

      // A back with the same instance id: the container still carries A's label, yet it is not A's.
      back = await replicaA();
      await back.engine.reap();
      expect(await containerOf(placed)).toEqual({ running: true });
      expect(await exec(t, team.key, session, 'print(kept)')).toMatchObject({
        stdout: 'across replicas\n',
        restarted: false,
      });
    } finally {
      await t.engine.release(session, 'test_done');
      await back?.close();
      for (const f of fleets) f.close();
    }
  });

  it('a node keeps a paused container past its hard lifetime (the replicas keep its paused time), and a resumed one until its moved lifetime', async () => {
    const name = `pause-c-${tag}`;
    const backend = onNode(name);
    const credentials = await issue(ca, { role: 'node', name, hosts: ['127.0.0.1'] });
    const node = await startNode({ backend, credentials, host: '127.0.0.1', port: 0, maxPausedMs: 3_600_000 });
    const remote = new RemoteBackend({
      url: node.url,
      name,
      credentials: await issue(ca, { role: 'api', name: 'replica-1' }),
    });
    try {
      const c = await remote.create({
        image: await ensureSandboxImage(),
        sandboxId: `sbx_nodepause${randomBytes(4).toString('hex')}`,
        instance: `fleet-pause-${tag}`,
        teamId: '',
        sessionId: '',
        // Its hard lifetime is already over: only the pause keeps it.
        expiresAt: new Date(Date.now() - 1000),
        limits: { memoryMb: 256, cpus: 1, pids: 128, timeoutS: 30, diskMb: 64 },
        runtime: 'gvisor',
        pausable: true,
      });
      expect(c.pausable).toBe(true);
      await remote.start(c);
      const client = await RunnerClient.start(await remote.attachRunner(c), 30_000, true);
      const opts = { timeoutMs: 10_000, maxOutputBytes: 1000 };
      await client.exec('n = 7', opts);
      const key = client.signingKey!;
      await client.detach();
      const { bytes } = await remote.pause(c);
      expect(bytes).toBeGreaterThan(0);
      expect((await backend.list()).find((l) => l.id === c.id)).toMatchObject({ stopped: true });
      expect(await node.reap()).toBe(0);

      const ends = Date.now() + 600_000;
      const resumed = await RunnerClient.reattach(await remote.resume(c, ends), key);
      expect((await resumed.exec('print(n)', opts)).stdout).toBe('7\n');
      // Running again, past its label's lifetime but within the one the resume moved on.
      expect(await node.reap()).toBe(0);
      resumed.close();

      // The node restarted (a new process: a backend and a node of its own) still knows the moved
      // lifetime, kept beside the engine's data: its reaper leaves the running sandbox alone.
      await node.close();
      const restarted = onNode(name);
      expect((await restarted.list()).find((l) => l.id === c.id)).toMatchObject({ expiresAt: ends });
      const other = await startNode({ backend: restarted, credentials, host: '127.0.0.1', port: 0 });
      try {
        expect(await other.reap()).toBe(0);
      } finally {
        await other.close();
      }
      // What is kept goes with the container, also one removed behind the node's back.
      const kept = join((await docker.info()).DockerRootDir, 'kiln-lifetimes', c.id);
      expect(Number(readFileSync(kept, 'utf8'))).toBe(ends);
      await docker.getContainer(c.id).remove({ force: true });
      expect((await restarted.list()).map((l) => l.id)).not.toContain(c.id);
      expect(existsSync(kept)).toBe(false);
    } finally {
      remote.close();
      await node.close();
      for (const l of await backend.list()) await backend.remove(l.id);
    }
  });
});
