import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { installationInstanceId } from '../../apps/api/src/config.ts';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const exists = async (sandboxId: string) =>
  (await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } })).length > 0;

/** Two installations (two databases) on one Docker host never reap each other's sandboxes. */
describe('sandbox ownership between installations', () => {
  let a: TestApp;
  let b: TestApp;
  let later = Date.now();
  beforeAll(async () => {
    a = await createTestApp({ sandbox: { poolSize: 1 } });
    // The other installation's clock is past every lifetime: expiry alone must not make A's containers its own.
    b = await createTestApp({ sandbox: { now: () => later } });
  });
  afterAll(async () => {
    await b.close();
    await a.close();
  });

  it('another installation\u2019s reaper, at start-up and past the lifetime, leaves this one\u2019s pool and live sandboxes alone', async () => {
    const team = await a.team('owner-a');
    const { session } = await sessionIn(a, team);
    const first = await exec(a, team.key, session, 'x = 41');
    await a.engine.poolSettled();
    const [row] = await a.database.db.select().from(sandboxes).where(eq(sandboxes.id, first.sandbox_id));
    // The live sandbox and one warm container.
    const mine = () => docker.listContainers({ filters: { label: [`kiln.owner=${row!.instance}`] } });
    expect(await mine()).toHaveLength(2);
    later = Date.now() + 365 * 86_400_000;
    await b.engine.reap({ startup: true });
    await b.engine.reap();
    expect(await exists(first.sandbox_id)).toBe(true);
    expect(await mine()).toHaveLength(2);
    const next = await exec(a, team.key, session, 'print(x + 1)');
    expect(next).toMatchObject({ stdout: '42\n', restarted: false, sandbox_id: first.sandbox_id });
  });

  it('a warm container removed behind the server’s back is replaced when claimed: never a 500', async () => {
    const team = await a.team('owner-gone');
    for (let round = 0; round < 3; round++) {
      await a.engine.poolSettled();
      // biome-ignore lint/complexity/useLiteralKeys: the warm pool is private; the test reads it on purpose.
      const pooled = a.engine['pool'].warm.map((c) => ({ id: c.id, container: c.container.id }));
      expect(pooled).toHaveLength(1);
      // Another installation (or a person with the Docker CLI) removes it; the server may or may
      // not have seen its runner's stream end by the time the claim takes it.
      await docker.getContainer(pooled[0]!.container).remove({ force: true });
      const { session } = await sessionIn(a, team);
      const r = await a.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(6 * 7)' } });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.body).toMatchObject({ stdout: '42\n', exit_code: 0 });
      expect(r.body.sandbox_id).not.toBe(pooled[0]!.id);
    }
  });

  it('the default instance id is made once per installation and kept in its data directory', () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-data-'));
    const other = mkdtempSync(join(tmpdir(), 'kiln-data-'));
    try {
      const id = installationInstanceId(dir);
      expect(id).toMatch(/^[A-Za-z0-9._-]{1,64}$/);
      expect(readFileSync(join(dir, 'instance-id'), 'utf8').trim()).toBe(id);
      expect(installationInstanceId(dir)).toBe(id);
      expect(installationInstanceId(other)).not.toBe(id);
    } finally {
      rmSync(dir, { recursive: true, force: true });
      rmSync(other, { recursive: true, force: true });
    }
  });
});
