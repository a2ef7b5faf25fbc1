import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Containers } from '../../apps/api/src/sandbox/containers.ts';
import { WarmPool } from '../../apps/api/src/sandbox/pool.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { FakeBackend } from '../support/fake-backend.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/**
 * The sandbox engine's warm pool, claims and reaper, on the in-process backend (which passes the
 * same contract suite as the Docker one) and the embedded database: no Docker, no Postgres server.
 */
const IMAGE = 'kiln-sandbox:fake';

describe('sandbox engine on the fake backend', () => {
  let t: TestApp;
  let fake: FakeBackend;
  let team: { id: string; key: string };
  let clock = Date.now();

  beforeAll(async () => {
    fake = new FakeBackend([IMAGE]);
    t = await createTestApp({
      driver: 'pglite',
      backend: fake,
      sandbox: { poolSize: 2, now: () => clock, reapIntervalMs: 3_600_000 },
      env: { KILN_SANDBOX_IMAGE: IMAGE, KILN_SANDBOX_MAX_PER_TEAM: '3' },
    });
    team = await t.team('fake-engine');
    await t.engine.poolSettled();
  });
  afterAll(() => t?.close());

  const mine = () => [...fake.containers.values()];
  /** The team's live sandboxes, as the API lists them. */
  const liveIds = async () =>
    new Set<string>(
      (await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data.map((s: { id: string }) => s.id),
    );
  /** Containers made for no session that no session has claimed: the warm pool. */
  const warm = async () => {
    const live = await liveIds();
    return mine().filter((c) => c.req.sessionId === '' && !live.has(c.req.sandboxId));
  };

  it('fills the warm pool; a first exec claims a warm sandbox, keeps its state, and the pool refills', async () => {
    expect(await warm()).toHaveLength(2);
    const pooled = new Set((await warm()).map((c) => c.req.sandboxId));
    const created = fake.created.length;
    const { session } = await sessionIn(t, team);
    const first = await exec(t, team.key, session, 'x = 41\nprint(x)');
    expect(first.stdout).toBe('41\n');
    expect(pooled.has(first.sandbox_id)).toBe(true);
    expect((await exec(t, team.key, session, 'print(x)')).sandbox_id).toBe(first.sandbox_id);
    await t.engine.poolSettled();
    expect(await warm()).toHaveLength(2);
    expect(fake.created.length).toBe(created + 1);
  });

  it('gives sessions claimed at once a sandbox each, and holds a team to its maximum', async () => {
    const sessions = await Promise.all([0, 1].map(() => sessionIn(t, team)));
    const results = await Promise.all(sessions.map(({ session }, i) => exec(t, team.key, session, `print(${i})`)));
    expect(results.map((r) => r.stdout)).toEqual(['0\n', '1\n']);
    expect(new Set(results.map((r) => r.sandbox_id)).size).toBe(2);
    // Three live sandboxes now (the first test's and these two): a fourth session is refused.
    const over = await sessionIn(t, team);
    const refused = await t.call('POST', `/v1/sessions/${over.session}/exec`, {
      key: team.key,
      body: { code: 'print(1)' },
    });
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe('sandbox_unavailable');
    for (const { session } of sessions) await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
    await t.engine.reap();
    const again = await exec(t, team.key, over.session, 'print(2)');
    expect(again.stdout).toBe('2\n');
  });

  it('a sandbox whose container went away behind its back: the next exec gets a new one and says so', async () => {
    const { session } = await sessionIn(t, team);
    const before = await exec(t, team.key, session, 'y = 1\nprint(y)');
    const container = mine().find((c) => c.req.sandboxId === before.sandbox_id)!;
    await fake.remove(container.id);
    const after = await exec(t, team.key, session, 'print(y)');
    expect(after.sandbox_id).not.toBe(before.sandbox_id);
    expect(after.restarted).toBe(true);
    expect(after.error).toMatchObject({ type: 'NameError' });
    await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key });
  });

  it("the reaper removes this instance's unused containers and any past their lifetime, never another installation's", async () => {
    const owner = (t.engine as unknown as { opts: { instance: string } }).opts.instance;
    const base = {
      image: IMAGE,
      teamId: '',
      sessionId: '',
      limits: (await warm())[0]!.req.limits,
      runtime: 'runc' as const,
    };
    const stray = await fake.create({
      ...base,
      sandboxId: 'sbx_stray',
      instance: owner,
      expiresAt: new Date(clock + 60_000),
    });
    const foreign = await fake.create({
      ...base,
      sandboxId: 'sbx_foreign',
      instance: 'another-installation',
      expiresAt: new Date(clock - 60_000),
    });
    const { session } = await sessionIn(t, team);
    const live = await exec(t, team.key, session, 'print(3)');
    await t.engine.reap();
    const ids = () => new Set(mine().map((c) => c.id));
    expect(ids().has(stray.id)).toBe(false);
    expect(ids().has(foreign.id)).toBe(true);
    expect(mine().some((c) => c.req.sandboxId === live.sandbox_id)).toBe(true);

    // Past its hard lifetime, a live sandbox goes too; its session gets a new one at its next exec.
    clock += 24 * 3600_000;
    await t.engine.reap();
    expect(mine().some((c) => c.req.sandboxId === live.sandbox_id)).toBe(false);
    const next = await exec(t, team.key, session, 'print(4)');
    expect(next.sandbox_id).not.toBe(live.sandbox_id);
    expect(next.stdout).toBe('4\n');
    await fake.remove(foreign.id);
  });

  it('an idle sandbox is reclaimed after its idle time, and a busy pool is refilled by the reaper', async () => {
    const { session } = await sessionIn(t, team);
    const used = await exec(t, team.key, session, 'print(5)');
    clock += 16 * 60_000;
    await t.engine.reap();
    expect((await liveIds()).has(used.sandbox_id)).toBe(false);
    expect(mine().some((c) => c.req.sandboxId === used.sandbox_id)).toBe(false);
    await t.engine.poolSettled();
    expect(await warm()).toHaveLength(2);
  });
});

describe('a container the engine refuses to start', () => {
  let t: TestApp;
  let fake: FakeBackend;
  let team: { id: string; key: string };

  beforeAll(async () => {
    fake = new FakeBackend([IMAGE]);
    t = await createTestApp({
      driver: 'pglite',
      backend: fake,
      sandbox: { poolSize: 0, reapIntervalMs: 3_600_000 },
      env: { KILN_SANDBOX_IMAGE: IMAGE },
    });
    team = await t.team('refused-start');
  });
  afterAll(() => t?.close());

  it('is a 503 that says the sandbox could not be started (never a 500), leaves nothing behind, and the next exec starts one', async () => {
    const { session } = await sessionIn(t, team);
    const reason = 'failed to create shim task: OCI runtime create failed: cannot read client sync file: EOF';
    fake.refuseStart = reason;
    const refused = await t.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code: 'print(1)' } });
    expect(refused.status).toBe(503);
    expect(refused.body.error).toMatchObject({ code: 'unavailable' });
    expect(refused.body.error.message).toMatch(/^the sandbox could not be started/);
    // The engine's words (host internals) stay in the server's log.
    expect(refused.body.error.message).not.toContain('OCI');
    expect(refused.headers.get('retry-after')).toBe('5');
    // Once, by the request, with its id and the engine's reason as the error's cause.
    const logged = t.logs.filter((l) => JSON.stringify(l).includes('cannot read client sync file'));
    expect(logged, 'the engine failure is logged once').toHaveLength(1);
    expect(logged[0]).toMatchObject({ msg: 'request failed', request_id: refused.body.error.request_id });
    expect((logged[0]!.err as { message: string }).message).toMatch(
      new RegExp(`^the sandbox could not be started.*try again: .*${reason}$`),
    );
    expect(fake.containers.size).toBe(0);
    expect((await t.call('GET', '/v1/sandboxes', { key: team.key })).body.data).toEqual([]);
    fake.refuseStart = null;
    expect((await exec(t, team.key, session, 'print(1)')).stdout).toBe('1\n');
  });
});

describe('warm pool on a backend that binds a container to its team (fair share)', () => {
  let t: TestApp;
  let fake: FakeBackend;

  beforeAll(async () => {
    fake = new FakeBackend([IMAGE], { teamBound: true });
    t = await createTestApp({
      driver: 'pglite',
      backend: fake,
      sandbox: { poolSize: 2, reapIntervalMs: 3_600_000 },
      env: { KILN_SANDBOX_IMAGE: IMAGE, KILN_SANDBOX_MAX_PER_TEAM: '2' },
    });
    await t.engine.poolSettled();
  });
  afterAll(() => t?.close());

  /** Containers made for no session that no session of these teams has claimed, as team id → count. */
  const warmByTeam = async (app: TestApp, teams: { id: string; key: string }[]) => {
    const live = new Set<string>();
    for (const team of teams)
      for (const s of (await app.call('GET', '/v1/sandboxes', { key: team.key })).body.data) live.add(s.id);
    const owner = (app.engine as unknown as { opts: { instance: string } }).opts.instance;
    const counts: Record<string, number> = {};
    for (const c of fake.containers.values())
      if (c.req.instance === owner && c.req.sessionId === '' && !live.has(c.req.sandboxId))
        counts[c.req.teamId] = (counts[c.req.teamId] ?? 0) + 1;
    return counts;
  };
  const warmIds = (teamId: string) =>
    new Set(
      [...fake.containers.values()]
        .filter((c) => c.req.teamId === teamId && c.req.sessionId === '')
        .map((c) => c.req.sandboxId),
    );

  it("makes warm containers for the teams that claimed last, and a team never claims another team's", async () => {
    const [a, b, c] = [await t.team('bound-a'), await t.team('bound-b'), await t.team('bound-c')];
    // No team has claimed yet: nothing is warm, and a team's first sandbox starts cold.
    expect(await warmByTeam(t, [a, b, c])).toEqual({});
    const first = await exec(t, a.key, (await sessionIn(t, a)).session, 'print(1)');
    expect(first.stdout).toBe('1\n');
    await t.engine.poolSettled();
    expect(await warmByTeam(t, [a, b, c])).toEqual({ [a.id]: 2 });

    // Its next session claims one made for it.
    const aWarm = warmIds(a.id);
    const second = await exec(t, a.key, (await sessionIn(t, a)).session, 'print(2)');
    expect(aWarm.has(second.sandbox_id)).toBe(true);
    await t.engine.poolSettled();

    // Another team's session never takes a's: it starts cold, and the pool then holds one for each.
    const bFirst = await exec(t, b.key, (await sessionIn(t, b)).session, 'print(3)');
    expect(warmIds(a.id).has(bFirst.sandbox_id)).toBe(false);
    expect([...fake.containers.values()].find((x) => x.req.sandboxId === bFirst.sandbox_id)!.req.teamId).toBe(b.id);
    await t.engine.poolSettled();
    expect(await warmByTeam(t, [a, b, c])).toEqual({ [a.id]: 1, [b.id]: 1 });

    // A third team pushes out the one that claimed least recently: a's warm container goes.
    await exec(t, c.key, (await sessionIn(t, c)).session, 'print(4)');
    await t.engine.poolSettled();
    expect(await warmByTeam(t, [a, b, c])).toEqual({ [b.id]: 1, [c.id]: 1 });

    // a is at its maximum (two live sandboxes): a third session is refused, and a refused claim is
    // no claim, so a does not push b out of the pool.
    const over = await sessionIn(t, a);
    const refused = await t.call('POST', `/v1/sessions/${over.session}/exec`, {
      key: a.key,
      body: { code: 'print(5)' },
    });
    expect(refused.body.error?.code).toBe('sandbox_unavailable');
    await t.engine.poolSettled();
    expect(await warmByTeam(t, [a, b, c])).toEqual({ [b.id]: 1, [c.id]: 1 });
  });
});

describe('warm pool of template images on a backend that binds a container to its team', () => {
  const TPL = 'kiln-template:fake';
  const limits = { memoryMb: 256, cpus: 1, pids: 128, timeoutS: 30, diskMb: 64 };
  const key = { runtime: 'runc' as const };

  it('keeps a template image warm for the teams that claimed it last, and drops them with the image', async () => {
    const fake = new FakeBackend([IMAGE, TPL], { teamBound: true });
    const log = pino({ level: 'silent' });
    const containers = new Containers(
      fake,
      { image: IMAGE, instance: 'pool-test', maxLifetimeMs: 3_600_000, now: Date.now },
      log,
    );
    const pool = new WarmPool(
      containers,
      {
        size: 1,
        limits,
        key,
        image: IMAGE,
        preparedSize: 0,
        templateSize: 1,
        prepareIntervalMs: 1000,
        prepareConcurrency: 1,
      },
      log,
    );
    pool.use(key, await fake.capabilities());
    pool.setTemplateImages([TPL]);
    await pool.settled();
    // No team has claimed: nothing warm, of either image.
    expect(fake.containers.size).toBe(0);

    pool.claimedBy('team_a', TPL);
    pool.fill();
    await pool.settled();
    const made = () => [...fake.containers.values()].map((c) => [c.req.image, c.req.teamId]);
    expect(made()).toEqual([[TPL, 'team_a']]);
    expect(pool.take(limits, key, TPL, 'team_b')).toBeUndefined();
    const taken = pool.take(limits, key, TPL, 'team_a');
    expect(taken?.forTeam).toBe('team_a');
    pool.fill();
    await pool.settled();
    expect(made()).toEqual([
      [TPL, 'team_a'],
      [TPL, 'team_a'],
    ]);

    // The template is no longer in use: its warm container goes (the claimed one is the session's).
    pool.setTemplateImages([]);
    await pool.settled();
    expect(made()).toEqual([[TPL, 'team_a']]);
    expect([...fake.containers.values()][0]!.req.sandboxId).toBe(taken!.id);
    pool.stop();
  });
});
