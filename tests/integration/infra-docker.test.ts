import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
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
