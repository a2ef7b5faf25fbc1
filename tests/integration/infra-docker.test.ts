import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { recordedPlatform } from '../../infra/daemon-json.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';

const run = promisify(execFile);
const SCRIPT = new URL('../../infra/docker.sh', import.meta.url).pathname;

/**
 * infra/docker.sh against the real dockerd and runsc, with its daemon.json and "did I start
 * dockerd" pid file pointed at files of the test: it must never touch the engine's own.
 */
describe('infra/docker.sh registers gVisor idempotently', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-docker-sh-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const script = (daemonJson: string, env: Record<string, string> = {}) =>
    run('bash', [SCRIPT], {
      env: {
        ...process.env,
        KILN_DOCKER_DAEMON_JSON: daemonJson,
        // Names this test process, which is no dockerd: the script must not reload anything.
        KILN_DOCKERD_PIDFILE: join(dir, 'pid'),
        ...env,
      },
    });
  writeFileSync(join(dir, 'pid'), `${process.pid}\n`);

  it('leaves a daemon.json that already has both runtimes byte for byte as it is, and reloads nothing', async () => {
    const file = join(dir, 'registered.json');
    const before = readFileSync('/etc/docker/daemon.json', 'utf8');
    writeFileSync(file, before);
    const { stderr } = await script(file);
    expect(readFileSync(file, 'utf8')).toBe(before);
    const platform = recordedPlatform(before);
    expect(platform).toBeTruthy();
    expect(stderr).toContain(`kiln-gvisor and kiln-gvisor-nonet are registered (platform ${platform})`);
    expect(stderr).not.toMatch(/reloading|restarting/);
  });

  it('merges both runtimes into other settings, and leaves a dockerd it did not start alone', async () => {
    const file = join(dir, 'other.json');
    writeFileSync(file, JSON.stringify({ 'log-level': 'warn', runtimes: { other: { path: '/opt/other' } } }));
    // Its wrapper of runsc in a directory of the test's, not the machine's.
    const env = { KILN_GVISOR_PLATFORM: 'ptrace', KILN_RUNTIME_DIR: join(dir, 'runtimes') };
    const { stderr } = await script(file, env);
    const after = JSON.parse(readFileSync(file, 'utf8'));
    expect(after['log-level']).toBe('warn');
    expect(after.runtimes.other).toEqual({ path: '/opt/other' });
    // runsc through the wrapper that gives its sandboxes a short CPU time slice, written where it was told.
    const wrapper = after.runtimes['kiln-gvisor-nonet'].path as string;
    expect(wrapper).toMatch(new RegExp(`^${dir}/runtimes/runsc-[0-9a-f]{12}$`));
    expect(after.runtimes['kiln-gvisor-nonet'].runtimeArgs).toEqual(['--platform=ptrace', '--network=none']);
    expect(after.runtimes['kiln-gvisor']).toEqual({ path: wrapper, runtimeArgs: ['--platform=ptrace'] });
    expect(readFileSync(wrapper, 'utf8')).toContain("exec { '/usr/bin/runsc' } '/usr/bin/runsc', @ARGV;");
    const { stdout } = await run(wrapper, ['--version']);
    expect(stdout).toMatch(/^runsc version/);
    expect(stderr).toMatch(/was not started by this script, so it is left alone/);
    expect(stderr).not.toMatch(/reloading|restarting/);
    // A second run changes nothing.
    const merged = readFileSync(file, 'utf8');
    await script(file, env);
    expect(readFileSync(file, 'utf8')).toBe(merged);
    // With no slice, runsc itself.
    await script(file, { ...env, KILN_GVISOR_SLICE_US: '0' });
    expect(JSON.parse(readFileSync(file, 'utf8')).runtimes['kiln-gvisor-nonet'].path).toBe('/usr/bin/runsc');
  });
});

/** A process and every process under it, from /proc. */
function descendants(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(d)]);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  for (const queue = [root]; queue.length; ) {
    const p = queue.pop()!;
    out.push(p);
    queue.push(...(children.get(p) ?? []));
  }
  return out;
}

/** A thread's fair-class slice in ns (sched_getattr's sched_runtime), read as the wrapper sets it. */
const sliceOf = async (tid: number) =>
  Number(
    (
      await run('perl', [
        '-e',
        `my $b = "\\0" x 48; syscall(${process.arch === 'arm64' ? 275 : 315}, ${tid}, $b, 48, 0) == 0 or exit 1; print((unpack("LLQlLQQQ", $b))[5])`,
      ])
    ).stdout,
  );

/**
 * On gVisor's ptrace platform an execution is a chain of wake-ups, each of which waited out the
 * running task's slice (1.4 ms on 2 cores) when another team's sandboxes spun: the machine's
 * registration runs runsc through the wrapper, and every process of a sandbox has its slice.
 */
describe('a gVisor sandbox on this engine', () => {
  let container = '';
  afterAll(async () => {
    if (container) await run('docker', ['rm', '-f', container]).catch(() => undefined);
  });

  it('runs every one of its processes on the host with the short CPU time slice; the API keeps the default', async () => {
    const image = await ensureSandboxImage();
    container = (
      await run('docker', [
        ...['run', '-d', '--runtime', 'kiln-gvisor-nonet', '--network', 'none', '--label', 'kiln.test=slice'],
        ...[
          image,
          'python3',
          '-c',
          'import os, time\nfor _ in range(3):\n    if os.fork() == 0: time.sleep(60)\ntime.sleep(60)',
        ],
      ])
    ).stdout.trim();
    const sandbox = Number((await run('docker', ['inspect', '-f', '{{.State.Pid}}', container])).stdout);
    // The sentry and every process it started: on ptrace, a stub per address space the code runs
    // in (the four Python processes' once they are all there), which the sentry makes later on.
    let pids: number[] = [];
    for (const end = Date.now() + 30_000; pids.length < 6 && Date.now() < end; await delay(100))
      pids = descendants(sandbox);
    expect(pids.length).toBeGreaterThanOrEqual(6);
    const tids = pids.flatMap((p) => readdirSync(`/proc/${p}/task`).map(Number));
    const want = Number(process.env.KILN_GVISOR_SLICE_US ?? 300) * 1000;
    // The kernel's default, as this process has it: other than the wrapper's, or this proves nothing.
    const own = await sliceOf(process.pid);
    expect(own).not.toBe(want);
    // A kernel without custom slices (before 6.12) reports none, and the wrapper changes nothing.
    for (const tid of tids) expect(await sliceOf(tid)).toBe(own === 0 ? 0 : want);
  });
});

/**
 * A dockerd that took `"experimental": true` by a reload reports it on (`docker version`, `docker
 * info`) yet serves no checkpoint call until it is restarted (seen on a new machine, where
 * infra/docker.sh starts dockerd before daemon.json exists and then reloads it). A second dockerd
 * of the test's own (its own sockets, roots and pid file, no bridge, in mount and network namespaces
 * of its own, where /etc/docker is an empty directory of the test's) is put in that state, and both the script and the
 * Docker backend must ask the checkpoint API itself rather than believe the flag.
 */
describe('a dockerd whose experimental flag came by a reload', () => {
  let dir = '';
  const etc = () => join(dir, 'etc');
  const sock = () => join(dir, 'docker.sock');
  const env = () => ({ ...process.env, DOCKER_HOST: `unix://${sock()}` });
  const pid = () => Number(readFileSync(join(dir, 'dockerd.pid'), 'utf8'));
  const experimental = () =>
    run('docker', ['version', '--format', '{{.Server.Experimental}}'], { env: env() }).then(
      (r) => r.stdout.trim(),
      () => undefined,
    );
  let dockerd: ChildProcess | undefined;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kiln-dockerd-reload-'));
    mkdirSync(etc());
    dockerd = spawn(
      'unshare',
      [
        // Its own network namespace too: a dockerd without a bridge removes the machine's docker0 otherwise.
        ...['-m', '-n', '--propagation', 'private', 'sh', '-c'],
        'mount --bind "$0/etc" /etc/docker && exec dockerd --data-root "$0/data" --exec-root "$0/exec" ' +
          '--pidfile "$0/dockerd.pid" -H "unix://$0/docker.sock" --bridge none --iptables=false --ip-masq=false',
        dir,
      ],
      { stdio: 'ignore' },
    );
    while ((await experimental()) !== 'false') await new Promise((r) => setTimeout(r, 250));
    // The machine's runtimes and experimental switch, taken in by a reload, as infra/docker.sh once did.
    writeFileSync(join(etc(), 'daemon.json'), readFileSync('/etc/docker/daemon.json'));
    process.kill(pid(), 'SIGHUP');
    while ((await experimental()) !== 'true') await new Promise((r) => setTimeout(r, 250));
  }, 120_000);
  afterAll(async () => {
    if (dockerd && dockerd.exitCode === null) {
      const exited = new Promise((r) => dockerd!.once('exit', r));
      process.kill(pid(), 'SIGTERM');
      await exited;
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  it('the Docker backend offers gVisor without pausing, and says why', async () => {
    const backend = new DockerBackend(connectDocker(`unix://${sock()}`));
    const gvisor = (await backend.capabilities()).runtimes.find((r) => r.runtime === 'gvisor');
    expect(gvisor).toMatchObject({ runtime: 'gvisor', pause: false });
    expect(gvisor?.pauseOff).toMatch(/checkpoint API is off .*restart/);
  });

  it('infra/docker.sh says checkpoints are off (and leaves a dockerd it did not start alone)', async () => {
    const pidfile = join(dir, 'not-ours.pid');
    writeFileSync(pidfile, `${process.pid}\n`);
    const { stderr } = await run('bash', [SCRIPT], {
      env: { ...env(), KILN_DOCKER_DAEMON_JSON: join(etc(), 'daemon.json'), KILN_DOCKERD_PIDFILE: pidfile },
    });
    expect(stderr).toMatch(/experimental API is off, so idle gVisor sandboxes are removed/);
    expect(stderr).not.toMatch(/restarting|experimental API is on/);
  });
});
