import { eq } from 'drizzle-orm';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../apps/api/src/db/client.ts';
import { jobs } from '../../apps/api/src/db/schema/index.ts';
import { JobRunner } from '../../apps/api/src/jobs/runner.ts';
import { createPgDatabase, createTestDatabase, dropPgDatabase } from '../support/db.ts';

const log = pino({ level: 'silent' });

describe('durable jobs on Postgres, two runners (replicas) on one database', () => {
  let url: string;
  let a: Database;
  let b: Database;
  let now = Date.now();
  const clock = () => now;
  const runner = (db: Database, owner: string) =>
    new JobRunner(db.db, { instance: owner, leaseMs: 60_000, pollMs: 60_000, now: clock }, log);

  beforeAll(async () => {
    url = await createPgDatabase();
    // Two separate connection pools: what two API replicas are.
    a = await openDatabase({ url });
    b = await openDatabase({ url });
  });
  afterAll(async () => {
    await a.close();
    await b.close();
    await dropPgDatabase(url);
  });

  it('runs every job exactly once when both runners drain at the same time', async () => {
    const ran: string[] = [];
    const ra = runner(a, 'replica-a');
    const rb = runner(b, 'replica-b');
    for (const r of [ra, rb]) {
      r.handle('count', async (payload: { n: number }, job) => {
        // A real await so the two runners interleave.
        await (r === ra ? a : b).db.select().from(jobs).where(eq(jobs.id, job.id));
        ran.push(`${payload.n}`);
      });
    }
    for (let n = 0; n < 30; n++) await ra.enqueue('count', { n });
    const [x, y] = await Promise.all([ra.drain(), rb.drain()]);
    expect(x + y).toBe(30);
    expect(ran.sort()).toEqual(Array.from({ length: 30 }, (_, n) => `${n}`).sort());
    const rows = await a.db.select().from(jobs).where(eq(jobs.kind, 'count'));
    expect(rows.every((r) => r.status === 'succeeded' && r.attempts === 1)).toBe(true);
  });

  /** A promise and the function that settles it: a handler waits on it until the test says. */
  const gate = () => {
    let open!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    return { open, opened };
  };
  /** Resolves once `cond()` holds, checked each time `tick` is called (no polling on a timer). */
  const when = (cond: () => boolean) => {
    const waiters: (() => void)[] = [];
    return {
      tick: () => {
        if (cond()) for (const w of waiters.splice(0)) w();
      },
      reached: () => new Promise<void>((r) => (cond() ? r() : waiters.push(r))),
    };
  };

  it('a lane of its own runs while the default lane is busy with a long job', async () => {
    const r = runner(a, 'replica-lanes');
    const long = gate();
    const order: string[] = [];
    const started = when(() => order.includes('build started'));
    r.handle('build', async () => {
      order.push('build started');
      started.tick();
      await long.opened;
      order.push('build done');
    });
    const lane = { name: 'quick-lane', concurrency: 2 };
    const quickDone = when(() => order.filter((o) => o.startsWith('quick')).length === 3);
    r.handle(
      'quick',
      async (p: { n: number }) => {
        order.push(`quick ${p.n}`);
        quickDone.tick();
      },
      lane,
    );
    // Running as a server does: enqueue wakes the runner.
    await r.start();
    await r.enqueue('build', {});
    // The long job holds the default lane; the quick lane's jobs, enqueued after it started, still run.
    await started.reached();
    for (let n = 0; n < 3; n++) await r.enqueue('quick', { n });
    await quickDone.reached();
    expect(order).toContain('build started');
    expect(order).not.toContain('build done');
    expect(order.filter((o) => o.startsWith('quick')).sort()).toEqual(['quick 0', 'quick 1', 'quick 2']);
    long.open();
    await r.stop();
    expect(order.at(-1)).toBe('build done');
  });

  it('an idle lane asks the database once a wake, not once per slot; due jobs still fill every slot', async () => {
    const r = runner(a, 'replica-slots');
    const lane = { name: 'slots', concurrency: 4 };
    const held = gate();
    const running: number[] = [];
    const allRunning = when(() => running.length === 4);
    r.handle(
      'slot',
      async (p: { n: number }) => {
        running.push(p.n);
        allRunning.tick();
        await held.opened;
      },
      lane,
    );
    let claims = 0;
    const claim = r.claim.bind(r);
    r.claim = (state) => {
      if (state?.lane.name === 'slots') claims++;
      return claim(state);
    };
    // Nothing due: one claim finds nothing (eight webhook slots polled every 500 ms were 16 a second).
    await r.start();
    await r.stop();
    expect(claims).toBe(1);
    // Four due jobs (owed by statements elsewhere, so nothing woke the lane) and one wake: each
    // claimed job starts the next worker, and all four run at once.
    await a.db.insert(jobs).values(
      Array.from({ length: 4 }, (_, n) => ({
        id: `job_slot_${n}_${Date.now()}`,
        kind: 'slot',
        payload: { n },
        runAt: new Date(now),
      })),
    );
    await r.start();
    await allRunning.reached();
    expect(running.sort()).toEqual([0, 1, 2, 3]);
    held.open();
    await r.stop();
    const rows = await a.db.select().from(jobs).where(eq(jobs.kind, 'slot'));
    expect(rows.map((j) => j.status)).toEqual(['succeeded', 'succeeded', 'succeeded', 'succeeded']);
  });

  it('a lane with a poll interval of its own finds a job that nobody woke it for', async () => {
    // The runner looks every minute; the lane every 50 ms. The job is owed by a statement elsewhere (no wake).
    const r = runner(a, 'replica-poll');
    let ran!: (p: unknown) => void;
    const done = new Promise((res) => (ran = res));
    r.handle('owed', async (p: unknown) => ran(p), { name: 'polled', concurrency: 1, pollMs: 50 });
    await r.start();
    try {
      await a.db
        .insert(jobs)
        .values({ id: `job_owed_${Date.now()}`, kind: 'owed', payload: { n: 7 }, runAt: new Date(now) });
      expect(await done).toEqual({ n: 7 });
    } finally {
      await r.stop();
    }
  });

  it('a group limit holds across two replicas: a group never has more running, other groups go on', async () => {
    const lane = { name: 'fair', concurrency: 3, groupLimit: 2 };
    const ra = runner(a, 'replica-fair-a');
    const rb = runner(b, 'replica-fair-b');
    const held = gate();
    const running = new Map<string, number>();
    let peakA = 0;
    const done: string[] = [];
    const bothBRan = when(() => done.filter((d) => d.startsWith('b')).length === 2);
    const aFull = when(() => (running.get('a') ?? 0) === 2);
    for (const r of [ra, rb])
      r.handle(
        'deliver',
        async (p: { group: string; n: number }) => {
          running.set(p.group, (running.get(p.group) ?? 0) + 1);
          peakA = Math.max(peakA, running.get('a') ?? 0);
          aFull.tick();
          // Group a's jobs hang (a silent receiver) until the test lets them go.
          if (p.group === 'a') await held.opened;
          running.set(p.group, running.get(p.group)! - 1);
          done.push(`${p.group}${p.n}`);
          bothBRan.tick();
        },
        lane,
      );
    for (let n = 0; n < 5; n++) await ra.enqueue('deliver', { group: 'a', n });
    for (let n = 0; n < 2; n++) await ra.enqueue('deliver', { group: 'b', n });
    const drains = Promise.all([ra.drain(), rb.drain()]);
    // Six workers on two replicas, five of group a's jobs first in line: two run, and b's both get through meanwhile.
    await aFull.reached();
    await bothBRan.reached();
    expect(done.filter((d) => d.startsWith('a'))).toEqual([]);
    expect(running.get('a')).toBe(2);
    held.open();
    await drains;
    // The workers that found only a's jobs at their limit stopped; what is left is due and runs at the next drain.
    while ((await ra.drain()) > 0);
    expect(done.filter((d) => d.startsWith('a')).sort()).toEqual(['a0', 'a1', 'a2', 'a3', 'a4']);
    expect(peakA).toBe(2);
  });

  it('a dedupe key enqueues once, even from two replicas', async () => {
    const ra = runner(a, 'replica-a');
    const rb = runner(b, 'replica-b');
    const ids = await Promise.all([
      ra.enqueue('nightly', {}, { dedupeKey: 'dream:ws_1:2026-11-30' }),
      rb.enqueue('nightly', {}, { dedupeKey: 'dream:ws_1:2026-11-30' }),
    ]);
    expect(ids.filter(Boolean)).toHaveLength(1);
  });

  it('a job whose runner died is run again once its lease has run out, and only then', async () => {
    const dead = runner(a, 'replica-a');
    dead.handle('report', async () => undefined);
    const alive = runner(b, 'replica-b');
    let runs = 0;
    alive.handle('report', async () => {
      runs++;
    });
    await dead.enqueue('report', { id: 1 });
    const taken = await dead.claim(); // replica-a takes it… and is killed before finishing.
    expect(taken).toMatchObject({ status: 'running', instance: 'replica-a' });
    expect(await alive.drain()).toBe(0);
    now += 61_000;
    expect(await alive.drain()).toBe(1);
    expect(runs).toBe(1);
    const [row] = await a.db.select().from(jobs).where(eq(jobs.id, taken!.id));
    expect(row).toMatchObject({ status: 'succeeded', attempts: 2, instance: 'replica-b' });
  });

  it('a restarted runner releases what it held before at once', async () => {
    const before = runner(a, 'replica-c');
    before.handle('restart', async () => undefined);
    await before.enqueue('restart', {});
    const held = await before.claim();
    const after = runner(a, 'replica-c');
    let ran = 0;
    after.handle('restart', async () => {
      ran++;
    });
    await after.start();
    await after.stop();
    await after.drain();
    expect(ran).toBe(1);
    const [row] = await a.db.select().from(jobs).where(eq(jobs.id, held!.id));
    expect(row!.status).toBe('succeeded');
  });

  it('leaves jobs of kinds it does not handle to runners that do', async () => {
    const r = runner(a, 'replica-a');
    r.handle('known', async () => undefined);
    const id = (await r.enqueue('unknown-kind', {}))!;
    expect(await r.drain()).toBe(0);
    expect((await a.db.select().from(jobs).where(eq(jobs.id, id)))[0]!.status).toBe('queued');
  });

  it('retries a failing job with backoff, then gives up with the last error', async () => {
    const r = runner(a, 'replica-a');
    let calls = 0;
    r.handle('flaky', async () => {
      calls++;
      if (calls < 2) throw new Error('transient');
    });
    r.handle('broken', async () => {
      throw new Error('always broken');
    });
    const flaky = (await r.enqueue('flaky', {}))!;
    await r.drain();
    const [waiting] = await a.db.select().from(jobs).where(eq(jobs.id, flaky));
    expect(waiting).toMatchObject({ status: 'queued', attempts: 1, lastError: 'transient' });
    expect(await r.drain()).toBe(0); // not due yet: backoff
    now += 2_500;
    await r.drain();
    expect((await a.db.select().from(jobs).where(eq(jobs.id, flaky)))[0]).toMatchObject({
      status: 'succeeded',
      attempts: 2,
    });
    const broken = (await r.enqueue('broken', {}, { maxAttempts: 2 }))!;
    await r.drain();
    now += 10_000;
    await r.drain();
    expect((await a.db.select().from(jobs).where(eq(jobs.id, broken)))[0]).toMatchObject({
      status: 'failed',
      attempts: 2,
      lastError: 'always broken',
    });
  });
});

describe('durable jobs on PGlite', () => {
  it('enqueues, runs and records a job', async () => {
    const t = await createTestDatabase('pglite');
    try {
      const r = new JobRunner(t.db, { instance: 'solo', leaseMs: 1000, pollMs: 1000 }, log);
      const seen: unknown[] = [];
      r.handle('hello', async (p) => {
        seen.push(p);
      });
      await r.enqueue('hello', { who: 'world' });
      expect(await r.drain()).toBe(1);
      expect(seen).toEqual([{ who: 'world' }]);
    } finally {
      await t.drop();
    }
  });
});
