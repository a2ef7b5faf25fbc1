import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerRequest, SandboxBackend, SandboxContainer } from '../../apps/api/src/sandbox/backend.ts';
import type { SandboxLimits } from '../../apps/api/src/sandbox/limits.ts';
import { RunnerClient, RunnerGoneError } from '../../apps/api/src/sandbox/runner-client.ts';

/**
 * What every `SandboxBackend` must do, run against each implementation: the Docker backend
 * (tests/integration/backend-contract.test.ts) and the in-process fake the unit tests use
 * (tests/unit/backend-contract.test.ts). A fake that passes it is a second implementation of
 * Kiln's interface, not a mock of Docker: the warm pool, claims and the reaper tested on it
 * meet the same answers they get from Docker.
 */
export function backendContract(
  name: string,
  setup: () => Promise<{ backend: SandboxBackend; image: string; close?: () => Promise<void> }>,
): void {
  describe(`SandboxBackend contract: ${name}`, () => {
    let backend: SandboxBackend;
    let image: string;
    let close: (() => Promise<void>) | undefined;
    const owner = `contract-${randomBytes(4).toString('hex')}`;
    const made: SandboxContainer[] = [];
    const limits: SandboxLimits = { memoryMb: 256, cpus: 0.5, pids: 64, timeoutS: 10, diskMb: 64 };
    const request = (over: Partial<ContainerRequest> = {}): ContainerRequest => ({
      image,
      sandboxId: `sbx_contract${randomBytes(6).toString('hex')}`,
      instance: owner,
      teamId: '',
      sessionId: '',
      expiresAt: new Date(Date.now() + 600_000),
      limits,
      runtime: 'runc',
      ...over,
    });
    const create = async (over: Partial<ContainerRequest> = {}) => {
      const c = await backend.create(request(over));
      made.push(c);
      return c;
    };
    const started = async (c: SandboxContainer) => {
      await backend.start(c);
      return RunnerClient.start(await backend.attachRunner(c), 30_000, true);
    };
    const run = (client: RunnerClient, code: string) =>
      client.exec(code, { timeoutMs: 10_000, maxOutputBytes: 65_536 });

    beforeAll(async () => {
      ({ backend, image, close } = await setup());
    }, 120_000);
    afterAll(async () => {
      for (const c of made) await backend.remove(c.id);
      await close?.();
    });

    it('says what it can do: runc at least, and limits it can and cannot change in place', async () => {
      const caps = await backend.capabilities();
      expect(caps.runtimes.map((r) => r.runtime)).toContain('runc');
      expect(caps.resizable(limits, limits, 'runc')).toBe(true);
      expect(caps.resizable(limits, { ...limits, diskMb: limits.diskMb * 4 }, 'runc')).toBe(false);
      await expect(backend.ping()).resolves.toBeUndefined();
    });

    it('runs a stateful runner that speaks the signed frame protocol', async () => {
      const c = await create();
      const client = await started(c);
      expect((await run(client, 'x = 7')).ok).toBe(true);
      const r = await run(client, 'print(x)');
      expect(r).toMatchObject({ ok: true, exit_code: 0, stdout: '7\n' });
      const failed = await run(client, 'print(nope)');
      expect(failed).toMatchObject({ ok: false, error: { type: 'NameError' } });
      expect(await client.putFile('/tmp/f.bin', Buffer.from([0, 1, 2, 255]))).toBe(4);
      expect([...(await client.getFile('/tmp/f.bin'))]).toEqual([0, 1, 2, 255]);
      expect((await client.ping()).busy).toBe(false);
      client.close();
    });

    it('lists what each container was created for, gives each its own uid, and reports usage', async () => {
      const expiresAt = new Date(Date.now() + 123_000);
      const a = await create({ expiresAt, teamId: 'team_a', sessionId: 'ses_a' });
      const b = await create();
      expect(a.uid).not.toBe(b.uid);
      const listed = (await backend.list()).filter((l) => l.instance === owner);
      const la = listed.find((l) => l.id === a.id);
      expect(la).toMatchObject({ instance: owner, expiresAt: Math.floor(expiresAt.getTime()) });
      expect(la!.sandboxId).toMatch(/^sbx_contract/);
      expect(listed.map((l) => l.id)).toContain(b.id);
      const client = await started(a);
      const usage = await backend.stats(a.id);
      expect(usage?.memoryBytes).toBeGreaterThan(0);
      await backend.update(a, { ...limits, memoryMb: 384, cpus: 1 });
      expect((await run(client, 'print(1)')).stdout).toBe('1\n');
      client.close();
    });

    it('a running sandbox removed from several places at once (the reaper, a close, another replica) is removed once, and every caller is answered', async () => {
      const c = await create();
      const client = await started(c);
      await Promise.all([backend.remove(c.id), backend.remove(c.id), backend.remove(c.id), backend.remove(c.id)]);
      expect(client.alive).toBe(false);
      expect((await backend.list()).map((l) => l.id)).not.toContain(c.id);
      expect(await backend.stats(c.id)).toBeNull();
    });

    it('refuses what cannot be: an image it does not have, a container that is gone', async () => {
      await expect(
        backend.create(request({ image: `kiln-no-such-image:${randomBytes(4).toString('hex')}` })),
      ).rejects.toThrow();
      const c = await create();
      const client = await started(c);
      await backend.remove(c.id);
      // Gone is gone: its runner's stream ends, operations on it say so, a second remove is fine.
      await expect(run(client, 'print(1)')).rejects.toBeInstanceOf(RunnerGoneError);
      expect(client.alive).toBe(false);
      await backend.remove(c.id);
      const err = await backend.start(c).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeDefined();
      expect(backend.isGone(err)).toBe(true);
      expect(await backend.stats(c.id)).toBeNull();
      expect((await backend.list()).map((l) => l.id)).not.toContain(c.id);
      expect(backend.isGone(new Error('something else'))).toBe(false);
    });
  });
}
