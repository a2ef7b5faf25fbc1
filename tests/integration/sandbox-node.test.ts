import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import http2 from 'node:http2';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxBackend } from '../../apps/api/src/sandbox/backend.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { issue, makeAuthority, type KeyPair, type PeerCredentials } from '../../apps/api/src/sandbox/node/pki.ts';
import { RemoteBackend } from '../../apps/api/src/sandbox/node/remote.ts';
import { type RunningNode, startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { RunnerClient } from '../../apps/api/src/sandbox/runner-client.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';

/**
 * The node protocol's trust: mutual TLS with the installation's CA, and names that say which
 * side a certificate may play. Each refusal is checked against the same call succeeding with the
 * right credentials, and against the node's backend, which must never see a refused call.
 */
describe('sandbox node: who may talk to whom', () => {
  let ca: KeyPair;
  let node: RunningNode;
  let replica: PeerCredentials;
  const calls: string[] = [];
  let image: string;
  const owner = `node-test-${randomBytes(4).toString('hex')}`;
  // Its containers carry a name of this file's own (other files' nodes are also called node-a), so
  // its lifetime reaper and listings see only them, and other files' clean-ups never touch them.
  const docker = new DockerBackend(connectDocker(process.env.DOCKER_HOST), {
    node: `node-a-${randomBytes(3).toString('hex')}`,
  });
  const remotes: RemoteBackend[] = [];
  const remote = (o: ConstructorParameters<typeof RemoteBackend>[0]) => {
    const r = new RemoteBackend(o);
    remotes.push(r);
    return r;
  };

  beforeAll(async () => {
    image = await ensureSandboxImage();
    ca = await makeAuthority('node-test');
    // The real Docker backend, with every call it receives written down.
    const counted = new Proxy(docker, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver);
        if (typeof v !== 'function') return v;
        return (...args: unknown[]) => {
          if (prop !== 'isGone') calls.push(String(prop));
          return v.apply(target, args);
        };
      },
    }) as SandboxBackend;
    node = await startNode({
      backend: counted,
      credentials: await issue(ca, { role: 'node', name: 'node-a', hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
      // Its reaper's tick is called by the test (node.reap()), not left to its timer.
      reapMs: 3_600_000,
    });
    replica = await issue(ca, { role: 'api', name: 'replica-1' });
  });
  afterAll(async () => {
    for (const r of remotes) r.close();
    await node?.close();
    for (const c of await docker.list()) if (c.instance === owner) await docker.remove(c.id);
  });

  it('serves an API replica of its installation', async () => {
    calls.length = 0;
    await remote({ url: node.url, name: 'node-a', credentials: replica }).ping();
    expect(calls).toEqual(['ping']);
  });

  it('refuses a replica whose certificate another CA signed, even with the same names', async () => {
    const other = await makeAuthority('node-test');
    const forged = await issue(other, { role: 'api', name: 'replica-1' });
    calls.length = 0;
    await expect(
      remote({ url: node.url, name: 'node-a', credentials: { ...forged, ca: ca.cert } }).ping(),
    ).rejects.toThrow();
    expect(calls).toEqual([]);
  });

  // Its certificate is for servers only, so the handshake refuses it; the node also checks the name it carries.
  it('refuses a node of the installation acting as an API replica', async () => {
    const otherNode = await issue(ca, { role: 'node', name: 'node-b', hosts: ['127.0.0.1'] });
    calls.length = 0;
    await expect(remote({ url: node.url, name: 'node-a', credentials: otherNode }).ping()).rejects.toThrow();
    expect(calls).toEqual([]);
  });

  it('refuses a client with no certificate at the handshake', async () => {
    calls.length = 0;
    const session = http2.connect(node.url, { ca: ca.cert });
    const failed = await new Promise<boolean>((resolve) => {
      session.on('error', () => resolve(true));
      session.on('close', () => resolve(true));
      const s = session.request({ ':method': 'POST', ':path': '/v1/call/list' });
      s.on('response', () => resolve(false));
      s.on('error', () => resolve(true));
      s.end('[]');
    });
    session.destroy();
    expect(failed).toBe(true);
    expect(calls).toEqual([]);
  });

  it('a replica talks only to the node it dialled: another node, or a replica posing as one, is refused', async () => {
    // Node b's real certificate, at the address the replica dials for node a.
    const impostor = await startNode({
      backend: docker,
      credentials: await issue(ca, { role: 'node', name: 'node-b', hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
    });
    // A replica's certificate (client only) presented as a node's.
    const posing = await startNode({
      backend: docker,
      credentials: await issue(ca, { role: 'api', name: 'node-a', hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
    });
    try {
      await expect(remote({ url: impostor.url, name: 'node-a', credentials: replica }).ping()).rejects.toThrow(
        /not node node-a/,
      );
      await expect(remote({ url: posing.url, name: 'node-a', credentials: replica }).ping()).rejects.toThrow();
      // The same replica reaches the real node a.
      await expect(remote({ url: node.url, name: 'node-a', credentials: replica }).ping()).resolves.toBeUndefined();
    } finally {
      await impostor.close();
      await posing.close();
    }
  });

  it('checks every call at the edge: bad arguments are a clear error and reach no engine; no host path is mounted', async () => {
    const r = remote({ url: node.url, name: 'node-a', credentials: replica });
    calls.length = 0;
    const request = {
      image,
      sandboxId: `sbx_node${randomBytes(6).toString('hex')}`,
      instance: owner,
      teamId: '',
      sessionId: '',
      expiresAt: new Date(Date.now() + 60_000),
      limits: { memoryMb: 256, cpus: 0.5, pids: 64, timeoutS: 10, diskMb: 64 },
      runtime: 'runc' as const,
    };
    // What the node refuses whatever the replica's own code does: a host directory to mount.
    const session = http2.connect(node.url, { ca: ca.cert, cert: replica.cert, key: replica.key });
    const ask = (path: string, body: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const s = session.request({ ':method': 'POST', ':path': path });
        let text = '';
        let status = 0;
        s.on('response', (h) => (status = Number(h[':status'])));
        s.on('data', (d: Buffer) => (text += d));
        s.on('end', () => resolve({ status, body: text }));
        s.on('error', reject);
        s.end(body);
      });
    try {
      const mount = await ask('/v1/call/create', JSON.stringify([{ ...request, workspaceDir: '/etc' }]));
      expect(mount.status).toBe(400);
      expect(JSON.parse(mount.body).error.message).toMatch(/bad arguments for create/);
      expect((await ask('/v1/call/remove', JSON.stringify(['../../etc']))).status).toBe(400);
      // A runner as root (or any uid outside the sandboxes' range) is not asked for at all.
      const asRoot = await ask('/v1/call/start', JSON.stringify([{ id: 'abc', uid: 0, runtime: 'runc' }]));
      expect(asRoot.status).toBe(400);
      expect((await ask('/v1/call/create', 'not json')).status).toBe(400);
      expect((await ask('/v1/call/exec', '[]')).status).toBe(404);
      expect(calls).toEqual([]);
    } finally {
      session.destroy();
    }
    // The well-formed request makes a container; the API side refuses a mount before sending.
    expect(() => r.create({ ...request, workspaceDir: '/etc' })).toThrow(/mounts no directory/);
    const made = await r.create(request);
    expect(calls).toEqual(['create']);
    expect((await r.list()).map((c) => c.id)).toContain(made.id);
    await r.remove(made.id);
  });

  it('builds a template image on its host for a replica, streaming the build’s output; the image is then there until removed', async () => {
    const r = remote({ url: node.url, name: 'node-a', credentials: replica });
    const tag = `kiln-node-test:${randomBytes(4).toString('hex')}`;
    const lines: string[] = [];
    await r.images.build(
      {
        base: image,
        tag,
        labels: { 'kiln.test': owner },
        apt: [],
        pip: [],
        pipIndexUrl: 'https://pypi.org/simple',
        files: [{ path: 'hello.txt', content: 'built on the node\n' }],
        filesDir: '/opt/kiln-template',
        aptDay: '2026-12-04',
      },
      { onLine: (l) => lines.push(l), timeoutMs: 120_000, signal: new AbortController().signal },
    );
    expect(lines.join('\n')).toMatch(/COPY files/);
    expect(await r.images.idOf(tag)).toMatch(/^sha256:/);
    // A sandbox of that image has the file.
    const c = await r.create({
      image: tag,
      sandboxId: `sbx_node${randomBytes(6).toString('hex')}`,
      instance: owner,
      teamId: '',
      sessionId: '',
      expiresAt: new Date(Date.now() + 60_000),
      limits: { memoryMb: 256, cpus: 0.5, pids: 64, timeoutS: 10, diskMb: 64 },
      runtime: 'runc',
    });
    try {
      await r.start(c);
      const client = await RunnerClient.start(await r.attachRunner(c), 30_000, true);
      const res = await client.exec('print(open("/opt/kiln-template/hello.txt").read(), end="")', {
        timeoutMs: 10_000,
        maxOutputBytes: 65_536,
      });
      expect(res.stdout).toBe('built on the node\n');
      client.close();
    } finally {
      await r.remove(c.id);
    }
    await r.images.remove(tag);
    expect(await r.images.idOf(tag)).toBeNull();
  });

  it('removes its containers past their hard lifetime by itself, whether or not a replica is left', async () => {
    const r = remote({ url: node.url, name: 'node-a', credentials: replica });
    const base = {
      image,
      instance: owner,
      teamId: '',
      sessionId: '',
      limits: { memoryMb: 256, cpus: 0.5, pids: 64, timeoutS: 10, diskMb: 64 },
      runtime: 'runc' as const,
    };
    const old = await r.create({
      ...base,
      sandboxId: `sbx_node${randomBytes(6).toString('hex')}`,
      expiresAt: new Date(Date.now() - 1000),
    });
    const young = await r.create({
      ...base,
      sandboxId: `sbx_node${randomBytes(6).toString('hex')}`,
      expiresAt: new Date(Date.now() + 600_000),
    });
    r.close();
    expect(await node.reap()).toBe(1);
    const left = (await docker.list()).map((c) => c.id);
    expect(left).not.toContain(old.id);
    expect(left).toContain(young.id);
    await docker.remove(young.id);
  });
});

describe('sandbox node: the process', () => {
  it('makes its credentials, serves with no database, runs code for a replica, and stops cleanly on SIGTERM', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-node-creds-'));
    const main = fileURLToPath(new URL('../../apps/api/src/node-main.ts', import.meta.url));
    const tool = (...args: string[]) =>
      execFileSync(process.execPath, ['--import', 'tsx', main, 'credentials', '--dir', dir, ...args], {
        encoding: 'utf8',
      });
    try {
      expect(tool('--role', 'node', '--name', 'n1', '--host', '127.0.0.1')).toContain('a node named n1');
      expect(tool('--role', 'api', '--name', 'r1')).toContain('an API replica named r1');
      // One CA for both, its key readable by its owner only.
      expect(statSync(join(dir, 'ca.key')).mode & 0o077).toBe(0);
      const child = spawn(process.execPath, ['--import', 'tsx', main], {
        env: {
          PATH: process.env.PATH,
          DOCKER_HOST: process.env.DOCKER_HOST,
          KILN_NODE_NAME: 'n1',
          KILN_DATA_DIR: join(dir, 'data'),
          KILN_NODE_CERT: join(dir, 'n1.pem'),
          KILN_NODE_KEY: join(dir, 'n1.key'),
          KILN_NODE_CA: join(dir, 'ca.pem'),
          KILN_NODE_HOST: '127.0.0.1',
          KILN_NODE_PORT: '0',
          KILN_LOG_LEVEL: 'warn',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
      const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
      const url = await new Promise<string>((resolve, reject) => {
        child.stdout.on('data', () => {
          const m = /listening on (https:\/\/\S+)/.exec(out);
          if (m) resolve(m[1]!);
        });
        void exited.then(() => reject(new Error(`the node exited: ${out}`)));
      });
      const r = new RemoteBackend({
        url,
        name: 'n1',
        credentials: {
          cert: readFileSync(join(dir, 'r1.pem'), 'utf8'),
          key: readFileSync(join(dir, 'r1.key'), 'utf8'),
          ca: readFileSync(join(dir, 'ca.pem'), 'utf8'),
        },
      });
      const c = await r.create({
        image: await ensureSandboxImage(),
        sandboxId: `sbx_node${randomBytes(6).toString('hex')}`,
        instance: `node-proc-${randomBytes(4).toString('hex')}`,
        teamId: '',
        sessionId: '',
        expiresAt: new Date(Date.now() + 60_000),
        limits: { memoryMb: 256, cpus: 0.5, pids: 64, timeoutS: 10, diskMb: 64 },
        runtime: 'runc',
      });
      try {
        await r.start(c);
        const client = await RunnerClient.start(await r.attachRunner(c), 30_000, true);
        const res = await client.exec('print(6 * 7)', {
          timeoutMs: 10_000,
          maxOutputBytes: 65_536,
        });
        expect(res).toMatchObject({ ok: true, stdout: '42\n' });
        client.close();
      } finally {
        await r.remove(c.id);
        r.close();
      }
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
