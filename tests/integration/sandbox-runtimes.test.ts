import { randomBytes } from 'node:crypto';
import { eq } from 'drizzle-orm';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../../apps/api/src/lib/errors.ts';
import { sandboxes, workspaces } from '../../apps/api/src/db/schema/index.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { SandboxEngine } from '../../apps/api/src/sandbox/engine.ts';
import { NoSandboxes } from '../../apps/api/src/sandbox/no-sandboxes.ts';
import { Sealer } from '../../apps/api/src/secrets/sealing.ts';
import { SecretStore } from '../../apps/api/src/secrets/store.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);

async function containerOf(sandboxId: string) {
  const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  return docker.getContainer(c!.Id).inspect();
}

describe('sandbox runtimes with gVisor available (the default KILN_SANDBOX_RUNTIMES)', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    // The server's own default (the test apps otherwise pin runc), and one warm container.
    // The pool without fair share: warm containers for any team (with it, tests/integration/sandbox-fair-share.test.ts).
    t = await createTestApp({
      sandbox: { defaultRuntime: undefined, poolSize: 1 },
      env: { KILN_SANDBOX_FAIR_SHARE: 'off' },
    });
    team = await t.team('runtimes');
    await t.engine.poolSettled();
  });
  afterAll(() => t.close());

  it('offers runc and gvisor, and gives new workspaces gvisor, written into their settings', async () => {
    expect(t.engine.settings.runtimes).toEqual(['runc', 'gvisor']);
    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'default-runtime' } });
    expect(ws.status).toBe(201);
    expect(ws.body.settings.sandbox.runtime).toBe('gvisor');
    const got = await t.call('GET', `/v1/workspaces/${ws.body.id}`, { key: team.key });
    expect(got.body.settings.sandbox.runtime).toBe('gvisor');
  });

  it('a workspace with an egress allowlist gets gvisor (its sandboxes reach the proxy through a relay), and may switch runtimes', async () => {
    const allow = { network: 'allowlist', allow: ['api.example.com'] };
    const picked = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'net-default', settings: { sandbox: allow } },
    });
    expect(picked.status).toBe(201);
    expect(picked.body.settings.sandbox).toMatchObject({ runtime: 'gvisor', network: 'allowlist' });
    const toRunc = await t.call('PATCH', `/v1/workspaces/${picked.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: { runtime: 'runc' } } },
    });
    expect(toRunc.status).toBe(200);
    const back = await t.call('PATCH', `/v1/workspaces/${picked.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: { runtime: 'gvisor' } } },
    });
    expect(back.status).toBe(200);
    expect(back.body.settings.sandbox).toMatchObject({ runtime: 'gvisor', network: 'allowlist' });
  });

  it('runs a gvisor workspace in runsc from the warm pool, and a runc one cold in the default runtime; the list says which', async () => {
    expect(t.engine.poolReady).toBe(1);
    const g = await sessionIn(t, team, { sandbox: { runtime: 'gvisor' } });
    const r = await sessionIn(t, team, { sandbox: { runtime: 'runc' } });
    const ge = await exec(t, team.key, g.session, 'import platform\nprint(platform.release())');
    const re = await exec(t, team.key, r.session, 'print("runc")');
    expect(re.stdout).toBe('runc\n');
    // gVisor's kernel reports its own (fixed) release, never the host's.
    const host = (await docker.info()).KernelVersion as string;
    expect(ge.stdout.trim()).not.toBe(host);
    const gc = await containerOf(ge.sandbox_id);
    const rc = await containerOf(re.sandbox_id);
    expect(gc.HostConfig.Runtime).toBe('kiln-gvisor-nonet');
    expect(rc.HostConfig.Runtime).toBe('runc');
    // The warm container (made for no session) went to the gvisor workspace; runc started cold.
    expect(gc.Config.Labels['kiln.session']).toBe('');
    expect(rc.Config.Labels['kiln.session']).toBe(r.session);
    const [row] = await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, ge.sandbox_id));
    expect(row!.runtime).toBe('gvisor');
    const list = await t.call('GET', '/v1/sandboxes', { key: team.key });
    const byId = Object.fromEntries(list.body.data.map((s: { id: string; runtime: string }) => [s.id, s.runtime]));
    expect(byId).toMatchObject({ [ge.sandbox_id]: 'gvisor', [re.sandbox_id]: 'runc' });
  });
});

describe('sandbox runtimes capped by KILN_SANDBOX_RUNTIMES', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp({ sandbox: { runtimes: ['runc'], defaultRuntime: undefined } });
    team = await t.team('runc-only');
  });
  afterAll(() => t.close());

  it('refuses a runtime the server does not offer with a 400, on create and on patch, and writes nothing', async () => {
    const bad = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'wants-gvisor', settings: { sandbox: { runtime: 'gvisor' } } },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
    expect(bad.body.error.message).toMatch(/settings\.sandbox\.runtime: this server offers runc/);
    expect((await t.call('GET', '/v1/workspaces', { key: team.key })).body.data).toEqual([]);

    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'plain' } });
    expect(ws.body.settings.sandbox.runtime).toBe('runc');
    const patch = await t.call('PATCH', `/v1/workspaces/${ws.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: { runtime: 'gvisor', memory_mb: 256 } } },
    });
    expect(patch.status).toBe(400);
    const after = await t.call('GET', `/v1/workspaces/${ws.body.id}`, { key: team.key });
    expect(after.body.settings.sandbox).toMatchObject({ runtime: 'runc', memory_mb: 512 });
    const unknown = await t.call('PATCH', `/v1/workspaces/${ws.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: { runtime: 'kata' } } },
    });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error.message).toMatch(/sandbox\.runtime/);
  });

  it('an execution in a workspace whose runtime is no longer offered is a 409, never a run in the other runtime', async () => {
    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'was-gvisor' } });
    // As stored by a server that offered gvisor, before KILN_SANDBOX_RUNTIMES dropped it.
    const settings = { ...ws.body.settings, sandbox: { ...ws.body.settings.sandbox, runtime: 'gvisor' } };
    await t.database.db.update(workspaces).set({ settings }).where(eq(workspaces.id, ws.body.id));
    const s = await t.call('POST', `/v1/workspaces/${ws.body.id}/sessions`, { key: team.key, body: {} });
    const r = await t.call('POST', `/v1/sessions/${s.body.id}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(r.status).toBe(409);
    expect(r.body.error.message).toMatch(/sandbox\.runtime is gvisor, which this server does not offer/);
    expect((await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data).toEqual([]);
  });

  it('another team cannot patch the workspace (404)', async () => {
    const ws = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'mine' } });
    const other = await t.team('other');
    const r = await t.call('PATCH', `/v1/workspaces/${ws.body.id}`, {
      key: other.key,
      body: { settings: { sandbox: { runtime: 'runc' } } },
    });
    expect(r.status).toBe(404);
  });
});

describe('start-up', () => {
  it('fails, naming the variable, when KILN_SANDBOX_RUNTIMES lists gvisor and the container runtime lacks it', async () => {
    const t = await createTestApp({ sandbox: false });
    try {
      const engine = new SandboxEngine(
        t.database.db,
        new NoSandboxes(),
        {
          image: 'kiln-sandbox:latest',
          instance: 'startup-test',
          poolSize: 0,
          idleMs: 60_000,
          maxIdleMs: 60_000,
          maxLifetimeMs: 60_000,
          perTeamMax: 1,
          maxLimits: { memoryMb: 512, cpus: 1, pids: 64, timeoutS: 10, diskMb: 64 },
          maxOutputBytes: 65_536,
          reapIntervalMs: 60_000,
          runtimes: ['runc', 'gvisor'],
        },
        pino({ level: 'silent' }),
        new SecretStore(t.database.db, new Sealer(randomBytes(32))),
      );
      const started = engine.start();
      await expect(started).rejects.toThrow(ConfigError);
      await expect(started).rejects.toThrow(/KILN_SANDBOX_RUNTIMES: the container runtime has no gvisor/);
    } finally {
      await t.close();
    }
  });
});

describe('gVisor without egress (KILN_EGRESS_GVISOR=off)', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp({ sandbox: { defaultRuntime: undefined }, env: { KILN_EGRESS_GVISOR: 'off' } });
    team = await t.team('gvisor-no-egress');
  });
  afterAll(() => t.close());

  it('a workspace with an egress allowlist runs under runc: picked for it when it names no runtime, refused with gvisor', async () => {
    const allow = { network: 'allowlist', allow: ['api.example.com'] };
    const picked = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'net-default', settings: { sandbox: allow } },
    });
    expect(picked.status).toBe(201);
    expect(picked.body.settings.sandbox).toMatchObject({ runtime: 'runc', network: 'allowlist' });
    const both = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'net-gvisor', settings: { sandbox: { ...allow, runtime: 'gvisor' } } },
    });
    expect(both.status).toBe(400);
    expect(both.body.error.message).toContain('gVisor sandboxes cannot reach the egress proxy on this server');
    const g = await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'gv-then-net' } });
    expect(g.body.settings.sandbox.runtime).toBe('gvisor');
    const patched = await t.call('PATCH', `/v1/workspaces/${g.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: allow } },
    });
    expect(patched.status).toBe(400);
    const toGvisor = await t.call('PATCH', `/v1/workspaces/${picked.body.id}`, {
      key: team.key,
      body: { settings: { sandbox: { runtime: 'gvisor' } } },
    });
    expect(toGvisor.status).toBe(400);
    // Nothing was written: both keep what they had.
    expect((await t.call('GET', `/v1/workspaces/${g.body.id}`, { key: team.key })).body.settings.sandbox.network).toBe(
      'none',
    );
    expect(
      (await t.call('GET', `/v1/workspaces/${picked.body.id}`, { key: team.key })).body.settings.sandbox.runtime,
    ).toBe('runc');
  });
});
