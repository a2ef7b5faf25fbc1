import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RunEventLog, type RunEvent } from '../../apps/api/src/agent/events.ts';
import { createTeam } from '../../apps/api/src/auth/teams.ts';
import * as schema from '../../apps/api/src/db/schema/index.ts';
import { createWorkspace } from '../../apps/api/src/workspace/records.ts';
import { createTestDatabase, DRIVERS, rowsOf, type TestDatabase } from '../support/db.ts';

describe.each(DRIVERS)('the run event log on %s', (driver) => {
  let t: TestDatabase;
  let log: RunEventLog;
  let runs = 0;
  let teamId: string;
  let wsId: string;

  beforeAll(async () => {
    t = await createTestDatabase(driver);
    log = new RunEventLog(t.db);
    const team = await createTeam(t.db, `events-${driver}`);
    const ws = await createWorkspace(t.db, team.id, { name: 'w' });
    teamId = team.id;
    wsId = ws.id;
    await t.db.insert(schema.sessions).values({ id: 'ses_events', teamId, workspaceId: wsId });
  });
  afterAll(() => t.drop());

  const newRun = async () => {
    const id = `run_events${++runs}`;
    await t.db
      .insert(schema.runs)
      .values({ id, teamId, workspaceId: wsId, sessionId: 'ses_events', status: 'completed' });
    return id;
  };

  it('a burst of appends while a write is in flight becomes one statement; each caller gets its own events, in order', async () => {
    const runId = await newRun();
    const seen: RunEvent[] = [];
    const abort = new AbortController();
    await log.follow(runId, 0, (ev) => seen.push(ev), abort.signal);
    // The first append starts at once; the 49 made meanwhile wait for it, and join.
    const calls = Array.from({ length: 50 }, (_, i) =>
      log.append(runId, 'exec.output', { stream: 'stdout', data: `${i}\n` }),
    );
    const results = await Promise.all(calls);
    abort.abort();
    expect(results.map((e) => e.seq)).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
    expect(results.map((e) => (e.data as { data: string }).data)).toEqual(
      Array.from({ length: 50 }, (_, i) => `${i}\n`),
    );
    // Live followers got them all, once, in order.
    expect(seen.map((e) => e.seq)).toEqual(results.map((e) => e.seq));
    // Stored by two statements: each is its own transaction, so its rows share one xmin.
    const stamps = rowsOf<{ n: number }>(
      await t.db.execute(sql`select count(distinct xmin::text)::int as n from run_events where run_id = ${runId}`),
    );
    expect(stamps[0]!.n).toBe(2);
  });

  it('an append that carries writes is never merged into a plain one, and keeps its place in the order', async () => {
    const runId = await newRun();
    const first = log.append(runId, 'a', {});
    const plain = log.append(runId, 'b', {});
    const withWrite = log.appendMany(runId, [['c', {}]], [sql`update runs set steps = 7 where id = ${runId}`]);
    const after = log.append(runId, 'd', {});
    const got = await Promise.all([first, plain, withWrite, after]);
    expect(got.flat().map((e) => [e.seq, e.event])).toEqual([
      [1, 'a'],
      [2, 'b'],
      [3, 'c'],
      [4, 'd'],
    ]);
    const stored = await log.list(runId);
    expect(stored.map((e) => e.event)).toEqual(['a', 'b', 'c', 'd']);
    const stamps = rowsOf<{ n: number }>(
      await t.db.execute(sql`select count(distinct xmin::text)::int as n from run_events where run_id = ${runId}`),
    );
    expect(stamps[0]!.n).toBe(4);
  });
});
