import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { FleetBackend } from '../../apps/api/src/sandbox/node/fleet.ts';
import { issue, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { type RunningNode, startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { TreeStore } from '../../apps/api/src/sandbox/node/tree-store.ts';
import type { TreeEntry } from '../../apps/api/src/sandbox/tree-sync.ts';
import { WorkspaceMounts } from '../../apps/api/src/sandbox/workspace-mounts.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { createTestApp, type TestApp } from '../support/app.ts';

/**
 * A TreeStore that also says what each fill received (the real one, with the real files), and
 * can run something right after it has said what it wants: before the API reads those files.
 */
class CountingStore extends TreeStore {
  readonly fills: { files: number; bytes: number }[] = [];
  readonly stale: string[] = [];
  afterWants: (() => void) | undefined;
  override async wants(...args: Parameters<TreeStore['wants']>) {
    const wanted = await super.wants(...args);
    const hook = this.afterWants;
    this.afterWants = undefined;
    hook?.();
    return wanted;
  }
  override async fill(...args: Parameters<TreeStore['fill']>) {
    try {
      const got = await super.fill(...args);
      this.fills.push(got);
      return got;
    } catch (err) {
      this.stale.push((err as Error).message);
      throw err;
    }
  }
}

const NODE = 'node-trees';

/**
 * A sandbox node that keeps workspace trees (tree-store.ts): each new sandbox of a workspace on
 * that node gets /workspace as a mount of the node's host, filled from the node's copy of the
 * workspace after the API sent only the files that changed. Real node server over mutual TLS,
 * real Docker Engine, real git workspaces.
 */
describe('a sandbox node keeps each workspace’s tree and is sent only what changed', () => {
  let t: TestApp;
  let creds: Awaited<ReturnType<typeof issue>>;
  let node: RunningNode;
  let store: CountingStore;
  let team: { id: string; key: string };
  let ws: string;
  const dir = mkdtempSync(join(tmpdir(), 'kiln-node-trees-'));
  const mountsRoot = join(dir, 'mounts');

  beforeAll(async () => {
    await ensureSandboxImage();
    const ca = await makeAuthority('trees-test');
    const log = pino({ level: 'silent' });
    const backend = new DockerBackend(connectDocker(process.env.DOCKER_HOST), { node: NODE });
    const mounts = await WorkspaceMounts.open(
      { mode: 'on', dir: mountsRoot, maxMb: 4096, hostMounts: true },
      NODE,
      log,
    );
    store = new CountingStore(join(dir, 'trees'), 1 << 30, log);
    node = await startNode({
      backend,
      credentials: await issue(ca, { role: 'node', name: NODE, hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
      trees: { mounts: mounts!, store },
    });
    const replica = await issue(ca, { role: 'api', name: 'replica-1' });
    creds = await issue(ca, { role: 'api', name: 'replica-2' });
    t = await createTestApp({
      backend: (db) => new FleetBackend({ db, credentials: replica }),
      env: { KILN_SANDBOX_PAUSED_TTL_S: '3600' },
    });
    expect(
      (await t.call('POST', '/v1/system/nodes', { key: t.adminKey, body: { name: NODE, url: node.url } })).status,
    ).toBe(201);
    team = await t.team('trees');
    ws = (
      await t.call('POST', '/v1/workspaces', {
        key: team.key,
        body: { name: 'kept', settings: { sandbox: { runtime: 'runc' } } },
      })
    ).body.id;
  });
  afterAll(async () => {
    await t?.close();
    await node?.close();
    const left = new DockerBackend(connectDocker(process.env.DOCKER_HOST), { node: NODE });
    for (const c of await left.list()) await left.remove(c.id);
    // Mounts of a failed run: never left on the host.
    const mounts = await WorkspaceMounts.open(
      { mode: 'on', dir: mountsRoot, maxMb: 1, hostMounts: true },
      NODE,
      pino({ level: 'silent' }),
    );
    await mounts?.sweep(() => false);
    rmSync(dir, { recursive: true, force: true });
  });

  const put = (path: string, content: string) =>
    t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key: team.key, raw: content });
  /** A new session's first exec: what its /workspace holds (every file, with its content). */
  const newSessionSees = async () => {
    const s = (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key })).body.id as string;
    const r = await t.call('POST', `/v1/sessions/${s}/exec`, {
      key: team.key,
      body: {
        code: [
          'import os, json',
          'seen = {}',
          'for d, _, fs in os.walk("/workspace"):',
          '    for f in fs:',
          '        p = os.path.join(d, f)',
          '        seen[os.path.relpath(p, "/workspace")] = open(p, errors="replace").read(64) if os.path.getsize(p) < 4096 else os.path.getsize(p)',
          'print(json.dumps(seen))',
        ].join('\n'),
      },
    });
    expect(r.body.exit_code).toBe(0);
    return { session: s, files: JSON.parse(r.body.stdout) as Record<string, string | number> };
  };

  it('a first sandbox gets the whole tree; the next one of the workspace is sent nothing, and both see every file', async () => {
    expect((await put('notes/a.txt', 'alpha\n')).status).toBe(200);
    expect((await put('b.txt', 'beta\n')).status).toBe(200);
    // A large file, written on the host as a clone would be (and a link, which is never sent).
    const wsDir = join(t.workspacesDir, ws);
    writeFileSync(join(wsDir, 'big.bin'), Buffer.alloc(3 << 20, 7));
    symlinkSync('/etc/passwd', join(wsDir, 'link'));

    const first = await newSessionSees();
    expect(first.files).toMatchObject({ 'notes/a.txt': 'alpha\n', 'b.txt': 'beta\n', 'big.bin': 3 << 20 });
    expect(first.files.link).toBeUndefined();
    expect(store.fills.at(-1)!.bytes).toBeGreaterThan(3 << 20);

    const second = await newSessionSees();
    expect(second.files).toEqual(first.files);
    expect(store.fills.at(-1)).toEqual({ files: 0, bytes: 0 });
  });

  it('a changed, an added and a deleted file: only the first two are sent, and the sandbox has the tree as it is now', async () => {
    await put('notes/a.txt', 'alpha, changed\n');
    await put('c.txt', 'gamma\n');
    expect((await t.call('DELETE', `/v1/workspaces/${ws}/files?path=b.txt`, { key: team.key })).status).toBe(200);
    const { files } = await newSessionSees();
    expect(files['notes/a.txt']).toBe('alpha, changed\n');
    expect(files['c.txt']).toBe('gamma\n');
    expect(files['b.txt']).toBeUndefined();
    expect(files['big.bin']).toBe(3 << 20);
    expect(store.fills.at(-1)!.files).toBe(2);
  });

  it('a file that changes while it is sent: the node refuses the fill as stale, the API lists and sends again', async () => {
    await put('moving.txt', 'before\n');
    const wsDir = join(t.workspacesDir, ws);
    // A write between the listing and the read of the file (same size: only its hash tells).
    store.afterWants = () => writeFileSync(join(wsDir, 'moving.txt'), 'after!\n');
    const stale = store.stale.length;
    const { files } = await newSessionSees();
    expect(store.stale.slice(stale)).toEqual([expect.stringMatching(/moving\.txt changed while it was sent/)]);
    expect(files['moving.txt']).toBe('after!\n');
  });

  it('a gVisor sandbox in a node’s mount pauses to that host’s disk and resumes with its variables and its files', async () => {
    const g = (
      await t.call('POST', '/v1/workspaces', {
        key: team.key,
        body: { name: 'kept-gvisor', settings: { sandbox: { runtime: 'gvisor' } } },
      })
    ).body.id as string;
    await t.call('PUT', `/v1/workspaces/${g}/files?path=g.txt`, { key: team.key, raw: 'gee\n' });
    const s = (await t.call('POST', `/v1/workspaces/${g}/sessions`, { key: team.key })).body.id as string;
    const run = async (code: string) =>
      (await t.call('POST', `/v1/sessions/${s}/exec`, { key: team.key, body: { code } })).body;
    const fills = store.fills.length;
    expect((await run('x = 41\nprint(open("/workspace/g.txt").read(), end="")')).stdout).toBe('gee\n');
    expect(store.fills.length).toBe(fills + 1);
    expect((await t.call('POST', `/v1/sessions/${s}/pause`, { key: team.key })).status).toBe(200);
    const back = await run(
      'x += 1\nopen("/workspace/h.txt", "w").write("aitch")\nprint(x, open("/workspace/g.txt").read(), end="")',
    );
    expect(back).toMatchObject({ stdout: '42 gee\n', restarted: false });
    // Resumed, not filled again; and what it wrote after the resume came back.
    expect(store.fills.length).toBe(fills + 1);
    expect((await t.call('GET', `/v1/workspaces/${g}/files?path=h.txt`, { key: team.key })).status).toBe(200);
    expect((await t.call('DELETE', `/v1/sessions/${s}`, { key: team.key })).status).toBe(200);
  });

  it('a warm container on the node (made with an empty mount) is filled at its claim, from the node’s copy', async () => {
    // A second replica of the same installation with a warm pool of one, placing on the same node.
    const w = await createTestApp({
      replicaOf: t,
      sandbox: { poolSize: 1 },
      // Its warm container of the runtime this workspace runs in (with gVisor offered, the pool's would be gVisor's).
      env: { KILN_SANDBOX_RUNTIMES: 'runc' },
      backend: (db) => new FleetBackend({ db, credentials: creds }),
    });
    try {
      const docker = connectDocker(process.env.DOCKER_HOST);
      // Ready in the pool (started, its runner answering), not merely created on the node.
      for (const until = Date.now() + 60_000; w.engine.warmImages().length < 1; ) {
        if (Date.now() > until) throw new Error('no warm container on the node');
        await new Promise((r) => setTimeout(r, 100));
      }
      const listed = await docker.listContainers({ filters: { label: [`kiln.node=${NODE}`, 'kiln.session='] } });
      expect(listed).toHaveLength(1);
      const pooled = listed[0];
      await put('warm.txt', 'claimed warm\n');
      const fills = store.fills.length;
      const s = (await w.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key })).body.id as string;
      const r = await w.call('POST', `/v1/sessions/${s}/exec`, {
        key: team.key,
        body: { code: 'print(open("/workspace/warm.txt").read(), open("/workspace/c.txt").read(), sep="", end="")' },
      });
      expect(r.body).toMatchObject({ exit_code: 0, stdout: 'claimed warm\ngamma\n' });
      // It ran in the warm container, not a new one.
      const row = (await w.database.db.select().from(sandboxes).where(eq(sandboxes.id, r.body.sandbox_id)))[0]!;
      expect(row.containerId).toBe(`${NODE}/${pooled!.Id}`);
      // Only the file written since the node's copy was last brought up to date.
      expect(store.fills.slice(fills)).toEqual([{ files: 1, bytes: 'claimed warm\n'.length }]);
      expect((await w.call('DELETE', `/v1/sessions/${s}`, { key: team.key })).status).toBe(200);
    } finally {
      await w.close();
    }
  });

  it('what code writes in /workspace comes back to the workspace; ending the session unmounts its directory on the node', async () => {
    const { session } = await newSessionSees();
    const w = await t.call('POST', `/v1/sessions/${session}/exec`, {
      key: team.key,
      body: { code: 'open("/workspace/out.txt", "w").write("from the node\\n")' },
    });
    expect(w.body.exit_code).toBe(0);
    const read = await t.call('GET', `/v1/workspaces/${ws}/files?path=out.txt`, { key: team.key });
    expect(read.status).toBe(200);
    expect(read.body.content ?? read.body).toContain('from the node');
    // Mount points (the fifth field of mountinfo) under the node's directory of mounts.
    const mounted = () =>
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .map((l) => l.split(' ')[4] ?? '')
        .filter((p) => p.startsWith(join(mountsRoot, NODE)));
    expect(mounted().length).toBeGreaterThan(0);
    for (const s of (await t.call('GET', `/v1/workspaces/${ws}/sessions`, { key: team.key })).body.data)
      await t.call('DELETE', `/v1/sessions/${s.id}`, { key: team.key });
    expect(mounted()).toEqual([]);
    expect(existsSync(join(mountsRoot, NODE))).toBe(true);
  });
});

/** The node's side with hostile input: the store itself, on real files (no engine needed). */
describe('a node’s copies of workspace trees refuse what the manifest does not say', () => {
  const root = mkdtempSync(join(tmpdir(), 'kiln-tree-store-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  const frame = (p: string, body: string) => {
    const json = Buffer.from(JSON.stringify({ p, s: Buffer.byteLength(body) }));
    const head = Buffer.alloc(4);
    head.writeUInt32BE(json.length);
    return Buffer.concat([head, json, Buffer.from(body)]);
  };
  async function* of(...bufs: Buffer[]) {
    for (const b of bufs) yield b;
  }
  const uid = process.getuid!();
  let n = 0;
  const into = () => {
    const d = join(root, `into-${n++}`);
    mkdirSync(d, { recursive: true });
    return { dir: d, uid };
  };

  it('refuses paths that climb, absolute ones, a file inside a file and bad hashes; a wrong byte is a stale tree and the copy stays as it was', async () => {
    const store = new TreeStore(join(root, 'trees'), 1 << 20);
    const file = (p: string, body: string): TreeEntry => ({ p, s: Buffer.byteLength(body), h: sha(body), m: 0o644 });
    for (const bad of ['../x', '/etc/passwd', 'a/../../b', 'a//b', '.', 'a\\b', 'x\0y'])
      await expect(store.wants('ws_a', [file(bad, 'x')])).rejects.toThrow();
    await expect(store.wants('ws_a', [file('d/f', 'x')])).rejects.toThrow(/not listed/);
    await expect(store.wants('../ws', [file('f', 'x')])).rejects.toThrow(/bad workspace key/);
    await expect(store.wants('ws_a', [{ p: 'f', s: 1, h: 'nothex', m: 0o644 }])).rejects.toThrow();
    await expect(store.wants('ws_a', [{ ...file('f', 'x'), m: 0o4755 }])).rejects.toThrow();

    const v1 = [file('f.txt', 'one\n')];
    expect(await store.wants('ws_a', v1)).toEqual(['f.txt']);
    const a = into();
    expect(await store.fill('ws_a', v1, of(frame('f.txt', 'one\n')), a)).toEqual({ files: 1, bytes: 4 });
    expect(readFileSync(join(a.dir, 'f.txt'), 'utf8')).toBe('one\n');

    // Bytes that are not the listed file's: stale, and the copy is still v1.
    const v2 = [file('f.txt', 'two\n')];
    await expect(store.fill('ws_a', v2, of(frame('f.txt', 'twX\n')), into())).rejects.toThrow(
      /changed while it was sent/,
    );
    expect(await store.wants('ws_a', v1)).toEqual([]);
    // A file the manifest does not ask for, or one sent twice: refused.
    await expect(store.fill('ws_a', v2, of(frame('g.txt', 'two\n')), into())).rejects.toThrow(/does not ask/);
    await expect(store.fill('ws_a', v2, of(frame('f.txt', 'two\n'), frame('f.txt', 'two\n')), into())).rejects.toThrow(
      /does not ask/,
    );
    // A file neither sent nor in the copy as listed: stale.
    await expect(store.fill('ws_a', v2, of(), into())).rejects.toThrow(/neither sent/);
    // Frames cut short: refused.
    await expect(store.fill('ws_a', v2, of(frame('f.txt', 'two\n').subarray(0, 10)), into())).rejects.toThrow(
      /ended inside/,
    );
    expect(await store.wants('ws_a', v1)).toEqual([]);
    // Sent right: the copy is v2 from now on.
    const b = into();
    await store.fill('ws_a', v2, of(frame('f.txt', 'two\n')), b);
    expect(readFileSync(join(b.dir, 'f.txt'), 'utf8')).toBe('two\n');
    expect(await store.wants('ws_a', v2)).toEqual([]);
    // Made executable, same content: nothing sent, the new mode taken.
    const v3 = [{ ...v2[0]!, m: 0o755 }];
    expect(await store.wants('ws_a', v3)).toEqual([]);
    const c = into();
    await store.fill('ws_a', v3, of(), c);
    expect(statSync(join(c.dir, 'f.txt')).mode & 0o777).toBe(0o755);
  });

  it('drops the copies used least recently past its size, and a copy whose update did not finish is sent again in full', async () => {
    const store = new TreeStore(join(root, 'small'), 10);
    const body = 'x'.repeat(8);
    const e: TreeEntry[] = [{ p: 'f', s: 8, h: sha(body), m: 0o644 }];
    await store.fill('ws_1', e, of(frame('f', body)), into());
    await store.fill('ws_2', e, of(frame('f', body)), into());
    // 16 bytes past 10: ws_1 went, ws_2 (just used) stays.
    expect(await store.wants('ws_1', e)).toEqual(['f']);
    expect(await store.wants('ws_2', e)).toEqual([]);
    // An update cut short (no manifest left): everything is asked again.
    rmSync(join(root, 'small', 'ws_2', 'manifest.json'));
    expect(await store.wants('ws_2', e)).toEqual(['f']);
  });
});
