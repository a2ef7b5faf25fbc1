import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { RUNNER_PROTOCOL } from '../../apps/api/src/sandbox/runner-client.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { createTestApp, type TestApp } from '../support/app.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
/** The sandbox image as one built from older sources would be: its runner names another protocol. */
const OLD = `kiln-test-old-runner:${process.pid}`;

/**
 * A sandbox image whose runner speaks another version of the frames than the server (built from
 * other sources: a server updated without `npm run sandbox:build`, a host's older image): the
 * server refuses to speak to it, and says why, rather than misread what it sends.
 */
describe('a sandbox image older than the server', () => {
  let t: TestApp;
  let team: { id: string; key: string };

  beforeAll(async () => {
    await ensureSandboxImage();
    execFileSync('docker', ['build', '-q', '-t', OLD, '-'], {
      input: [
        'FROM kiln-sandbox:latest',
        'USER 0:0',
        `RUN ["sed", "-i", "s/^PROTOCOL = ${RUNNER_PROTOCOL}$/PROTOCOL = 0/", "/opt/kiln/kiln_runner.py"]`,
        'USER 65534:65534',
      ].join('\n'),
      encoding: 'utf8',
    });
    t = await createTestApp({ env: { KILN_SANDBOX_IMAGE: OLD }, sandbox: { poolSize: 0 } });
    team = await t.team('old-image');
  });
  afterAll(async () => {
    await t?.close();
    await docker
      .getImage(OLD)
      .remove({ force: true })
      .catch(() => undefined);
  });

  it('an exec answers 503 saying the runner speaks another protocol and how to mend it; no container is left', async () => {
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'old' } })).body.id as string;
    const session = (await t.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key, body: {} })).body
      .id as string;
    for (let i = 0; i < 2; i++) {
      const r = await t.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(1)' } });
      expect(r.status, JSON.stringify(r.body)).toBe(503);
      expect(r.body.error.code).toBe('unavailable');
      expect(r.body.error.message).toContain(
        `image ${OLD}: the sandbox's runner speaks protocol 0, this server ${RUNNER_PROTOCOL}`,
      );
      expect(r.body.error.message).toContain('npm run sandbox:build');
    }
    expect(await docker.listContainers({ all: true, filters: { ancestor: [OLD] } })).toEqual([]);
  });
});
