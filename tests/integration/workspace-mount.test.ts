import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statfsSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { copyTree } from '../../apps/api/src/sandbox/copy-tree.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { containerSpec, sandboxUser } from '../../apps/api/src/sandbox/docker/container-spec.ts';
import { startRunner } from '../../apps/api/src/sandbox/docker/runner.ts';
import { DEFAULT_SETTINGS } from '../../apps/api/src/workspace/settings.ts';
import { WorkspaceMounts } from '../../apps/api/src/sandbox/workspace-mounts.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
const MiB = 1024 * 1024;
const TMPFS_MAGIC = 0x01021994;
/** Big enough for a 320 MB workspace in /workspace (tmpfsSizes: 760 MB) and what the test writes. */
const BIG = { sandbox: { memory_mb: 2048, disk_mb: 1024 }, quota: { max_files: 10_000, max_bytes: 1024 * MiB } };

/** The workspace mounts of this process's mount namespace under `root`, with their mount options. */
function mountsUnder(root: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-');
    if (sep > 0 && f[4]?.startsWith(`${root}/`)) out.set(f[4], `${f[5]} ${f[sep + 3]}`);
  }
  return out;
}

async function containerOf(sandboxId: string) {
  const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  return c;
}

/** Host workspace mounts: a new session's sandbox gets the working tree by a local copy into a tmpfs of its own. */
describe('the workspace through a host mount', () => {
  const mountDir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
  const owner = `mount-${randomBytes(4).toString('hex')}`;
  const root = join(mountDir, owner);
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp({
      sandbox: { poolSize: 1, perTeamMax: 20 },
      env: {
        KILN_INSTANCE_ID: owner,
        KILN_SANDBOX_WORKSPACE_MOUNT: 'on',
        KILN_SANDBOX_MOUNT_DIR: mountDir,
        KILN_WORKSPACE_MAX_BYTES: String(1024 * MiB),
      },
    });
    team = await t.team('mounts');
  });
  afterAll(async () => {
    await t.close();
    expect(mountsUnder(root).size).toBe(0);
    rmSync(mountDir, { recursive: true, force: true });
  });

  it('chooses the mount once at start-up and says so', () => {
    expect(t.logs.find((l) => l.workspace_copy)).toMatchObject({ workspace_copy: 'mount', dir: root });
  });

  it('a 320 MB workspace reaches a new session; its changes come back and are committed; release unmounts it', async () => {
    const { ws, session } = await sessionIn(t, team, BIG);
    const dir = t.workspaces.dirOf(ws);
    for (let i = 0; i < 320; i++) {
      mkdirSync(join(dir, 'big', `d${i % 8}`), { recursive: true });
      writeFileSync(join(dir, 'big', `d${i % 8}`, `f${i}.bin`), Buffer.alloc(MiB, i % 251));
    }
    // Committed, as a workspace's files are (git's own compression is what takes the time here).
    const git = (...args: string[]) =>
      execFileSync('git', ['-C', dir, '-c', 'user.name=test', '-c', 'user.email=test@example.com', ...args]);
    git('add', 'big');
    git('commit', '-q', '-m', 'big files');
    const r = await exec(
      t,
      team.key,
      session,
      [
        'import hashlib, os',
        'files = [os.path.join(d, f) for d, _, fs in os.walk("/workspace/big") for f in fs]',
        'print(len(files), sum(os.path.getsize(f) for f in files))',
        'print(hashlib.sha256(open("/workspace/big/d3/f11.bin", "rb").read()).hexdigest())',
        'print(os.stat("/workspace/big/d3/f11.bin").st_uid == os.getuid(), os.path.exists("/workspace/.git"))',
        'print([l.split()[3] for l in open("/proc/mounts") if l.split()[1] == "/workspace"][0])',
        // Its own mount, whole (root "/"), and no other sandbox's: the only workspace mount it sees.
        'mi = [l.split() for l in open("/proc/self/mountinfo")]',
        'print([(f[3], f[4]) for f in mi if f[f.index("-") + 2] == "kiln-workspace"])',
        'os.makedirs("/workspace/out", exist_ok=True)',
        '_ = open("/workspace/out/result.txt", "w").write(f"{len(files)} files\\n")',
        'os.remove("/workspace/big/d0/f0.bin")',
      ].join('\n'),
    );
    expect(r.error).toBeUndefined();
    const [count, sha, owned, opts, seen] = r.stdout.trim().split('\n');
    expect(count).toBe(`320 ${320 * MiB}`);
    expect(sha).toBe(
      createHash('sha256')
        .update(readFileSync(join(dir, 'big/d3/f11.bin')))
        .digest('hex'),
    );
    expect(owned).toBe('True False');
    expect(opts).toMatch(/nosuid/);
    expect(opts).toMatch(/nodev/);
    expect(seen).toBe("[('/', '/workspace')]");
    const commit = (r as unknown as { workspace: { commit: { paths: string[] } } }).workspace.commit;
    expect(commit.paths).toEqual(['big/d0/f0.bin', 'out/result.txt']);
    expect(readFileSync(join(dir, 'out/result.txt'), 'utf8')).toBe('320 files\n');
    expect(existsSync(join(dir, 'big/d0/f0.bin'))).toBe(false);

    // The sandbox's own directory: a tmpfs of the size /workspace would have had, nosuid and nodev.
    const mine = join(root, r.sandbox_id);
    const opt = mountsUnder(root).get(mine);
    expect(opt).toMatch(/nosuid/);
    expect(opt).toMatch(/nodev/);
    expect(opt).toMatch(/size=778240k/);
    expect(statfsSync(mine).type).toBe(TMPFS_MAGIC);

    // A file the host writes after the claim (through the files API) is seen by the next exec.
    await t.call('PUT', `/v1/workspaces/${ws}/files?path=later.txt`, { key: team.key, raw: 'written later\n' });
    expect((await exec(t, team.key, session, 'print(open("/workspace/later.txt").read())')).stdout).toBe(
      'written later\n\n',
    );

    expect((await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    expect(mountsUnder(root).has(mine)).toBe(false);
    expect(existsSync(mine)).toBe(false);
  });

  it("a tree larger than the sandbox's /workspace is a 413 on the first exec, and its mount goes", async () => {
    // memory_mb 256 and disk_mb 16: a /workspace of 16 MB, a cold start that copies while its container starts.
    const { ws, session } = await sessionIn(t, team, { sandbox: { memory_mb: 256, disk_mb: 16 } });
    writeFileSync(join(t.workspaces.dirOf(ws), 'big.bin'), Buffer.alloc(24 * MiB, 1));
    const before = new Set(mountsUnder(root).keys());
    const refused = await t.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(refused.status).toBe(413);
    expect(refused.body.error.code).toBe('payload_too_large');
    expect([...mountsUnder(root).keys()].filter((d) => !before.has(d))).toEqual([]);
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
  });

  it('a warm container gets its mount empty at creation and the workspace when claimed', async () => {
    await t.engine.poolSettled();
    const warmDirs = [...mountsUnder(root).keys()];
    expect(warmDirs).toHaveLength(1);
    expect(readdirSync(warmDirs[0]!)).toEqual([]);
    const { ws, session } = await sessionIn(t, team);
    writeFileSync(join(t.workspaces.dirOf(ws), 'notes.md'), 'from the host\n');
    const r = await exec(t, team.key, session, 'print(open("/workspace/notes.md").read(), end="")');
    expect(r.stdout).toBe('from the host\n');
    expect(join(root, r.sandbox_id)).toBe(warmDirs[0]);
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
  });

  it('filling the disk inside ends in ENOSPC on the mount, not on the host disk', async () => {
    const { session } = await sessionIn(t, team);
    const r = await exec(
      t,
      team.key,
      session,
      [
        'import errno, os',
        'try:',
        '    with open("/workspace/fill.bin", "wb") as f:',
        '        while True:',
        '            f.write(b"x" * (1 << 20))',
        'except OSError as e:',
        '    print(errno.errorcode[e.errno])',
        'st = os.statvfs("/workspace")',
        'print(st.f_bavail, st.f_blocks * st.f_frsize // (1 << 20))',
        // Not left behind: over the step's byte limit, nothing of the step would be committed.
        'os.remove("/workspace/fill.bin")',
      ].join('\n'),
    );
    expect(r.error).toBeUndefined();
    expect(r.stdout).toBe('ENOSPC\n0 184\n');
    // The bytes were in the sandbox's own tmpfs (184 MB: tmpfsSizes of the default settings), never on the host's disk.
    const mine = join(root, r.sandbox_id);
    expect(statfsSync(mine).type).toBe(TMPFS_MAGIC);
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
    expect(mountsUnder(root).has(mine)).toBe(false);
  });

  it("the reaper's start-up sweep unmounts what a crashed instance left, and a container removed behind the app's back loses its mount", async () => {
    // What a previous life of this instance left: a mount and a bare directory, with no container.
    const previous = await WorkspaceMounts.open(
      { mode: 'on', dir: mountDir, maxMb: 16, hostMounts: true },
      owner,
      pino({ level: 'silent' }),
    );
    const left = (await previous!.create('sbx_crashedleftover', 1))!;
    expect(mountsUnder(root).has(left)).toBe(true);
    mkdirSync(join(root, 'sbx_bareleftover'));
    // And a live sandbox whose container is removed behind the app's back.
    const { session } = await sessionIn(t, team);
    const r = await exec(t, team.key, session, 'print(1)');
    const mine = join(root, r.sandbox_id);
    expect(mountsUnder(root).has(mine)).toBe(true);
    await docker.getContainer((await containerOf(r.sandbox_id))!.Id).remove({ force: true });
    await t.engine.reap({ startup: true });
    const after = mountsUnder(root);
    expect(after.has(left)).toBe(false);
    expect(after.has(mine)).toBe(false);
    expect(existsSync(left)).toBe(false);
    expect(existsSync(join(root, 'sbx_bareleftover'))).toBe(false);
    expect(existsSync(mine)).toBe(false);
    await t.engine.poolSettled();
  });
});

describe('the tar path', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  const mountDir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
  beforeAll(async () => {
    // A Docker Engine that is not on a local socket cannot see this host's mounts.
    t = await createTestApp({
      sandbox: { workspaceMount: { mode: 'auto', dir: mountDir, maxMb: 4096, hostMounts: false } },
    });
    team = await t.team('tar');
  });
  afterAll(async () => {
    await t.close();
    rmSync(mountDir, { recursive: true, force: true });
  });

  it('is chosen (and logged) when the engine is remote; the workspace still reaches the sandbox and comes back', async () => {
    expect(t.logs.find((l) => l.workspace_copy)).toMatchObject({ workspace_copy: 'tar' });
    expect(String(t.logs.find((l) => l.workspace_copy)?.reason)).toMatch(/unix socket/);
    const { ws, session } = await sessionIn(t, team);
    writeFileSync(join(t.workspaces.dirOf(ws), 'notes.md'), 'by tar\n');
    const r = await exec(
      t,
      team.key,
      session,
      'print(open("/workspace/notes.md").read(), end="")\n_ = open("/workspace/back.txt", "w").write("ok\\n")',
    );
    expect(r.stdout).toBe('by tar\n');
    expect(readFileSync(join(t.workspaces.dirOf(ws), 'back.txt'), 'utf8')).toBe('ok\n');
    expect(mountsUnder(mountDir).size).toBe(0);
  });

  it("streams a tree of many chunks, and one larger than the sandbox's /workspace is a 413", async () => {
    const { ws, session } = await sessionIn(t, team);
    const dir = t.workspaces.dirOf(ws);
    for (let i = 0; i < 6; i++) writeFileSync(join(dir, `part${i}.bin`), Buffer.alloc(4 * MiB, i));
    const r = await exec(
      t,
      team.key,
      session,
      'import os\nprint(sum(os.path.getsize(f"/workspace/part{i}.bin") for i in range(6)))',
    );
    expect(r.stdout).toBe(`${24 * MiB}\n`);
    // memory_mb 256 and disk_mb 16: a /workspace of 16 MB.
    const small = await sessionIn(t, team, { sandbox: { memory_mb: 256, disk_mb: 16 } });
    writeFileSync(join(t.workspaces.dirOf(small.ws), 'big.bin'), Buffer.alloc(24 * MiB, 1));
    const refused = await t.call('POST', `/v1/sessions/${small.session}/exec`, {
      key: team.key,
      body: { code: 'print(1)' },
    });
    expect(refused.status).toBe(413);
    expect(refused.body.error.code).toBe('payload_too_large');
  });
});

describe('the mount budget and the copy', () => {
  const log = pino({ level: 'silent' });

  it('a mount that would take the instance past KILN_SANDBOX_MOUNT_MAX_MB is not made', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
    try {
      const m = await WorkspaceMounts.open({ mode: 'on', dir, maxMb: 100, hostMounts: true }, 'budget', log);
      expect(m).not.toBeNull();
      const a = await m!.create('sbx_a', 60);
      expect(a).toBe(join(dir, 'budget', 'sbx_a'));
      expect(await m!.create('sbx_b', 60)).toBeUndefined();
      expect(m!.mountedMb).toBe(60);
      await m!.remove('sbx_a');
      expect(await m!.create('sbx_b', 60)).toBeDefined();
      await m!.remove('sbx_b');
      expect(mountsUnder(join(dir, 'budget')).size).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a mount kept from a previous life (a paused sandbox\u2019s) counts against the budget of the next', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
    let after: WorkspaceMounts | undefined;
    try {
      const before = (await WorkspaceMounts.open({ mode: 'on', dir, maxMb: 100, hostMounts: true }, 'again', log))!;
      expect(await before.create('sbx_paused', 60)).toBeDefined();
      expect(await before.create('sbx_gone', 10)).toBeDefined();
      // The next life of the instance: it keeps the paused sandbox's mount and sweeps the other.
      after = (await WorkspaceMounts.open({ mode: 'on', dir, maxMb: 100, hostMounts: true }, 'again', log))!;
      expect(after.mountedMb).toBe(0);
      expect(await after.sweep((id) => id === 'sbx_paused')).toBe(1);
      expect(after.mountedMb).toBe(60);
      expect(await after.create('sbx_new', 60)).toBeUndefined();
      expect(await after.create('sbx_new', 40)).toBeDefined();
      await after.sweep(() => false);
      expect(after.mountedMb).toBe(0);
      expect(mountsUnder(join(dir, 'again')).size).toBe(0);
    } finally {
      // Whatever failed, no mount is left behind.
      await after?.sweep(() => false);
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the copy takes regular files and directories only, never follows a link, and gives them to the sandbox uid', async () => {
    const src = mkdtempSync(join(tmpdir(), 'kiln-src-'));
    const dst = mkdtempSync(join(tmpdir(), 'kiln-dst-'));
    try {
      mkdirSync(join(src, '.git'));
      writeFileSync(join(src, '.git', 'HEAD'), 'ref\n');
      mkdirSync(join(src, 'sub', '.git'), { recursive: true });
      writeFileSync(join(src, 'sub', '.git', 'kept'), 'only the top-level .git is the repository\n');
      writeFileSync(join(src, 'sub', 'run.sh'), '#!/bin/sh\n', { mode: 0o4777 });
      writeFileSync(join(src, '.kiln-123.tmp'), 'host temp file\n');
      symlinkSync('/etc/hostname', join(src, 'escape'));
      symlinkSync('/etc', join(src, 'etc'));
      // A socket: no regular file either (like a FIFO or a device), so never copied.
      const sock = createServer();
      await new Promise<void>((resolve) => sock.listen(join(src, 'sock'), resolve));
      utimesSync(join(src, 'sub', 'run.sh'), 1_000_000, 1_000_000);
      const uid = 2_000_000_002;
      expect(await copyTree(src, dst, uid)).toEqual({ files: 2, bytes: 52 });
      sock.close();
      expect(readdirSync(dst).sort()).toEqual(['sub']);
      expect(readdirSync(join(dst, 'sub')).sort()).toEqual(['.git', 'run.sh']);
      const st = lstatSync(join(dst, 'sub', 'run.sh'));
      expect([st.uid, st.gid, st.mode & 0o7777, st.mtimeMs]).toEqual([uid, uid, 0o755, 1_000_000_000]);
      expect(lstatSync(join(dst, 'sub')).uid).toBe(uid);
    } finally {
      rmSync(src, { recursive: true, force: true });
      rmSync(dst, { recursive: true, force: true });
    }
  });

  it('a tree larger than the mount is a 413, not a partial copy that runs', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
    const src = mkdtempSync(join(tmpdir(), 'kiln-src-'));
    try {
      const m = (await WorkspaceMounts.open({ mode: 'on', dir, maxMb: 100, hostMounts: true }, 'small', log))!;
      const dst = (await m.create('sbx_small', 4))!;
      writeFileSync(join(src, 'big.bin'), randomBytes(6 * MiB));
      await expect(copyTree(src, dst, 2_000_000_001)).rejects.toMatchObject({ code: 'payload_too_large' });
      await m.remove('sbx_small');
    } finally {
      rmSync(dir, { recursive: true, force: true });
      rmSync(src, { recursive: true, force: true });
    }
  });

  it('a copy that fails while the walk goes on is handled: no unhandled rejection, a 413, nothing left writing', async () => {
    // CI once ended with an unhandled ENOSPC: a file's copy failed while the walk was still
    // awaiting the listing of further directories, before anything had subscribed to the copy.
    const dir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
    const src = mkdtempSync(join(tmpdir(), 'kiln-src-'));
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    const m = (await WorkspaceMounts.open({ mode: 'on', dir, maxMb: 100, hostMounts: true }, 'walk', log))!;
    try {
      const dst = (await m.create('sbx_walk', 4))!;
      writeFileSync(join(src, 'big.bin'), randomBytes(6 * MiB));
      // Many directories, each a listing (an await) the walk makes after big.bin's copy has started.
      for (let i = 0; i < 400; i++) mkdirSync(join(src, `d${i}`, 'e', 'f'), { recursive: true });
      await expect(copyTree(src, dst, 2_000_000_001)).rejects.toMatchObject({ code: 'payload_too_large' });
      // A rejection nobody handles is reported when the tick that rejected it ends, and a copy that
      // fails before the walk is over does so ticks before copyTree settles.
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await m.remove('sbx_walk');
      rmSync(dir, { recursive: true, force: true });
      rmSync(src, { recursive: true, force: true });
    }
  });
});

describe('under gVisor', () => {
  it("files the host copies into the mount after the container started are the sandbox's, and its writes reach the host", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
    const src = mkdtempSync(join(tmpdir(), 'kiln-src-'));
    const m = (await WorkspaceMounts.open(
      { mode: 'on', dir, maxMb: 1024, hostMounts: true },
      'gvisor',
      pino({ level: 'silent' }),
    ))!;
    const uid = 2_000_000_000 + Math.floor(Math.random() * 1e8);
    const limits = {
      memoryMb: DEFAULT_SETTINGS.sandbox.memory_mb,
      cpus: 1,
      pids: 256,
      timeoutS: 30,
      diskMb: DEFAULT_SETTINGS.sandbox.disk_mb,
    };
    const mount = (await m.create('sbx_gvisor', 64))!;
    await m.own(mount, uid);
    const spec = containerSpec({
      image,
      name: `kiln-test-gvisor-${randomBytes(4).toString('hex')}`,
      limits,
      labels: { 'kiln.test': 'workspace-mount' },
      uid,
      runtime: 'gvisor',
      workspaceDir: mount,
    });
    expect(spec.HostConfig!.Runtime).toBe('kiln-gvisor-nonet');
    const c = await docker.createContainer(spec);
    try {
      await c.start();
      const client = await startRunner(docker, c, sandboxUser(uid));
      mkdirSync(join(src, 'skills', 'builtin'), { recursive: true });
      writeFileSync(join(src, 'data.txt'), 'copied after start\n');
      writeFileSync(join(src, 'skills', 'builtin', 'SKILL.md'), 'builtin\n');
      await copyTree(src, mount, uid);
      expect(await client.syncLocal()).toBe(2);
      const r = await client.exec(
        [
          'import os',
          'print(open("/workspace/data.txt").read(), end="")',
          'print(os.stat("/workspace/data.txt").st_uid == os.getuid())',
          'print(oct(os.stat("/workspace/skills/builtin/SKILL.md").st_mode & 0o777))',
          '_ = open("/workspace/out.txt", "w").write("from gvisor\\n")',
        ].join('\n'),
        { timeoutMs: 30_000, maxOutputBytes: 65_536, sync: true },
      );
      expect(r.stdout).toBe('copied after start\nTrue\n0o444\n');
      expect(r.changes?.changed.map((f) => f.path)).toEqual(['out.txt']);
      expect(readFileSync(join(mount, 'out.txt'), 'utf8')).toBe('from gvisor\n');
      client.close();
    } finally {
      await c.remove({ force: true });
      await m.remove('sbx_gvisor');
      expect(mountsUnder(join(dir, 'gvisor')).size).toBe(0);
      rmSync(dir, { recursive: true, force: true });
      rmSync(src, { recursive: true, force: true });
    }
  });
});

/**
 * Containers filled ahead of time: after a session of a workspace claims a sandbox, the pool
 * fills another with the workspace's tree, so the workspace's next session skips the copy.
 */
describe('warm containers filled for a workspace', () => {
  const mountDir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
  const owner = `prep-${randomBytes(4).toString('hex')}`;
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp({
      sandbox: { poolSize: 1, perTeamMax: 20, preparedPoolSize: 2 },
      env: { KILN_INSTANCE_ID: owner, KILN_SANDBOX_WORKSPACE_MOUNT: 'on', KILN_SANDBOX_MOUNT_DIR: mountDir },
    });
    team = await t.team('prepared');
  });
  afterAll(async () => {
    await t.close();
    expect(mountsUnder(join(mountDir, owner)).size).toBe(0);
    rmSync(mountDir, { recursive: true, force: true });
  });
  const put = (ws: string, path: string, raw: string) =>
    t.call('PUT', `/v1/workspaces/${ws}/files?path=${path}`, { key: team.key, raw });
  const newSession = async (ws: string) =>
    (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id as string;
  /** The mounts of sandboxes the pool holds filled with a workspace: its file is there, and no session has them. */
  const filledFor = async (file: string) => {
    await t.engine.poolSettled();
    const live = (await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data.map((x: { id: string }) => x.id);
    return [...mountsUnder(join(mountDir, owner)).keys()].filter(
      (d) => existsSync(join(d, file)) && !live.includes(d.split('/').at(-1)),
    );
  };

  it('the next session of the workspace takes a container already holding its tree; another workspace never does', async () => {
    const { ws, session } = await sessionIn(t, team);
    expect((await put(ws, 'knowledge/prepared.md', 'filled ahead\n')).status).toBe(200);
    const first = await exec(t, team.key, session, 'print(open("/workspace/knowledge/prepared.md").read(), end="")');
    expect(first.stdout).toBe('filled ahead\n');
    const [filled] = await filledFor('knowledge/prepared.md');
    expect(filled).toBeDefined();
    const filledId = filled!.split('/').at(-1);
    expect(filledId).not.toBe(first.sandbox_id);

    // Another workspace of the same team gets a plain warm or cold container, never that one.
    const other = await sessionIn(t, team);
    const o = await exec(
      t,
      team.key,
      other.session,
      'import os\nprint(os.path.exists("/workspace/knowledge/prepared.md"))',
    );
    expect(o.stdout).toBe('False\n');
    expect(o.sandbox_id).not.toBe(filledId);

    const second = await newSession(ws);
    const s = await exec(t, team.key, second, 'print(open("/workspace/knowledge/prepared.md").read(), end="")');
    expect(s.sandbox_id).toBe(filledId);
    expect(s.stdout).toBe('filled ahead\n');
    // What the session changes still comes back through the runner and is committed.
    await exec(t, team.key, second, 'open("/workspace/knowledge/second.md", "w").write("from the second\\n")');
    const got = await t.call('GET', `/v1/workspaces/${ws}/files?path=knowledge/second.md`, { key: team.key });
    expect(got.body.content).toBe('from the second\n');
  });

  it('a commit after the fill makes it stale: the next session gets a fresh copy with the change', async () => {
    const { ws, session } = await sessionIn(t, team);
    expect((await put(ws, 'knowledge/v.md', 'one\n')).status).toBe(200);
    await exec(t, team.key, session, 'pass');
    const [filled] = await filledFor('knowledge/v.md');
    expect(filled).toBeDefined();
    expect((await put(ws, 'knowledge/v.md', 'two\n')).status).toBe(200);
    const next = await newSession(ws);
    const r = await exec(t, team.key, next, 'print(open("/workspace/knowledge/v.md").read(), end="")');
    expect(r.stdout).toBe('two\n');
    expect(r.sandbox_id).not.toBe(filled!.split('/').at(-1));
    // The stale one goes, with its mount.
    await expect.poll(() => existsSync(filled!), { timeout: 10_000 }).toBe(false);
  });

  it('deleting the workspace removes the containers filled with it', async () => {
    const { ws, session } = await sessionIn(t, team);
    expect((await put(ws, 'knowledge/bye.md', 'bye\n')).status).toBe(200);
    await exec(t, team.key, session, 'pass');
    const [filled] = await filledFor('knowledge/bye.md');
    expect(filled).toBeDefined();
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
    expect((await t.call('DELETE', `/v1/workspaces/${ws}`, { key: team.key })).status).toBe(200);
    await expect.poll(() => existsSync(filled!), { timeout: 10_000 }).toBe(false);
  });
});

/**
 * The containers made for the prepared pool: only when no fresh one is held for the workspace,
 * never because sessions execute, at most once per interval for a workspace.
 */
describe('how often a container is filled for a workspace', () => {
  const mountDir = mkdtempSync(join(tmpdir(), 'kiln-mounts-'));
  const owner = `fills-${randomBytes(4).toString('hex')}`;
  let t: TestApp;
  let team: { id: string; key: string };
  /**
   * This app's containers created for no session (the prepared ones: the warm pool is off), each
   * with how many fills had finished when Docker reported it.
   */
  const made: { sandbox: string; filledBefore: number }[] = [];
  const fillsDone = () => t.logs.filter((l) => l.msg === "sandbox filled for the workspace's next session").length;
  let events: NodeJS.ReadableStream;
  beforeAll(async () => {
    t = await createTestApp({
      sandbox: { poolSize: 0, perTeamMax: 40, preparedPoolSize: 2, prepareIntervalMs: 1000 },
      env: { KILN_INSTANCE_ID: owner, KILN_SANDBOX_WORKSPACE_MOUNT: 'on', KILN_SANDBOX_MOUNT_DIR: mountDir },
    });
    team = await t.team('fills');
    // Only this app's containers (its own owner label): other suites run beside this one.
    events = await docker.getEvents({
      filters: { label: [`kiln.owner=${owner}`], type: ['container'], event: ['create'] },
    });
    events.on('data', (d: Buffer) => {
      for (const line of d.toString().split('\n').filter(Boolean)) {
        const e = JSON.parse(line) as { Actor: { Attributes: Record<string, string> } };
        if (!e.Actor.Attributes['kiln.session'])
          made.push({ sandbox: e.Actor.Attributes['kiln.sandbox'] ?? '', filledBefore: fillsDone() });
      }
    });
  });
  afterAll(async () => {
    (events as unknown as { destroy(): void }).destroy();
    await t.close();
    expect(mountsUnder(join(mountDir, owner)).size).toBe(0);
    rmSync(mountDir, { recursive: true, force: true });
  });
  const put = (ws: string, path: string, raw: string) =>
    t.call('PUT', `/v1/workspaces/${ws}/files?path=${path}`, { key: team.key, raw });
  /** Mounts of containers no session has (the prepared ones) whose copy of `file` reads `content`. */
  const filledWith = async (file: string, content: string) => {
    const live = (await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data.map((x: { id: string }) => x.id);
    return [...mountsUnder(join(mountDir, owner)).keys()].filter(
      (d) =>
        !live.includes(d.split('/').at(-1)) &&
        existsSync(join(d, file)) &&
        readFileSync(join(d, file), 'utf8') === content,
    );
  };
  /** Every container this app created for no session has been reported by Docker (its events lag a little). */
  const madeSettled = async () => {
    await t.engine.poolSettled();
    const ours = await docker.listContainers({
      all: true,
      filters: { label: [`kiln.owner=${owner}`, 'kiln.session='] },
    });
    await expect
      .poll(() => ours.every((c) => made.some((m) => m.sandbox === c.Labels['kiln.sandbox'])), { timeout: 10_000 })
      .toBe(true);
    return made.length;
  };

  it('16 sessions of one workspace starting at once and then executing fill one container for it, not one each', async () => {
    const { ws, session } = await sessionIn(t, team);
    expect((await put(ws, 'knowledge/once.md', 'one\n')).status).toBe(200);
    const sessions = [session];
    for (let i = 1; i < 16; i++)
      sessions.push((await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id);
    const before = made.length;
    await Promise.all(sessions.map((s) => exec(t, team.key, s, 'print(1)')));
    await expect.poll(async () => (await filledWith('knowledge/once.md', 'one\n')).length, { timeout: 30_000 }).toBe(1);
    expect((await madeSettled()) - before).toBe(1);
    // Executions that change nothing make no container at all.
    const quiet = made.length;
    for (let round = 0; round < 5; round++) await Promise.all(sessions.map((s) => exec(t, team.key, s, 'print(1)')));
    expect((await madeSettled()) - quiet).toBe(0);
    for (const s of sessions) await t.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
  });

  it('fills for several workspaces at once wait for one of the 2 slots: a third starts only after one is done', async () => {
    const four = await Promise.all([0, 1, 2, 3].map(() => sessionIn(t, team)));
    const before = made.length;
    const done = fillsDone();
    await Promise.all(four.map((x) => exec(t, team.key, x.session, 'pass')));
    await expect.poll(async () => (await madeSettled()) - before, { timeout: 30_000 }).toBe(4);
    // The k-th of them (from 0) was created after at least k - 1 fills had finished (prepareConcurrency 2).
    for (const [k, m] of made.slice(before).entries())
      expect(m.filledBefore - done, `fill ${k}`).toBeGreaterThanOrEqual(k - 1);
    for (const x of four) await t.call('DELETE', `/v1/sessions/${x.session}`, { key: team.key });
  });

  it('a workspace whose sandboxes the pool cannot serve (another runtime) gets no container filled for it', async () => {
    const { ws, session } = await sessionIn(t, team, { sandbox: { runtime: 'gvisor' } });
    const before = made.length;
    expect((await put(ws, 'knowledge/g.md', 'g\n')).status).toBe(200);
    expect((await exec(t, team.key, session, 'print(open("/workspace/knowledge/g.md").read(), end="")')).stdout).toBe(
      'g\n',
    );
    expect((await put(ws, 'knowledge/g.md', 'h\n')).status).toBe(200);
    expect((await madeSettled()) - before).toBe(0);
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
  });

  it('a commit refills the workspace once in the background; a burst of commits is refilled at most once per interval', async () => {
    const { ws, session } = await sessionIn(t, team);
    expect((await put(ws, 'knowledge/v.md', 'v0\n')).status).toBe(200);
    await exec(t, team.key, session, 'pass');
    await expect.poll(async () => (await filledWith('knowledge/v.md', 'v0\n')).length, { timeout: 30_000 }).toBe(1);
    await madeSettled();

    // One change: one new container holding it, made without any new session.
    const one = made.length;
    expect((await put(ws, 'knowledge/v.md', 'v1\n')).status).toBe(200);
    await expect.poll(async () => (await filledWith('knowledge/v.md', 'v1\n')).length, { timeout: 30_000 }).toBe(1);
    expect((await madeSettled()) - one).toBe(1);

    // Six changes in a row: the last reaches a container, and no more than two were made for them,
    // plus one for each pause between two commits that was itself a whole interval (a loaded machine
    // can take that long over one PUT, and a fill may then rightly start between them).
    const burst = made.length;
    const committed: number[] = [];
    for (let i = 2; i <= 7; i++) {
      expect((await put(ws, 'knowledge/v.md', `v${i}\n`)).status).toBe(200);
      committed.push(performance.now());
    }
    const quiet = committed.slice(1).filter((at, i) => at - committed[i]! >= 1000).length;
    await expect.poll(async () => (await filledWith('knowledge/v.md', 'v7\n')).length, { timeout: 30_000 }).toBe(1);
    expect((await madeSettled()) - burst).toBeLessThanOrEqual(2 + quiet);
    // The stale ones went with their mounts: one container holds the workspace.
    await expect.poll(async () => (await filledWith('knowledge/v.md', 'v1\n')).length, { timeout: 10_000 }).toBe(0);

    // A new session takes the fresh one.
    const next = (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body.id;
    const [fresh] = await filledWith('knowledge/v.md', 'v7\n');
    const r = await exec(t, team.key, next, 'print(open("/workspace/knowledge/v.md").read(), end="")');
    expect(r.stdout).toBe('v7\n');
    expect(r.sandbox_id).toBe(fresh!.split('/').at(-1));
  });
});
