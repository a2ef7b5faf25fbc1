import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RunEventLog, type RunEvent } from '../../apps/api/src/agent/events.ts';
import { createTeam } from '../../apps/api/src/auth/teams.ts';
import { openDatabase, type Database } from '../../apps/api/src/db/client.ts';
import * as schema from '../../apps/api/src/db/schema/index.ts';
import { createWorkspace } from '../../apps/api/src/workspace/records.ts';
import { createPgDatabase, dropPgDatabase } from '../support/db.ts';

/** Two API replicas on one Postgres database: a run's events reach followers on either one. */
describe('run events across replicas', () => {
  let url: string;
  let a: Database;
  let b: Database;
  let logA: RunEventLog;
  let logB: RunEventLog;
  const runId = 'run_replicas';

  beforeAll(async () => {
    url = await createPgDatabase();
    a = await openDatabase({ url });
    b = await openDatabase({ url });
    logA = new RunEventLog(a.db);
    logB = new RunEventLog(b.db);
    await logA.connect(a.listen!);
    await logB.connect(b.listen!);
    const team = await createTeam(a.db, 'replicas');
    const ws = await createWorkspace(a.db, team.id, { name: 'w' });
    await a.db.insert(schema.sessions).values({ id: 'ses_replicas', teamId: team.id, workspaceId: ws.id });
    await a.db
      .insert(schema.runs)
      .values({ id: runId, teamId: team.id, workspaceId: ws.id, sessionId: 'ses_replicas' });
  });
  afterAll(async () => {
    await logA.disconnect();
    await logB.disconnect();
    await a.close();
    await b.close();
    await dropPgDatabase(url);
  });

  it('a follower on replica B sees, live and in order, what replica A appends; B can append after A', async () => {
    const seen: RunEvent[] = [];
    const abort = new AbortController();
    const done = new Promise<void>((resolve) => {
      void logB.follow(
        runId,
        0,
        (ev) => {
          seen.push(ev);
          if (ev.event === 'run.completed') resolve();
        },
        abort.signal,
      );
    });
    await logA.append(runId, 'run.created', {});
    await logA.appendMany(runId, [
      ['step.created', { step: 1 }],
      ['thinking', { text: 'hi' }],
    ]);
    // An approval decided on B appends there; B's sequence numbers must follow A's.
    await logB.append(runId, 'approval.resolved', { status: 'approved' });
    await logA.append(runId, 'run.completed', {});
    await done;
    abort.abort();
    expect(seen.map((e) => [e.seq, e.event])).toEqual([
      [1, 'run.created'],
      [2, 'step.created'],
      [3, 'thinking'],
      [4, 'approval.resolved'],
      [5, 'run.completed'],
    ]);
  });
});
