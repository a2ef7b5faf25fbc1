import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { imageExists as imageOnEngine } from '../../sandbox-image/build.ts';
import { TEMPLATE_BUILD_JOB } from '../../apps/api/src/templates/build.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { rowsOf } from '../support/db.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);

/** What a command prints in a throw-away container of the image (no network; removed after). */
async function runIn(image: string, cmd: string[]): Promise<string> {
  // A terminal, so the log is the output as printed (not multiplexed frames).
  const c = await docker.createContainer({ Image: image, Cmd: cmd, Tty: true, HostConfig: { NetworkMode: 'none' } });
  try {
    await c.start();
    const { StatusCode } = await c.wait();
    const out = (await c.logs({ stdout: true, stderr: true })).toString('utf8').replace(/\r/g, '').trim();
    expect(StatusCode, out).toBe(0);
    return out;
  } finally {
    await c.remove({ force: true });
  }
}
const WHEEL = 'kiln_tiny-1.0-py3-none-any.whl';

/**
 * A pure-Python wheel (a zip with the module, METADATA, WHEEL and RECORD), made with the system
 * python3's zipfile. It ships a .pth file, as a hostile team member's package could: every
 * interpreter that imports site runs its import line, which logs the process it ran in.
 */
function buildWheel(dir: string): Buffer {
  const script = `
import base64, hashlib, sys, zipfile
files = {
  'kiln_tiny/__init__.py': 'VALUE = "tiny wheel 1.0"\\n',
  'kiln_tiny.pth': 'import os; open("/tmp/kiln-pth.log", "a").write(open("/proc/self/cmdline", "rb").read().replace(bytes(1), b" ").decode() + chr(10))\\n',
  'kiln_tiny-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\\nName: kiln-tiny\\nVersion: 1.0\\n',
  'kiln_tiny-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\\nGenerator: kiln-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n',
}
record = []
for name, text in files.items():
  data = text.encode()
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
  record.append(f'{name},sha256={digest},{len(data)}')
record.append('kiln_tiny-1.0.dist-info/RECORD,,')
files['kiln_tiny-1.0.dist-info/RECORD'] = '\\n'.join(record) + '\\n'
with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:
  for name, text in files.items():
    z.writestr(name, text)
`;
  const path = join(dir, WHEEL);
  execFileSync('python3', ['-c', script, path]);
  return readFileSync(path);
}

/** A PEP 503 "simple" index on loopback with one project, kiln-tiny; counts downloads of its wheel. */
async function serveIndex(wheel: Buffer): Promise<{ close: () => void; url: string; downloads: () => number }> {
  const sha = createHash('sha256').update(wheel).digest('hex');
  let downloads = 0;
  const held = new Set<ServerResponse>();
  const server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path?.startsWith('/simple/kiln-slow')) {
      // Never answered: a build waiting on it can only end by its timeout.
      held.add(res);
    } else if (path === '/simple/' || path === '/simple') {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<a href="/simple/kiln-tiny/">kiln-tiny</a>');
    } else if (path === '/simple/kiln-tiny/' || path === '/simple/kiln-tiny') {
      res
        .writeHead(200, { 'content-type': 'text/html' })
        .end(`<html><body><a href="/files/${WHEEL}#sha256=${sha}">${WHEEL}</a></body></html>`);
    } else if (path === `/files/${WHEEL}`) {
      downloads++;
      res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(wheel);
    } else {
      res.writeHead(404).end('not found');
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const close = () => {
    for (const res of held) res.destroy();
    server.close();
  };
  return { close, url: `http://127.0.0.1:${port}/simple`, downloads: () => downloads };
}

const imageExists = (ref: string) => imageOnEngine(docker, ref);

/** Polls a condition on the app's own state (a build's progress), never a fixed wait. */
async function until<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 600_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(v).slice(0, 2000)}`);
    await delay(200);
  }
}

const PROBE = [
  'import os, subprocess, kiln_tiny',
  'print(kiln_tiny.VALUE)',
  'print(subprocess.run(["jq", "-n", "[1, 2] | add"], capture_output=True, text=True).stdout.strip())',
  'print(open("/opt/kiln/template/conf/hello.txt").read())',
  'print(os.getuid() >= 2_000_000_000)',
  'try:\n    open("/usr/probe", "w")\nexcept OSError as e:\n    print("read-only", e.errno)',
  'found = subprocess.run(["find", "/", "-xdev", "-type", "f", "-perm", "/6000"], capture_output=True, text=True)',
  'print("setuid files:", len(found.stdout.split()))',
].join('\n');

describe('sandbox templates', () => {
  let t: TestApp;
  let replica: TestApp | undefined;
  let index: Awaited<ReturnType<typeof serveIndex>>;
  let wheelDir: string;
  const images = new Set<string>();
  let owner: { id: string; key: string };
  let other: { id: string; key: string };
  let tpl: string;
  let image: string;
  let ws: string;
  let session: string;
  const sessions: string[] = [];

  const call = (method: string, path: string, key: string, body?: unknown) => t.call(method, path, { key, body });
  const buildJobs = async () =>
    Number(
      rowsOf<{ n: string }>(
        await t.database.db.execute(sql`select count(*) as n from jobs where kind = ${TEMPLATE_BUILD_JOB}`),
      )[0]!.n,
    );
  const definition = {
    apt: ['jq'],
    pip: ['kiln-tiny==1.0'],
    files: [{ path: 'conf/hello.txt', content: 'hello from the template' }],
  };

  beforeAll(async () => {
    wheelDir = mkdtempSync(join(tmpdir(), 'kiln-wheel-'));
    index = await serveIndex(buildWheel(wheelDir));
    // Template images have warm containers without fair share only (an image is no team's: docs/security.md).
    t = await createTestApp({
      env: { KILN_PIP_INDEX_URL: index.url, KILN_SANDBOX_FAIR_SHARE: 'off' },
      sandbox: { templatePoolSize: 1 },
    });
    owner = await t.team('templates-owner');
    other = await t.team('templates-other');
  }, 60_000);

  afterAll(async () => {
    await replica?.close();
    await t?.close();
    index?.close();
    rmSync(wheelDir, { recursive: true, force: true });
    for (const ref of images)
      await docker
        .getImage(ref)
        .remove({ force: true })
        .catch(() => undefined);
  }, 60_000);

  it('refuses bad definitions with 400 and writes nothing', async () => {
    const bad: [unknown, string][] = [
      [{ name: 'x', apt: ['-o', 'jq'] }, 'body.apt.0'],
      [{ name: 'x', apt: ['jq; rm -rf /'] }, 'Debian package name'],
      [{ name: 'x', apt: ['JQ'] }, 'Debian package name'],
      [{ name: 'x', apt: Array.from({ length: 51 }, (_, i) => `pkg${i}`) }, 'body.apt'],
      [{ name: 'x', pip: ['https://evil.example/x.whl'] }, 'Python package name'],
      [{ name: 'x', pip: ['--index-url=http://evil'] }, 'Python package name'],
      [{ name: 'x', pip: ['requests>=2'] }, 'Python package name'],
      [{ name: 'x', pip: ['requests[socks]'] }, 'Python package name'],
      [{ name: 'x', pip: ['a b'] }, 'Python package name'],
      [{ name: 'x', pip: ['tabulate', 'Tabulate'] }, 'twice'],
      [{ name: 'x', files: [{ path: '../etc/passwd', content: 'x' }] }, 'relative path'],
      [{ name: 'x', files: [{ path: '/abs', content: 'x' }] }, 'relative path'],
      [{ name: 'x', files: [{ path: '.bashrc', content: 'x' }] }, 'relative path'],
      [{ name: 'x', files: [{ path: 'big', content: 'x'.repeat(64 * 1024 + 1) }] }, 'at most 65536 bytes'],
      [
        {
          name: 'x',
          files: [
            { path: 'a', content: '' },
            { path: 'a/b', content: '' },
          ],
        },
        'which is a file',
      ],
      [{ name: 'x', apt: [], network: 'host' }, 'network'],
      [{ apt: ['jq'] }, 'body.name'],
    ];
    for (const [body, why] of bad) {
      const r = await call('POST', '/v1/templates', owner.key, body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
      expect(r.body.error.message).toContain(why);
    }
    expect((await call('GET', '/v1/templates', owner.key)).body.data).toEqual([]);
    expect(await buildJobs()).toBe(0);
    // A viewer key writes nothing.
    const viewer = await t.team('templates-viewer', 'viewer');
    expect((await call('POST', '/v1/templates', viewer.key, { name: 'v' })).status).toBe(403);
    // The routes are in the OpenAPI document.
    const doc = (await t.call('GET', '/openapi.json')).body;
    for (const path of ['/v1/templates', '/v1/templates/{template}', '/v1/templates/{template}/log'])
      expect(Object.keys(doc.paths)).toContain(path);
    expect(Object.keys(doc.paths['/v1/templates/{template}'])).toEqual(
      expect.arrayContaining(['get', 'put', 'delete']),
    );
    // A workspace cannot name a template that is not its team's.
    const ws = await call('POST', '/v1/workspaces', owner.key, {
      name: 'w',
      settings: { sandbox: { template: 'tpl_nope' } },
    });
    expect(ws.status).toBe(400);
    expect(ws.body.error.message).toContain('no template tpl_nope in this team');
  });

  it('answers 503 on a server without a container runtime', async () => {
    const bare = await createTestApp({ sandbox: false });
    try {
      const team = await bare.team('templates-bare');
      const r = await bare.call('POST', '/v1/templates', { key: team.key, body: { name: 'x', apt: ['jq'] } });
      expect(r.status).toBe(503);
      expect(r.body.error.message).toContain('container runtime');
      expect((await bare.call('GET', '/v1/templates', { key: team.key })).body.data).toEqual([]);
    } finally {
      await bare.close();
    }
  });

  it('builds a template as a durable job with visible progress, resumed by another server after a stop', async () => {
    const created = await call('POST', '/v1/templates', owner.key, { name: 'tiny', ...definition });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({
      name: 'tiny',
      status: 'queued',
      image: null,
      apt: ['jq'],
      pip: ['kiln-tiny==1.0'],
    });
    tpl = created.body.id;
    image = `kiln-template:${created.body.hash}`;
    images.add(image);
    // Not usable until it has an image: 409.
    const early = await call('POST', '/v1/workspaces', owner.key, {
      name: 'early',
      settings: { sandbox: { template: tpl } },
    });
    expect(early.status).toBe(409);
    expect(early.body.error.message).toContain('has no image yet');

    // The build runs; its output is visible while it runs.
    const first = t.evolution.jobs.drain();
    const building = await until(
      'build progress',
      async () => (await call('GET', `/v1/templates/${tpl}`, owner.key)).body,
      (b) =>
        b.status === 'failed' || (b.status === 'building' && b.log_tail.some((l: string) => l.startsWith('Step '))),
    );
    expect(building.status, JSON.stringify(building)).toBe('building');
    expect(building.log_tail.length).toBeLessThanOrEqual(20);
    // The server stops mid-build (what a shutdown does): the job goes back to the queue, not stuck in building.
    await t.templates.stop();
    await first;
    const stopped = (await call('GET', `/v1/templates/${tpl}`, owner.key)).body;
    expect(stopped.status, JSON.stringify(stopped)).toBe('queued');
    expect(stopped.log_tail.at(-1)).toContain('the server is stopping');

    // Another server on the same database takes the job and finishes the build.
    replica = await createTestApp({
      replicaOf: t,
      env: { KILN_PIP_INDEX_URL: index.url },
      sandbox: { templatePoolSize: 0 },
    });
    await replica.evolution.jobs.drain();
    const ready = (await call('GET', `/v1/templates/${tpl}`, owner.key)).body;
    expect(ready.error).toBeNull();
    expect(ready).toMatchObject({ status: 'ready', image });
    expect(ready.built_at).not.toBeNull();
    expect(await imageExists(image)).toBe(true);
    const log = (await call('GET', `/v1/templates/${tpl}/log`, owner.key)).body;
    expect(log.log).toContain('the server is stopping');
    expect(log.log).toContain('resuming the build');
    expect(log.log).toMatch(/Step \d+\/\d+ : RUN \["python3","-m","pip","install"/);
    expect(log.log).toContain(`built ${image}`);
    // apt installs what the template asks for (read in the image: the log says `Unpacking jq` only
    // when no earlier build on this engine the same day left the layer in the cache), and no
    // compiler only to purge it again.
    expect(await runIn(image, ['jq', '--version'])).toMatch(/^jq-1\./);
    expect(log.log).not.toMatch(/Unpacking (?:gcc|g\+\+|cpp|binutils|libgcc)/);
    expect(index.downloads()).toBeGreaterThanOrEqual(1);
    const inspect = await docker.getImage(image).inspect();
    expect(inspect.Config.User).toBe('65534:65534');
  }, 900_000);

  it('a build whose server died is taken again once its lease runs out; one whose job is gone is failed, never left building', async () => {
    const created = await call('POST', '/v1/templates', owner.key, {
      name: 'files-only',
      files: [{ path: 'notes.txt', content: 'only a file' }],
    });
    expect(created.status).toBe(201);
    const id = created.body.id;
    images.add(`kiln-template:${created.body.hash}`);
    // What a server that died mid-build leaves: its job running under an expired lease, the template building.
    const db = t.database.db;
    await db.execute(sql`update jobs set status = 'running', locked_by = 'dead-server', attempts = 1,
      locked_until = now() - interval '1 second' where kind = ${TEMPLATE_BUILD_JOB} and status = 'queued'`);
    await db.execute(sql`update templates set status = 'building', log = 'Step 1/9 : FROM sha256:…' where id = ${id}`);
    expect((await call('GET', `/v1/templates/${id}`, owner.key)).body.status).toBe('building');
    await replica!.evolution.jobs.drain();
    const done = (await call('GET', `/v1/templates/${id}`, owner.key)).body;
    expect(done).toMatchObject({ status: 'ready', image: `kiln-template:${created.body.hash}` });
    const log = (await call('GET', `/v1/templates/${id}/log`, owner.key)).body.log;
    expect(log.indexOf('Step 1/9 : FROM sha256:…')).toBeLessThan(log.indexOf('resuming the build'));
    expect(log).toContain('[kiln] built');

    // A rebuild that succeeds replaces the image, and the replaced one (no other template has it) goes.
    const changed = await call('PUT', `/v1/templates/${id}`, owner.key, {
      files: [{ path: 'notes.txt', content: 'changed' }],
    });
    expect(changed.body).toMatchObject({ status: 'queued', image: `kiln-template:${created.body.hash}` });
    const next = `kiln-template:${changed.body.hash}`;
    images.add(next);
    await replica!.evolution.jobs.drain();
    expect((await call('GET', `/v1/templates/${id}`, owner.key)).body).toMatchObject({ status: 'ready', image: next });
    expect(await imageExists(`kiln-template:${created.body.hash}`)).toBe(false);

    // A template building whose job no longer exists (a database restored without it): failed at start-up.
    await db.execute(
      sql`update templates set status = 'building', updated_at = now() - interval '2 minutes' where id = ${id}`,
    );
    await replica!.templates.start();
    const lost = (await call('GET', `/v1/templates/${id}`, owner.key)).body;
    expect(lost.status).toBe('failed');
    expect(lost.error).toContain('the build was lost');
    expect(lost.image).toBe(next);
    expect((await call('DELETE', `/v1/templates/${id}`, owner.key)).status).toBe(200);
    expect(await imageExists(next)).toBe(false);
  }, 300_000);

  it('a workspace with the template gets its image: the wheel imports, jq runs, hardening kept; the pool keeps one warm', async () => {
    const created = await call('POST', '/v1/workspaces', owner.key, {
      name: 'uses',
      settings: { sandbox: { template: tpl } },
    });
    expect(created.status).toBe(201);
    ws = created.body.id;
    expect(created.body.settings.sandbox.template).toBe(tpl);
    await t.templates.refreshPool();
    await t.engine.poolSettled();
    expect(t.engine.warmImages()).toEqual([image]);
    session = (await call('POST', `/v1/workspaces/${ws}/sessions`, owner.key, {})).body.id;
    sessions.push(session);
    const r = await exec(t, owner.key, session, PROBE);
    expect(r.error).toBeUndefined();
    expect(r.stdout.split('\n')).toEqual([
      'tiny wheel 1.0',
      '3',
      'hello from the template',
      'True',
      'read-only 30',
      'setuid files: 0',
      '',
    ]);
    const listed = (await call('GET', '/v1/sandboxes', owner.key)).body.data;
    expect(listed.find((x: { id: string }) => x.id === r.sandbox_id)?.image).toBe(image);
    // The package's .pth ran where site-packages belong (the user's interpreter), never in the
    // runner, which starts without site (python3 -I -S) and hardens itself before any code runs.
    for (const runtime of ['runc', 'gvisor']) {
      const w = await call('POST', '/v1/workspaces', owner.key, {
        name: `pth-${runtime}`,
        settings: { sandbox: { template: tpl, runtime } },
      });
      const s = (await call('POST', `/v1/workspaces/${w.body.id}/sessions`, owner.key, {})).body.id;
      const log = await exec(t, owner.key, s, 'print(open("/tmp/kiln-pth.log").read(), end="")');
      expect(log.error, runtime).toBeUndefined();
      expect(log.stdout, runtime).toContain('kiln_worker.py');
      expect(log.stdout, runtime).not.toContain('kiln_runner.py');
      expect((await call('DELETE', `/v1/sessions/${s}`, owner.key)).status).toBe(200);
      expect((await call('DELETE', `/v1/workspaces/${w.body.id}`, owner.key)).status).toBe(200);
    }
    // The warm container was claimed and the pool made another of the template.
    await t.engine.poolSettled();
    expect(t.engine.warmImages()).toEqual([image]);
  }, 300_000);

  it('the same inputs are a cache hit, from any team; each team sees only its own rows', async () => {
    const jobsBefore = await buildJobs();
    const downloads = index.downloads();
    const created = (await inspectCreated(image)).toString();
    const again = await call('POST', '/v1/templates', other.key, {
      name: 'same',
      // Another order, same packages: the same image.
      files: definition.files,
      pip: ['Kiln_Tiny==1.0'],
      apt: ['jq', 'jq'],
    });
    expect(again.status).toBe(201);
    expect(again.body).toMatchObject({ status: 'ready', image, hash: image.split(':')[1] });
    expect(again.body.log_tail[0]).toContain('cached');
    expect(await buildJobs()).toBe(jobsBefore);
    expect(index.downloads()).toBe(downloads);
    expect((await inspectCreated(image)).toString()).toBe(created);

    const mine = await call('GET', '/v1/templates?limit=1', owner.key);
    expect(mine.body.data.map((x: { id: string }) => x.id)).toEqual([tpl]);
    expect(mine.body.has_more).toBe(false);
    const theirs = await call('GET', '/v1/templates', other.key);
    expect(theirs.body.data.map((x: { id: string }) => x.id)).toEqual([again.body.id]);
    for (const [method, path] of [
      ['GET', `/v1/templates/${tpl}`],
      ['GET', `/v1/templates/${tpl}/log`],
      ['PUT', `/v1/templates/${tpl}`],
      ['DELETE', `/v1/templates/${tpl}`],
    ] as const) {
      const r = await call(method, path, other.key, method === 'PUT' ? { apt: [] } : undefined);
      expect(r.status, `${method} ${path}`).toBe(404);
    }
    // Another team's template cannot be a workspace's.
    const foreign = await call('POST', '/v1/workspaces', other.key, {
      name: 'f',
      settings: { sandbox: { template: tpl } },
    });
    expect(foreign.status).toBe(400);
    // Names are unique per team.
    expect((await call('POST', '/v1/templates', owner.key, { name: 'tiny' })).status).toBe(409);
  });

  it('a failed rebuild says why and leaves the previous image in service', async () => {
    const put = await call('PUT', `/v1/templates/${tpl}`, owner.key, {
      ...definition,
      pip: ['kiln-tiny==1.0', 'kiln-missing'],
    });
    expect(put.status).toBe(200);
    expect(put.body).toMatchObject({ status: 'queued', image });
    images.add(`kiln-template:${put.body.hash}`);
    // The first server was stopped (it starts no build any more): the second one builds.
    await replica!.evolution.jobs.drain();
    const failed = (await call('GET', `/v1/templates/${tpl}`, owner.key)).body;
    expect(failed).toMatchObject({ status: 'failed', image, pip: ['kiln-missing', 'kiln-tiny==1.0'] });
    expect(failed.error).toContain('pip');
    expect(failed.error).toContain('kiln-missing');
    // The index's own answer comes first, before Docker's "returned a non-zero code".
    expect(failed.error.split('\n')[0]).toMatch(/^ERROR: .*kiln-missing/);
    expect(await imageExists(`kiln-template:${put.body.hash}`)).toBe(false);
    // The running session goes on, and a new one still gets the previous image.
    expect((await exec(t, owner.key, session, 'print(kiln_tiny.VALUE)')).stdout).toBe('tiny wheel 1.0\n');
    const fresh = (await call('POST', `/v1/workspaces/${ws}/sessions`, owner.key, {})).body.id;
    sessions.push(fresh);
    const r = await exec(t, owner.key, fresh, 'import kiln_tiny\nprint(kiln_tiny.VALUE)');
    expect(r.stdout).toBe('tiny wheel 1.0\n');
  }, 600_000);

  it('a build over KILN_TEMPLATE_BUILD_TIMEOUT_S is stopped and failed with that reason', async () => {
    const slow = await createTestApp({
      replicaOf: t,
      env: { KILN_PIP_INDEX_URL: index.url, KILN_TEMPLATE_BUILD_TIMEOUT_S: '5' },
      sandbox: { templatePoolSize: 0 },
    });
    try {
      const created = await call('POST', '/v1/templates', owner.key, { name: 'slow', pip: ['kiln-slow'] });
      expect(created.status).toBe(201);
      images.add(`kiln-template:${created.body.hash}`);
      await slow.evolution.jobs.drain();
      const failed = (await call('GET', `/v1/templates/${created.body.id}`, owner.key)).body;
      expect(failed.status).toBe('failed');
      expect(failed.error).toContain('the build took longer than 5 s');
      expect(failed.image).toBeNull();
      expect(await imageExists(`kiln-template:${created.body.hash}`)).toBe(false);
      // Waiting never makes a failed template usable: the answer says to fix it with PUT and read its error.
      const use = await call('POST', '/v1/workspaces', owner.key, {
        name: 'uses-failed',
        settings: { sandbox: { template: created.body.id } },
      });
      expect(use.status).toBe(409);
      expect(use.body.error.message).toMatch(/failed to build.*read its error.*PUT \/v1\/templates\//);
      expect((await call('DELETE', `/v1/templates/${created.body.id}`, owner.key)).status).toBe(200);
    } finally {
      await slow.close();
    }
  }, 300_000);

  it("builds have a lane of their own: one team's builds hold one slot, another team's build and a review-lane job go on; caps per team", async () => {
    // An app of its own (its own database): its jobs and audit rows stay out of the suite's app.
    const lanes = await createTestApp({
      env: {
        KILN_PIP_INDEX_URL: index.url,
        KILN_TEMPLATE_BUILD_TIMEOUT_S: '600',
        KILN_TEMPLATE_BUILD_CONCURRENCY: '2',
        KILN_TEMPLATE_BUILD_TEAM_CONCURRENCY: '1',
        KILN_TEMPLATES_MAX_PER_TEAM: '3',
        KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM: '2',
        KILN_JOBS_POLL_MS: '100',
      },
      sandbox: { templatePoolSize: 0 },
    });
    try {
      const a = await lanes.team('lane-a');
      const b = await lanes.team('lane-b');
      const post = (key: string, body: unknown) => lanes.call('POST', '/v1/templates', { key, body });
      // Team A: two builds that wait on an index that never answers (held until the app stops);
      // a third waiting build is past the team's cap.
      const slow = (i: number) => ({ name: `slow-${i}`, pip: ['kiln-slow'], files: [{ path: 'n', content: `${i}` }] });
      for (const i of [1, 2]) expect((await post(a.key, slow(i))).status).toBe(201);
      const queued = await post(a.key, slow(3));
      expect(queued.status).toBe(429);
      expect(queued.body.error.message).toMatch(
        /2 template builds queued or running.*KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM=2/,
      );

      // A job of the review lane is not held up by the builds.
      let reviewed!: () => void;
      const review = new Promise<void>((r) => (reviewed = r));
      lanes.evolution.jobs.handle('test.review-lane', async () => reviewed());
      await lanes.evolution.jobs.start();
      await lanes.evolution.jobs.enqueue('test.review-lane', {});
      await review;
      // Team B's build takes the lane's second slot at once, while A's first build still waits on the index.
      const mine = await post(b.key, { name: 'b-files', files: [{ path: 'b', content: 'b' }] });
      expect(mine.status).toBe(201);
      images.add(`kiln-template:${mine.body.hash}`);
      await until(
        "team B's build to start",
        async () => (await lanes.call('GET', `/v1/templates/${mine.body.id}`, { key: b.key })).body.status,
        (s) => s !== 'queued',
      );
      const aside = (await lanes.call('GET', '/v1/templates', { key: a.key })).body.data;
      expect(aside.map((x: { status: string }) => x.status).sort()).toEqual(['building', 'queued']);
      await until(
        "team B's build",
        async () => (await lanes.call('GET', `/v1/templates/${mine.body.id}`, { key: b.key })).body.status,
        (s) => s === 'ready' || s === 'failed',
      );
      expect((await lanes.call('GET', `/v1/templates/${mine.body.id}`, { key: b.key })).body.status).toBe('ready');
      for (const x of aside) images.add(`kiln-template:${x.hash}`);
      // Past KILN_TEMPLATES_MAX_PER_TEAM, a template is refused even when it needs no build (a cache hit).
      const c = await lanes.team('lane-c');
      const same = (name: string) => post(c.key, { name, files: [{ path: 'b', content: 'b' }] });
      for (const name of ['c1', 'c2', 'c3']) expect((await same(name)).body.status).toBe('ready');
      const many = await same('c4');
      expect(many.status).toBe(409);
      expect(many.body.error.message).toMatch(/this team has 3 templates.*KILN_TEMPLATES_MAX_PER_TEAM=3/);
    } finally {
      await lanes.close();
    }
  }, 300_000);

  it('delete: refused while a workspace uses it, then audited; the image goes with the last template that has it', async () => {
    const refused = await call('DELETE', `/v1/templates/${tpl}`, owner.key);
    expect(refused.status).toBe(409);
    expect(refused.body.error.message).toContain(ws);
    const unset = await call('PATCH', `/v1/workspaces/${ws}`, owner.key, { settings: { sandbox: { template: null } } });
    expect(unset.status).toBe(200);
    await t.templates.refreshPool();
    await t.engine.poolSettled();
    expect(t.engine.warmImages()).toEqual([]);
    expect((await call('DELETE', `/v1/templates/${tpl}`, owner.key)).status).toBe(200);
    expect((await call('GET', `/v1/templates/${tpl}`, owner.key)).status).toBe(404);
    // The other team's template has the same image: it stays until that one goes too.
    expect(await imageExists(image)).toBe(true);
    // Sandboxes still running on it would keep it (Docker refuses to remove an image in use): end them.
    for (const s of sessions) expect((await call('DELETE', `/v1/sessions/${s}`, owner.key)).status).toBe(200);
    const theirs = (await call('GET', '/v1/templates', other.key)).body.data[0].id;
    expect((await call('DELETE', `/v1/templates/${theirs}`, other.key)).status).toBe(200);
    expect(await imageExists(image)).toBe(false);

    const audit = rowsOf<{ action: string; team_id: string }>(
      await t.database.db.execute(
        sql`select action, team_id from audit_events where resource_type = 'template' order by created_at, id`,
      ),
    );
    expect(audit.map((a) => a.action)).toEqual([
      'template.create',
      'template.create',
      'template.update',
      'template.delete',
      'template.create',
      'template.update',
      'template.create',
      'template.delete',
      'template.delete',
      'template.delete',
    ]);
    expect(audit.map((a) => a.team_id)).toEqual([
      owner.id,
      owner.id,
      owner.id,
      owner.id,
      other.id,
      owner.id,
      owner.id,
      owner.id,
      owner.id,
      other.id,
    ]);
  });

  it('a ready template whose image was removed by hand is built again where it is missing, staying ready', async () => {
    const made = await call('POST', '/v1/templates', owner.key, {
      name: 'restored',
      files: [{ path: 'restored.txt', content: 'built again' }],
    });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    images.add(`kiln-template:${made.body.hash}`);
    // The first server was stopped (it starts no build any more): the second one builds.
    await replica!.evolution.jobs.drain();
    const ready = (await call('GET', `/v1/templates/${made.body.id}`, owner.key)).body;
    expect(ready).toMatchObject({ status: 'ready' });
    await docker.getImage(ready.image).remove({ force: true });
    expect(await imageExists(ready.image)).toBe(false);

    // What a server does at start, and a fleet when a host joins.
    await replica!.templates.catchUp();
    expect((await call('GET', `/v1/templates/${made.body.id}`, owner.key)).body).toMatchObject({ status: 'ready' });
    await replica!.evolution.jobs.drain();
    expect(await imageExists(ready.image)).toBe(true);
    const after = (await call('GET', `/v1/templates/${made.body.id}`, owner.key)).body;
    expect(after).toMatchObject({ status: 'ready', image: ready.image, error: null });
    // Nothing missing now: no build is queued.
    const jobs = await buildJobs();
    await replica!.templates.catchUp();
    expect(await buildJobs()).toBe(jobs);
    expect((await call('DELETE', `/v1/templates/${made.body.id}`, owner.key)).status).toBe(200);
  }, 600_000);

  it('a template built on a base sandbox image that changed since (an upgrade) is built again on the new one, its image serving until then, once', async () => {
    // A server whose base is a name of this test's, for the sandbox image to begin with.
    const base = `kiln-test-base:${process.pid}`;
    const first = (await docker.getImage('kiln-sandbox:latest').inspect()).Id;
    await docker.getImage(first).tag({ repo: 'kiln-test-base', tag: String(process.pid) });
    let app: TestApp | undefined;
    try {
      app = await createTestApp({ env: { KILN_SANDBOX_IMAGE: base, KILN_SANDBOX_FAIR_SHARE: 'off' } });
      const team = await app.team('rebased');
      const get = async (id: string) => (await app!.call('GET', `/v1/templates/${id}`, { key: team.key })).body;
      const builds = async () =>
        Number(
          rowsOf<{ n: string }>(
            await app!.database.db.execute(sql`select count(*) as n from jobs where kind = ${TEMPLATE_BUILD_JOB}`),
          )[0]!.n,
        );
      const made = await app.call('POST', '/v1/templates', {
        key: team.key,
        body: { name: 'rebased', files: [{ path: 'base.txt', content: 'on the base of the day' }] },
      });
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      await app.evolution.jobs.drain();
      const before = await get(made.body.id);
      expect(before).toMatchObject({ status: 'ready' });
      images.add(before.image);
      const { session } = await sessionIn(app, team, { sandbox: { template: made.body.id } });
      const read = "print(open('/opt/kiln/template/base.txt').read())";
      expect((await exec(app, team.key, session, read)).stdout).toBe('on the base of the day\n');

      // The base changes under the same name, as `npm start` leaves it after an upgrade whose runner changed.
      const second = execFileSync('docker', ['build', '-q', '-t', base, '-'], {
        input: `FROM ${first}\nLABEL kiln.test.base=${process.pid}\n`,
        encoding: 'utf8',
      }).trim();
      expect(second).not.toBe(first);
      // What a server does at start: the template is built again on it, and meanwhile keeps its image.
      await app.templates.catchUp();
      const building = await get(made.body.id);
      expect(building).toMatchObject({ status: 'queued', image: before.image });
      expect(building.hash).not.toBe(before.hash);
      const meanwhile = await sessionIn(app, team, { sandbox: { template: made.body.id } });
      expect((await exec(app, team.key, meanwhile.session, read)).stdout).toBe('on the base of the day\n');
      await app.evolution.jobs.drain();
      const after = await get(made.body.id);
      expect(after, JSON.stringify(after)).toMatchObject({ status: 'ready', error: null, hash: building.hash });
      expect(after.image).not.toBe(before.image);
      images.add(after.image);
      expect((await docker.getImage(after.image).inspect()).Config.Labels?.['kiln.test.base']).toBe(
        String(process.pid),
      );
      const { log } = (await app.call('GET', `/v1/templates/${made.body.id}/log`, { key: team.key })).body;
      expect(log).toContain(`[kiln] what templates are built from changed (${base} is ${second} now`);
      expect(log).toContain(`${before.image} serves its sessions until then`);
      // New sessions get the new image; the next start builds nothing.
      const later = await sessionIn(app, team, { sandbox: { template: made.body.id } });
      expect((await exec(app, team.key, later.session, read)).stdout).toBe('on the base of the day\n');
      const imageOf = async (s: string) =>
        rowsOf<{ image: string }>(
          await app!.database.db.execute(
            sql`select image from sandboxes where session_id = ${s} and state <> 'removed'`,
          ),
        )[0]?.image;
      expect(await imageOf(meanwhile.session)).toBe(before.image);
      expect(await imageOf(later.session)).toBe(after.image);
      const jobs = await builds();
      await app.templates.catchUp();
      expect(await builds()).toBe(jobs);
      expect(await get(made.body.id)).toMatchObject({ status: 'ready', image: after.image });
    } finally {
      await app?.close();
      await docker
        .getImage(base)
        .remove({ force: true })
        .catch(() => undefined);
    }
  }, 600_000);
});

async function inspectCreated(ref: string): Promise<string> {
  return (await docker.getImage(ref).inspect()).Created;
}
