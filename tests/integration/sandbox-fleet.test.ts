import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { like } from 'drizzle-orm';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { loadConfig } from '../../apps/api/src/config.ts';
import { DockerBackend, type DockerBackendOptions, egressOf } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { FleetBackend } from '../../apps/api/src/sandbox/node/fleet.ts';
import { issue, type KeyPair, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { type RunningNode, startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { createTestApp, type TestApp } from '../support/app.ts';

/**
 * The API placing sandboxes on a fleet of two sandbox nodes (each a real node process's server
 * over its own slice of the Docker Engine, on loopback with mutual TLS): the registry routes,
 * placement that spreads a team, exec through a node, drain, removal, and a full fleet's 429.
 * (Nodes on hosts of their own, with their own engines, are the next step: docs/scaling.md.)
 */
// Each node's containers on the shared engine carry a label of this file's own (the node's name and
// a tag): other files' nodes are also called node-a, and their clean-up (or reaper) must never
// touch this file's containers, nor this file's theirs.
const tag = randomBytes(3).toString('hex');
const onEngine = (name: string, o: Omit<DockerBackendOptions, 'node'> = {}) =>
  new DockerBackend(connectDocker(process.env.DOCKER_HOST), { ...o, node: `${name}-${tag}` });

describe('sandboxes on a fleet of nodes', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  let ws: string;
  const nodes: RunningNode[] = [];
  const url: Record<string, string> = {};
  let ca: KeyPair;
  /** Sessions made after the first four (on node-b once node-a drains). */
  const extra: string[] = [];

  beforeAll(async () => {
    await ensureSandboxImage();
    ca = await makeAuthority('fleet-test');
    // node-a may give sandboxes 4 GiB, node-b only 1.5 GiB.
    for (const [name, memoryMb] of [
      ['node-a', 4096],
      ['node-b', 1536],
    ] as const) {
      const n = await startNode({
        backend: onEngine(name),
        credentials: await issue(ca, { role: 'node', name, hosts: ['127.0.0.1'] }),
        host: '127.0.0.1',
        port: 0,
        reserve: { memoryMb },
      });
      nodes.push(n);
      url[name] = n.url;
    }
    const replica = await issue(ca, { role: 'api', name: 'replica-1' });
    t = await createTestApp({ backend: (db) => new FleetBackend({ db, credentials: replica }) });
    team = await t.team('fleet');
    ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'placed' } })).body.id;
  });
  afterAll(async () => {
    await t?.close();
    for (const n of nodes) await n.close();
    // What a dead node left on the engine.
    for (const name of ['node-a', 'node-b', 'node-c']) {
      const left = onEngine(name);
      for (const c of await left.list()) await left.remove(c.id);
    }
  });

  const exec = async (session: string) =>
    t.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(6 * 7)' } });
  const newSession = async () =>
    (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key })).body.id as string;
  const nodeOf = async (session: string) => {
    const rows = await t.database.db.select().from(sandboxes).where(like(sandboxes.sessionId, session));
    return rows.find((r) => r.state !== 'removed')?.containerId.split('/')[0];
  };
  const sessions: string[] = [];

  it('registers nodes (org admins only, audited); each is heard at once with what its host offers', async () => {
    const add = (key: string | undefined, name: string) =>
      t.call('POST', '/v1/system/nodes', { key: key ?? t.adminKey, body: { name, url: url[name] } });
    expect((await add(team.key, 'node-a')).status).toBe(403);
    const a = await add(undefined, 'node-a');
    expect(a.status).toBe(201);
    expect(a.body).toMatchObject({ name: 'node-a', state: 'active', health: 'heard', capacity: { memory_mb: 4096 } });
    expect(a.body.runtimes.map((r: { runtime: string }) => r.runtime)).toContain('runc');
    expect((await add(undefined, 'node-b')).status).toBe(201);
    expect((await add(undefined, 'node-b')).status).toBe(409);
    const bad = await t.call('POST', '/v1/system/nodes', {
      key: t.adminKey,
      body: { name: 'Node C', url: 'http://10.0.0.1:7443' },
    });
    expect(bad.status).toBe(400);
    const reserved = await t.call('POST', '/v1/system/nodes', {
      key: t.adminKey,
      body: { name: 'local', url: 'https://10.0.0.1:7443' },
    });
    expect(reserved.status).toBe(400);
    expect(reserved.body.error.message).toMatch(/own engine/);
    const listed = (await t.call('GET', '/v1/system/nodes', { key: t.adminKey })).body.data;
    expect(listed.map((n: { name: string; health: string }) => [n.name, n.health])).toEqual([
      ['node-a', 'heard'],
      ['node-b', 'heard'],
    ]);
    const audit = (await t.call('GET', '/v1/audit?limit=50', { key: t.adminKey })).body.data.map(
      (e: { action: string }) => e.action,
    );
    expect(audit.filter((a: string) => a === 'system.node.add')).toHaveLength(2);
  });

  it('places a team’s sessions across the nodes and runs their code through them', async () => {
    for (let i = 0; i < 4; i++) sessions.push(await newSession());
    for (const s of sessions) expect((await exec(s)).body).toMatchObject({ exit_code: 0, stdout: '42\n' });
    const placed = await Promise.all(sessions.map(nodeOf));
    expect(placed.filter((n) => n === 'node-a')).toHaveLength(2);
    expect(placed.filter((n) => n === 'node-b')).toHaveLength(2);
    // Variables live in the node's sandbox between executions.
    await t.call('POST', `/v1/sessions/${sessions[0]}/exec`, { key: team.key, body: { code: 'x = 5' } });
    const again = await t.call('POST', `/v1/sessions/${sessions[0]}/exec`, {
      key: team.key,
      body: { code: 'print(x)' },
    });
    expect(again.body.stdout).toBe('5\n');
    // The engine's own containers and each node's stay apart: a backend with no node name lists none of these.
    const inner = (await t.database.db.select().from(sandboxes).where(like(sandboxes.containerId, 'node-%')))
      .filter((r) => r.state !== 'removed')
      .map((r) => r.containerId.split('/')[1]!);
    expect(inner).toHaveLength(4);
    const plain = (await new DockerBackend(connectDocker(process.env.DOCKER_HOST)).list()).map((c) => c.id);
    for (const id of inner) expect(plain).not.toContain(id);
    const onA = (await onEngine('node-a').list()).map((c) => c.id);
    expect(inner.filter((id) => onA.includes(id))).toHaveLength(2);
    const view = (await t.call('GET', '/v1/system/nodes', { key: t.adminKey })).body.data;
    for (const n of view) expect(n).toMatchObject({ sandboxes: 2, committed: { memory_mb: 1024 } });
    // /metrics tells the same, read from the registry at the scrape.
    const scrape = await (
      await t.app.request('/metrics', { headers: { authorization: `Bearer ${t.adminKey}` } })
    ).text();
    expect(scrape).toContain('kiln_sandbox_node_up{node="node-a"} 1');
    expect(scrape).toContain('kiln_sandbox_node_sandboxes{node="node-b"} 2');
    expect(scrape).toContain('kiln_sandbox_node_memory_mb{node="node-b",of="capacity"} 1536');
    expect(scrape).toContain('kiln_sandbox_node_memory_mb{node="node-b",of="committed"} 1024');
  });

  it('a drained node takes no new sandboxes; it is removed only once it has none; a full fleet is a 429 that says so', async () => {
    const drained = await t.call('POST', '/v1/system/nodes/node-a/drain', { key: t.adminKey });
    expect(drained.body).toMatchObject({ state: 'draining', sandboxes: 2 });
    // node-b has 1536 MB for sandboxes and 1024 placed: one more 512 MB sandbox fits, then none.
    const s5 = await newSession();
    extra.push(s5);
    expect((await exec(s5)).body.stdout).toBe('42\n');
    expect(await nodeOf(s5)).toBe('node-b');
    const s6 = await newSession();
    const full = await exec(s6);
    expect(full.status).toBe(429);
    expect(full.body.error.code).toBe('sandbox_unavailable');
    expect(full.body.error.message).toMatch(/every sandbox node that runs runc is full/);

    const early = await t.call('DELETE', '/v1/system/nodes/node-a', { key: t.adminKey });
    expect(early.status).toBe(409);
    expect(early.body.error.message).toMatch(/still has 2 sandbox/);
    // Its sessions end; their sandboxes go, and the node can be forgotten.
    for (const s of sessions)
      if ((await nodeOf(s)) === 'node-a') await t.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
    const gone = await t.call('DELETE', '/v1/system/nodes/node-a', { key: t.adminKey });
    expect(gone.status).toBe(200);
    expect(
      (await t.call('GET', '/v1/system/nodes', { key: t.adminKey })).body.data.map((n: { name: string }) => n.name),
    ).toEqual(['node-b']);
    const audit = (await t.call('GET', '/v1/audit?limit=100', { key: t.adminKey })).body.data.map(
      (e: { action: string }) => e.action,
    );
    expect(audit).toEqual(expect.arrayContaining(['system.node.drain', 'system.node.remove']));
  });

  it('a node that dies mid-session: the next exec of each of its sessions says the variables are gone and runs on another node; nothing answers 500', async () => {
    const c = await startNode({
      // node-c has an egress proxy of its own (on its engine), as a node with KILN_EGRESS on does.
      backend: onEngine('node-c', { egress: egressOf(loadConfig()) }),
      credentials: await issue(ca, { role: 'node', name: 'node-c', hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
    });
    nodes.push(c);
    expect(
      (await t.call('POST', '/v1/system/nodes', { key: t.adminKey, body: { name: 'node-c', url: c.url } })).status,
    ).toBe(201);
    const onB: string[] = [];
    for (const s of [...sessions, ...extra]) if ((await nodeOf(s)) === 'node-b') onB.push(s);
    expect(onB.length).toBeGreaterThan(0);
    await t.call('POST', `/v1/sessions/${onB[0]}/exec`, { key: team.key, body: { code: 'y = 1' } });
    // node-b's process dies (its containers stay behind on the engine, unreachable).
    await nodes[1]!.close();
    for (const s of onB) {
      const first = await t.call('POST', `/v1/sessions/${s}/exec`, { key: team.key, body: { code: 'print(6 * 7)' } });
      expect(first.status).toBe(200);
      // The code ran, in a new sandbox on a live node, and the answer says the variables are gone.
      expect(first.body).toMatchObject({ restarted: true, exit_code: 0, stdout: '42\n' });
      const next = await t.call('POST', `/v1/sessions/${s}/exec`, {
        key: team.key,
        body: { code: 'print(globals().get("y"), 6 * 7)' },
      });
      expect(next.status).toBe(200);
      expect(next.body.stdout).toBe('None 42\n');
      expect(await nodeOf(s)).toBe('node-c');
    }

    // node-b comes back at its address: what it still holds was replaced, and the reaper removes it.
    const port = Number(new URL(url['node-b']!).port);
    const leftOnB = onEngine('node-b');
    expect((await leftOnB.list()).length).toBeGreaterThan(0);
    nodes[1] = await startNode({
      backend: leftOnB,
      credentials: await issue(ca, { role: 'node', name: 'node-b', hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port,
    });
    await t.engine.reap();
    expect(await leftOnB.list()).toEqual([]);
    // Sessions on node-c were not touched.
    const onC = await t.call('POST', `/v1/sessions/${onB[0]}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(onC.body).toMatchObject({ stdout: '1\n' });
    expect(onC.body.restarted).toBeFalsy();
  });

  it('an allowlist sandbox on a node goes through that node’s egress proxy, which applies its rules; the log comes back through the node', async () => {
    const ws2 = (
      await t.call('POST', '/v1/workspaces', {
        key: team.key,
        body: {
          name: 'egress-on-node',
          settings: { sandbox: { network: 'allowlist', allow: ['api.allowed.test'], runtime: 'runc' } },
        },
      })
    ).body.id;
    const s = (await t.call('POST', `/v1/workspaces/${ws2}/sessions`, { key: team.key })).body.id as string;
    const r = await t.call('POST', `/v1/sessions/${s}/exec`, {
      key: team.key,
      body: {
        code: 'import urllib.request\ntry:\n    urllib.request.urlopen("http://other.refused.test/", timeout=10)\nexcept Exception as e:\n    print(getattr(e, "code", type(e).__name__))',
      },
    });
    expect(r.status).toBe(200);
    // node-b came back without a proxy: only node-c can take an allowlist sandbox.
    expect(await nodeOf(s)).toBe('node-c');
    expect(r.body.stdout).toBe('403\n');
    expect(r.body.egress).toEqual([
      expect.objectContaining({ host: 'other.refused.test', allowed: false, status: 403 }),
    ]);
  });

  it('a container another replica left running after its row was marked removed (a node declared lost) is reaped by any replica', async () => {
    const s = await newSession();
    expect((await exec(s)).body.stdout).toBe('42\n');
    const [row] = (await t.database.db.select().from(sandboxes).where(like(sandboxes.sessionId, s))).filter(
      (r) => r.state !== 'removed',
    );
    const [node, inner] = row!.containerId.split('/') as [string, string];
    // What declaring a node lost does to the row while its container still runs somewhere.
    await t.database.db
      .update(sandboxes)
      .set({ state: 'removed', removedReason: 'node_lost' })
      .where(like(sandboxes.id, row!.id));
    const onNode = onEngine(node);
    expect((await onNode.list()).map((c) => c.id)).toContain(inner);
    // A second replica, which never had it: it is not its own and not past its lifetime, but its row says removed.
    const replica = await issue(ca, { role: 'api', name: 'replica-2' });
    const other = await createTestApp({
      replicaOf: t,
      backend: (db) => new FleetBackend({ db, credentials: replica }),
    });
    try {
      await other.engine.reap();
      expect((await onNode.list()).map((c) => c.id)).not.toContain(inner);
    } finally {
      await other.close();
    }
    // The session goes on in a new sandbox.
    expect((await exec(s)).body).toMatchObject({ restarted: true, stdout: '42\n' });
  });
});
