/**
 * A run's writes: the statement that starts a run, the per-run queue a step's writes and events
 * wait in until they go as one statement (with write-behind, so the next model call overlaps the
 * round trip), the run row's patch, and the statement that ends a run.
 *
 * May touch: the `runs` row of the run it writes for, and whatever a step queues (messages,
 * usage, executions, audit rows), always through the run event log, so events are stored (in
 * order, with their writes) before they are streamed. Never the model, sandboxes or workspaces.
 */
import { and, eq, inArray, sql, type SQL } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { isUniqueViolation } from '../db/errors.ts';
import { runs, type MessageRow, type RunRow } from '../db/schema/index.ts';
import { ACTIVE_RUN_STATUSES, type RunPatch } from '../db/schema/runs.ts';
import { auditRow, insertAudit } from '../audit/audit.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { ExecAudit } from '../sandbox/executions.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import { runLinks, webhookEventWrite } from '../webhooks/events.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { TERMINAL_EVENTS, type RunEventLog } from './events.ts';
import { insertMessage, messageRow } from './message-rows.ts';

/** What run writes reach: the database, and the event log every write with events goes through. */
export interface WriteDeps {
  db: Db;
  events: RunEventLog;
}

export type RunEnd = 'completed' | 'failed' | 'cancelled';
export type RunError = { code: string; message: string };

/** How a run ends whose loop is gone (a restart, a server that died, a shutdown). */
export const INTERRUPTED: RunError = {
  code: 'interrupted',
  message: 'the server restarted while this run was in progress',
};

/**
 * What a step has not written yet. Changes to the run's own row are kept as one patch, not as
 * statements: a statement may update a row only once, and the run's end updates it too.
 */
export interface Queue {
  writes: SQL[];
  events: [string, unknown][];
  run?: RunPatch;
}

const emptyQueue = (): Queue => ({ writes: [], events: [] });

/** The SET list for a run patch (after `update runs set`); `ending`: the caller sets the status. */
function runPatchSet(p: RunPatch, ending = false): SQL {
  const parts = [
    sql`prompt_tokens = prompt_tokens + ${p.promptTokens}`,
    sql`completion_tokens = completion_tokens + ${p.completionTokens}`,
  ];
  if (p.steps !== undefined && !ending) parts.push(sql`steps = greatest(steps, ${p.steps})`);
  if (p.startedAt) {
    parts.push(sql`started_at = coalesce(started_at, ${p.startedAt.toISOString()}::timestamptz)`);
    if (!ending) parts.push(sql`status = case when status = 'queued' then 'in_progress' else status end`);
  }
  return sql.join(parts, sql`, `);
}

/**
 * Starts a run for a person's message in one statement: the run (leased to `lease.instance`), the
 * message, the session's activity, the audit event (with `audit`) and the first two events.
 * A session that already has an unfinished run makes it fail: 409 `session_busy`.
 */
export async function startRun(
  deps: WriteDeps,
  lease: { instance: string; leaseMs: number; until: SQL },
  start: { teamId: string; session: SessionRow; workspace: WorkspaceRow; model: string; content: string },
  audit?: ExecAudit,
): Promise<{ message: MessageRow; run: RunRow }> {
  const { teamId, session, workspace, model, content } = start;
  const sessionId = session.id;
  const runId = newId('run');
  const now = new Date();
  const run: RunRow = {
    id: runId,
    teamId,
    workspaceId: workspace.id,
    sessionId,
    status: 'queued',
    model,
    trigger: 'message',
    steps: 0,
    promptTokens: 0,
    completionTokens: 0,
    error: null,
    createdAt: now,
    startedAt: null,
    finishedAt: null,
    cancelRequestedAt: null,
    instance: lease.instance,
    leaseUntil: new Date(now.getTime() + lease.leaseMs),
  };
  const message = messageRow(session, runId, { role: 'user', content });
  const writes = [
    sql`insert into runs (id, team_id, workspace_id, session_id, model, created_at, runner, lease_until)
      values (${runId}, ${teamId}, ${workspace.id}, ${sessionId}, ${model}, ${now.toISOString()}::timestamptz,
        ${lease.instance}, ${lease.until})`,
    insertMessage(message),
    sql`update sessions set last_activity_at = ${now.toISOString()}::timestamptz where id = ${sessionId}`,
  ];
  if (audit) {
    const after = { session_id: sessionId, message_id: message.id };
    const draft = { action: 'session.message', resourceType: 'run', resourceId: runId, teamId, after };
    writes.push(insertAudit(auditRow(draft, audit.actor, audit.requestId)));
  }
  deps.events.begin(runId);
  try {
    const first: [string, unknown][] = [
      ['run.created', { run_id: runId, session_id: sessionId, model }],
      ['message.created', { id: message.id, role: 'user', content }],
    ];
    await deps.events.appendMany(runId, first, writes);
  } catch (err) {
    deps.events.forget(runId);
    if (!isUniqueViolation(err)) throw err;
    const [busy] = await deps.db
      .select({ id: runs.id })
      .from(runs)
      .where(and(eq(runs.sessionId, sessionId), inArray(runs.status, ACTIVE_RUN_STATUSES)));
    const busyRun = { run_id: busy?.id ?? null };
    throw new ApiError('session_busy', 'this session already has a run that has not finished', busyRun);
  }
  return { message, run };
}

/**
 * The writes of one run's loop not stored yet, and the promise of those that were sent. Its own
 * loop is the only writer, so the queue needs no lock; appends of one run are serialised by the
 * event log, so waiting for the last one waits for all.
 */
export class RunWrites {
  private queue = emptyQueue();
  /** Settles when everything flushed so far is stored; `failure` is the first write that was not. */
  private stored: Promise<void> = Promise.resolve();
  private failure: unknown;

  constructor(
    private readonly events: RunEventLog,
    private readonly runId: string,
  ) {}

  emit(event: string, data: unknown): void {
    this.queue.events.push([event, data]);
  }

  write(...writes: SQL[]): void {
    this.queue.writes.push(...writes);
  }

  /** Adds to the run's row patch for the next write (tokens add up; the rest is replaced). */
  patchRun(p: Partial<RunPatch>): void {
    const q = this.queue.run ?? { promptTokens: 0, completionTokens: 0 };
    this.queue.run = {
      ...q,
      ...p,
      promptTokens: q.promptTokens + (p.promptTokens ?? 0),
      completionTokens: q.completionTokens + (p.completionTokens ?? 0),
      startedAt: p.startedAt ?? q.startedAt,
    };
  }

  /**
   * Writes the queued messages, usage and events in one statement (then streams the events) and
   * resolves once everything flushed so far is stored.
   */
  flush(): Promise<void> {
    const { writes, events, run } = this.queue;
    if (run) writes.push(sql`update runs set ${runPatchSet(run)} where id = ${this.runId}`);
    if (writes.length || events.length) {
      this.queue = emptyQueue();
      this.stored = this.events.appendMany(this.runId, events, writes).then(
        () => undefined,
        (err) => void (this.failure ??= err),
      );
    }
    return this.stored.then(() => {
      if (this.failure) throw this.failure;
    });
  }

  /**
   * Starts the write without waiting for it, so the next model call or execution overlaps the
   * database round trip. Events are still stored before they are streamed; a failed write
   * surfaces at the next `flush` or `settle`, which every path to the end of a run goes through.
   */
  writeBehind(): void {
    this.flush().catch(() => undefined);
  }

  /** Waits for everything sent, throws the first write that failed, and hands over what is still queued. */
  async settle(): Promise<Queue> {
    await this.stored;
    if (this.failure) throw this.failure;
    const queued = this.queue;
    this.queue = emptyQueue();
    return queued;
  }
}

/**
 * Marks the run as ended — only if it still is active — and stores its terminal event in the
 * same statement, with `queued` writes and events that go before it.
 */
export async function finishRun(
  deps: WriteDeps,
  run: RunRow,
  status: RunEnd,
  error?: RunError,
  queued: Queue = emptyQueue(),
): Promise<void> {
  const patch = queued.run ? sql`, ${runPatchSet(queued.run, true)}` : sql``;
  const active = sql.join(
    ACTIVE_RUN_STATUSES.map((a) => sql`${a}`),
    sql`, `,
  );
  const end = sql`update runs set status = ${status}, error = ${error ? JSON.stringify(error) : null}::jsonb,
      finished_at = ${new Date().toISOString()}::timestamptz,
      steps = greatest(steps, ${Math.max(run.steps, queued.run?.steps ?? 0)})${patch}
    where id = ${run.id} and status in (${active})
    returning jsonb_build_object('steps', steps) as data`;
  const terminal: [string, unknown][] = [[`run.${status}`, { status, error: error ?? null }]];
  // A completed or failed run owes its webhooks a delivery: written with the end itself, only if the end took effect.
  const also =
    status === 'cancelled'
      ? undefined
      : (guard: SQL) => [
          webhookEventWrite(
            `run.${status}`,
            run.teamId,
            {
              run_id: run.id,
              session_id: run.sessionId,
              workspace_id: run.workspaceId,
              status,
              error_code: error?.code ?? null,
              links: runLinks(run.id),
            },
            guard,
          ),
        ];
  const stored = await deps.events.appendMany(run.id, queued.events, queued.writes, {
    write: end,
    events: terminal,
    also,
  });
  // Ended elsewhere in the meantime (a cancel on another replica): the run row stays as that
  // end left it, but the tokens of the last model call still count.
  if (queued.run && !stored.some((e) => TERMINAL_EVENTS.has(e.event))) {
    const { promptTokens, completionTokens } = queued.run;
    await deps.db.execute(sql`update runs set ${runPatchSet({ promptTokens, completionTokens })} where id = ${run.id}`);
  }
}

/** Whether a run has not finished yet (queued, in progress or waiting for an approval). */
export function isActive(run: Pick<RunRow, 'status'>): boolean {
  return (ACTIVE_RUN_STATUSES as readonly string[]).includes(run.status);
}
