import { createServer, type Server } from 'node:net';
import { randomBytes } from 'node:crypto';
import { rmSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const MiB = 1024 * 1024;

describe('sandbox hardening (inspected on the real container)', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  let session: string;
  let inspect: Awaited<ReturnType<ReturnType<typeof docker.getContainer>['inspect']>>;

  beforeAll(async () => {
    t = await createTestApp({ sandbox: { maxLimits: { memoryMb: 384, cpus: 0.5, pids: 64, timeoutS: 30, diskMb: 32 } } });
    team = await t.team('hardening');
    // The workspace asks for more than the server allows: every limit must be capped.
    ({ session } = await sessionIn(t, team, { sandbox: { memory_mb: 8192, cpus: 4, pids: 4096, timeout_s: 600, disk_mb: 4096 } }));
    const r = await exec(t, team.key, session, 'print("up")');
    const [c] = await docker.listContainers({ filters: { label: [`kiln.sandbox=${r.sandbox_id}`] } });
    inspect = await docker.getContainer(c!.Id).inspect();
  });
  afterAll(() => t.close());

  it('has no network, no capabilities, no new privileges and the default seccomp profile', () => {
    const h = inspect.HostConfig;
    expect(h.NetworkMode).toBe('none');
    expect((inspect.Config as { NetworkDisabled?: boolean }).NetworkDisabled).toBe(true);
    expect(h.CapDrop).toEqual(['ALL']);
    expect(h.CapAdd ?? []).toEqual([]);
    expect(h.SecurityOpt).toEqual(['no-new-privileges']);
    expect(h.Privileged).toBe(false);
    expect(JSON.stringify(h.SecurityOpt)).not.toContain('seccomp=unconfined');
  });

  it('runs as non-root with a read-only root and size-limited tmpfs', () => {
    expect(inspect.Config.User).not.toMatch(/^(0|root)(:|$)/);
    expect(inspect.Config.User).not.toBe('');
    expect(inspect.HostConfig.ReadonlyRootfs).toBe(true);
    expect(inspect.HostConfig.Tmpfs!['/tmp']).toContain('size=32m');
    expect(inspect.HostConfig.Tmpfs!['/workspace']).toContain('size=32m');
    for (const opts of Object.values(inspect.HostConfig.Tmpfs!)) expect(opts).toMatch(/nosuid.*nodev|nodev.*nosuid/);
  });

  it('caps memory (= memory + swap), CPU, pids, open files and file size by the server maxima', () => {
    const h = inspect.HostConfig;
    expect(h.Memory).toBe(384 * MiB);
    expect(h.MemorySwap).toBe(384 * MiB);
    expect(h.NanoCpus).toBe(0.5e9);
    expect(h.PidsLimit).toBe(64);
    const ulimits = Object.fromEntries((h.Ulimits ?? []).map((u) => [u.Name, u]));
    expect(ulimits.nofile).toMatchObject({ Soft: 1024, Hard: 1024 });
    expect(ulimits.fsize).toMatchObject({ Soft: 32 * MiB, Hard: 32 * MiB });
    expect(h.Init).toBe(true);
  });

  it('publishes no ports, mounts no Docker socket, and is labelled for the reaper', () => {
    expect(inspect.HostConfig.PortBindings ?? {}).toEqual({});
    expect(inspect.HostConfig.PublishAllPorts).toBe(false);
    expect(inspect.Mounts.filter((m) => m.Type === 'bind')).toEqual([]);
    expect(JSON.stringify(inspect.Mounts)).not.toContain('docker.sock');
    const labels = inspect.Config.Labels;
    expect(labels['kiln.managed']).toBe('1');
    expect(labels['kiln.team']).toBe(team.id);
    expect(labels['kiln.session']).toBe(session);
    expect(Date.parse(labels['kiln.expires']!)).toBeGreaterThan(Date.now());
  });

  it('inside, the code is uid 10001 with no effective capabilities and NoNewPrivs set', async () => {
    const r = await exec(t, team.key, session, [
      'import os',
      'st = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)',
      'print(os.getuid(), os.getgid(), st["CapEff"].strip(), st["NoNewPrivs"].strip())',
    ].join('\n'));
    expect(r.stdout.trim()).toBe('10001 10001 0000000000000000 1');
  });
});

describe('hostile code is contained, reported clearly, and the sandbox stays usable', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  let session: string;
  const run = (code: string, timeout_s?: number) => exec(t, team.key, session, code, timeout_s);
  const stillWorks = async () => {
    const r = await run('print(sum(range(10)))');
    expect(r.stdout).toBe('45\n');
    expect(r.error).toBeUndefined();
  };

  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('hostile');
    ({ session } = await sessionIn(t, team, { sandbox: { memory_mb: 256, pids: 64, disk_mb: 64, timeout_s: 30 } }));
    await run('keep = "state"');
  });
  afterAll(() => t.close());

  it('a memory hog is reported as out of memory and the interpreter restarts', async () => {
    const r = await run('hog = []\nwhile True:\n    hog.append(bytearray(16 * 1024 * 1024))');
    expect(r.error!.type).toBe('OutOfMemory');
    expect(r.error!.message).toMatch(/out of memory/);
    expect(r.restarted).toBe(true);
    await stillWorks();
    await run('keep = "state"');
  });

  it('a fork bomb hits the process limit, is reported, and leaves no process behind', async () => {
    const r = await run('import os\nwhile True:\n    os.fork()', 20);
    expect(r.error!.message).toMatch(/process limit of 64/);
    const ps = await run('import os\nprint(len([p for p in os.listdir("/proc") if p.isdigit()]))');
    // The runner, its interpreter and the container's init and keeper: nothing from the bomb.
    expect(Number(ps.stdout)).toBeLessThanOrEqual(4);
    expect((await run('keep')).stdout).toBe("'state'\n");
  });

  it('filling the disk is reported as full and the space can be reclaimed', async () => {
    const r = await run('for i in range(100):\n    open(f"/tmp/fill{i}", "wb").write(b"0" * 4 * 1024 * 1024)');
    expect(r.error!.type).toBe('OSError');
    expect(r.error!.message).toMatch(/No space left on device.*disk space is full/);
    const big = await run('open("/tmp/one", "wb").write(b"0" * 80 * 1024 * 1024)');
    expect(big.error!.message).toMatch(/File too large|No space left/);
    await run('import glob, os\nfor f in glob.glob("/tmp/fill*") + glob.glob("/tmp/one"): os.remove(f)');
    expect((await run('open("/tmp/ok", "w").write("fine")')).stdout).toBe('4\n');
    await stillWorks();
  });

  it('has no way out to the network: only loopback exists and the host\u2019s ports are unreachable', async () => {
    const server: Server = createServer((s) => s.end('host secret\n'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    try {
      const r = await run([
        'import os, socket',
        'print(sorted(os.listdir("/sys/class/net")))',
        's = socket.socket()',
        's.settimeout(2)',
        `try:\n    s.connect(("127.0.0.1", ${port}))\n    print("connected", s.recv(100))\nexcept OSError as e:\n    print("refused", type(e).__name__)`,
      ].join('\n'));
      expect(r.stdout).toBe("['lo']\nrefused ConnectionRefusedError\n");
    } finally {
      server.close();
    }
  });

  it('an infinite loop is interrupted at the time limit and the variables survive', async () => {
    const r = await run('n = 0\nwhile True:\n    n += 1', 1);
    expect(r.error!.type).toBe('Timeout');
    expect(r.error!.message).toMatch(/1 s time limit.*variables are kept/);
    expect(r.restarted).toBe(false);
    expect(r.exit_code).toBe(124);
    expect(Number((await run('n > 0')).stdout.trim() === 'True')).toBe(1);
    expect((await run('keep')).stdout).toBe("'state'\n");
  });

  it('code that ignores interrupts and a child that ignores SIGTERM are killed; the interpreter restarts', async () => {
    const r = await run([
      'import signal, subprocess',
      'child = subprocess.Popen(["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])',
      'signal.signal(signal.SIGINT, signal.SIG_IGN)',
      'while True: pass',
    ].join('\n'), 1);
    expect(r.error!.type).toBe('Timeout');
    expect(r.error!.message).toMatch(/did not stop when interrupted.*restarted/);
    expect(r.restarted).toBe(true);
    const ps = await run('import os\nprint(len([p for p in os.listdir("/proc") if p.isdigit()]))');
    expect(Number(ps.stdout)).toBeLessThanOrEqual(4);
    expect((await run('"keep" in dir()')).stdout).toBe('False\n');
    await stillWorks();
  });

  it('10 MB of output keeps head and tail and reports the full byte count', async () => {
    const r = await run('print("START" + "x" * 10_000_000 + "END")');
    expect(r.truncated).toBe(true);
    expect(r.stdout_bytes).toBe(10_000_009);
    expect(r.stdout.startsWith('STARTxxx')).toBe(true);
    expect(r.stdout.trimEnd().endsWith('xxxEND')).toBe(true);
    expect(r.stdout).toMatch(/\[\d+ bytes omitted of 10000009\]/);
    expect(r.stdout.length).toBeLessThan(100_000);
    await stillWorks();
  });

  it('cannot read the host\u2019s files or the Docker socket', async () => {
    const marker = `/tmp/kiln-host-secret-${randomBytes(6).toString('hex')}`;
    writeFileSync(marker, 'top secret');
    try {
      const r = await run([
        'import os',
        `print(os.path.exists(${JSON.stringify(marker)}), os.path.exists("/var/run/docker.sock"), os.path.exists("/run/docker.sock"))`,
        'try:\n    open("/etc/shadow").read()\n    print("read shadow")\nexcept PermissionError:\n    print("denied")',
      ].join('\n'));
      expect(r.stdout).toBe('False False False\ndenied\n');
    } finally {
      rmSync(marker);
    }
  });

  it('cannot write outside /workspace, /tmp and home; the error says where it may write', async () => {
    for (const path of ['/etc/evil', '/usr/lib/evil.py', '/opt/kiln/kiln_runner.py', '/evil']) {
      const r = await run(`open(${JSON.stringify(path)}, "w").write("x")`);
      expect(r.error!.type, path).toMatch(/OSError|PermissionError/);
      expect(r.error!.message, path).toMatch(/Read-only file system|Permission denied/);
    }
    const ro = await run('open("/etc/evil", "w")');
    expect(ro.error!.message).toMatch(/only \/workspace, \/tmp and the home directory are writable/);
    expect((await run('open("/workspace/ok.txt", "w").write("ok")')).stdout).toBe('2\n');
  });
});

describe('the host does not trust what comes out of the sandbox', () => {
  it('a forged oversized frame written to the runner\u2019s stdout ends that sandbox, not the server; the next exec gets a new one', async () => {
    const t = await createTestApp();
    try {
      const team = await t.team('forger');
      const { session } = await sessionIn(t, team);
      const first = await exec(t, team.key, session, 'x = 1');
      const forged = await exec(t, team.key, session, [
        'import os, struct',
        'fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY)',
        'os.write(fd, struct.pack(">I", 2**30) + b"x" * 1000)',
      ].join('\n'));
      expect(forged.error!.type).toBe('SandboxLost');
      expect(forged.error!.message).toMatch(/frame of 1073741824 bytes/);
      const next = await exec(t, team.key, session, '"x" in dir()');
      expect(next.sandbox_id).not.toBe(first.sandbox_id);
      expect(next).toMatchObject({ stdout: 'False\n', restarted: true });
    } finally {
      await t.close();
    }
  });

  it('files over the size cap written in /workspace are not committed, and stay in the sandbox', async () => {
    const t = await createTestApp({ maxFileBytes: 64 * 1024 });
    try {
      const team = await t.team('big-writer');
      const { session } = await sessionIn(t, team);
      const r = (await exec(t, team.key, session, 'open("/workspace/big.bin", "wb").write(b"0" * 100_000)\nopen("/workspace/small.txt", "w").write("ok")')) as unknown as {
        workspace: { commit: { paths: string[] }; refused: { path: string; reason: string }[] };
      };
      expect(r.workspace.commit.paths).toEqual(['small.txt']);
      expect(r.workspace.refused).toEqual([{ path: 'big.bin', reason: expect.stringMatching(/100000 bytes is over the 65536-byte file limit/) }]);
      expect((await exec(t, team.key, session, 'import os\nos.path.getsize("/workspace/big.bin")')).stdout).toBe('100000\n');
    } finally {
      await t.close();
    }
  });
});
