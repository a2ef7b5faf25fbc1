import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { recordedPlatform } from '../../infra/daemon-json.ts';

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
    const { stderr } = await script(file, { KILN_GVISOR_PLATFORM: 'ptrace' });
    const after = JSON.parse(readFileSync(file, 'utf8'));
    expect(after['log-level']).toBe('warn');
    expect(after.runtimes.other).toEqual({ path: '/opt/other' });
    expect(after.runtimes['kiln-gvisor-nonet']).toEqual({
      path: '/usr/bin/runsc',
      runtimeArgs: ['--platform=ptrace', '--network=none'],
    });
    expect(after.runtimes['kiln-gvisor'].runtimeArgs).toEqual(['--platform=ptrace']);
    expect(stderr).toMatch(/was not started by this script, so it is left alone/);
    expect(stderr).not.toMatch(/reloading|restarting/);
    // A second run changes nothing.
    const merged = readFileSync(file, 'utf8');
    await script(file, { KILN_GVISOR_PLATFORM: 'ptrace' });
    expect(readFileSync(file, 'utf8')).toBe(merged);
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
