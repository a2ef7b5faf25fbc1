import { setMaxListeners } from 'node:events';
import { and, asc, eq, inArray, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Principal } from '../auth/principal.ts';
import type { Database, Db } from '../db/client.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { messages, runs, type ApprovalRow, type MessageRow, type RunRow } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import type { ExecAudit } from '../sandbox/executions.ts';
import { getActiveSessionWithWorkspace } from '../sessions/sessions.ts';
import { Approvals, type Resume } from './approvals.ts';
import { Leases, type RunLeases } from './leases.ts';
import type { ModelClient } from './llm.ts';
import { RunLoop, SHUTDOWN, type Loaded, type RunLoopDeps } from './run-loop.ts';
import { finishRun, isActive, startRun, type WriteDeps } from './run-writes.ts';

/**
 * The agent as a service: a message starts a run; the run thinks (model), acts (Python in the
 * session sandbox, memory search) and observes until it finishes, hits `max_steps`, fails, is
 * cancelled, or pauses for an approval. All state lives in the database (messages, runs,
 * approvals), so a paused run resumes after a restart.
 *
 * This is the facade the server, routes and tests use; it wires the parts and keeps which runs
 * loop in this process. The parts: `run-loop.ts` (one run's loop), `run-writes.ts` (how a run's
 * writes are batched, and its start and end), `leases.ts` (which server runs a run, cancels
 * across replicas), `approvals.ts` (pausing, deciding, expiry) and `transcript.ts` (the request
 * to the model and its condensation).
 */
/**
 * What the agent is built with (compose.ts): every part a run's loop reaches (its approvals are
 * the agent's own), and which server runs a run and how long its lease lasts without renewal.
 */
export type AgentDeps = Omit<RunLoopDeps, 'approvals'> & { lease?: RunLeases };

export class AgentService {
  private readonly model: ModelClient;
  /** Runs looping in this process: how to stop each, and when it has ended. */
  private readonly active = new Map<string, AbortController>();
  private readonly running = new Set<Promise<void>>();
  private readonly leases: Leases;
  private readonly approvals: Approvals;
  private readonly loopDeps: RunLoopDeps;
  private readonly writeDeps: WriteDeps;

  private readonly db: Db;
  private readonly log: Logger;

  constructor(deps: AgentDeps) {
    const { db, events, model, log } = deps;
    this.db = db;
    this.log = log;
    this.model = model;
    this.writeDeps = { db, events };
    this.leases = new Leases({ db, events, log }, deps.lease ?? { instance: 'local', leaseMs: 60_000 }, this.active);
    this.approvals = new Approvals({ db, events, log }, (r) => this.resume(r));
    this.loopDeps = { ...deps, approvals: this.approvals };
  }

  /**
   * After a restart: runs whose loop is gone — this server's own from before, and those of a
   * server whose lease ran out — are failed as interrupted. Runs another live server is running
   * are left alone. Pending approvals keep waiting.
   */
  async startup(): Promise<void> {
    await this.leases.interruptOrphans(true);
    this.leases.startTending();
    await this.approvals.schedulePending();
  }

  /** Waits (at most `ms`) for the runs in flight to end, so a planned restart interrupts as few as it can. */
  async drain(ms: number): Promise<void> {
    // Runs that start meanwhile (an approval decided during the drain) are waited for too.
    for (const end = Date.now() + ms; this.running.size > 0 && Date.now() < end; ) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise((r) => (timer = setTimeout(r, end - Date.now())));
      await Promise.race([Promise.allSettled([...this.running]), timeout]);
      clearTimeout(timer);
    }
  }

  /** Stops every live run (shutdown): they are marked interrupted, like after a crash. */
  async stop(): Promise<void> {
    this.leases.stopTending();
    this.approvals.stopTimers();
    for (const c of this.active.values()) c.abort(new Error(SHUTDOWN));
    // Let the aborted loops record that before the database closes (a start-up would otherwise).
    await this.drain(5000);
  }

  /** Starts a run for a person's message. With `audit`, its audit event is written in the same commit. */
  async postMessage(
    teamId: string,
    sessionId: string,
    content: string,
    audit?: ExecAudit,
  ): Promise<{ message: MessageRow; run: RunRow }> {
    const { session, workspace } = await getActiveSessionWithWorkspace(this.db, teamId, sessionId);
    const model = this.model.modelFor(workspace.settings.model);
    if (!model) {
      // Without an endpoint, a workspace's "model" setting cannot help: only the server's operator can.
      throw new ApiError(
        'model_unavailable',
        this.model.hasEndpoint
          ? 'no model is configured: set the workspace setting "model", or KILN_MODEL on the server (and restart it). ' +
              'Sessions, exec, files and memory work without one.'
          : 'no model is configured: this server has no model endpoint. Its operator sets OPENAI_BASE_URL (and ' +
              'OPENAI_API_KEY) and KILN_MODEL, then restarts it; a workspace\'s "model" setting cannot help until then. ' +
              'Sessions, exec, files and memory work without one.',
      );
    }
    const lease = { ...this.leases.lease, until: this.leases.until() };
    const start = { teamId, session, workspace, model, content };
    const { message, run } = await startRun(this.writeDeps, lease, start, audit);
    this.launch(run.id, undefined, { run, session, ws: workspace });
    return { message, run };
  }

  async getRun(teamId: string, runId: string): Promise<RunRow> {
    const [run] = await this.db
      .select()
      .from(runs)
      .where(and(eq(runs.id, runId), eq(runs.teamId, teamId)));
    if (!run) throw ApiError.notFound('run');
    return run;
  }

  /** The team's runs, id-ordered with the list cursor, narrowed by status, workspace and session. */
  async listRuns(
    teamId: string,
    f: ListParams & { status?: RunRow['status'][]; workspace?: string; session?: string },
  ) {
    const c = cursorOn(runs.id, f);
    return this.db
      .select()
      .from(runs)
      .where(
        and(
          eq(runs.teamId, teamId),
          f.status ? inArray(runs.status, f.status) : undefined,
          f.workspace ? eq(runs.workspaceId, f.workspace) : undefined,
          f.session ? eq(runs.sessionId, f.session) : undefined,
          c.where,
        ),
      )
      .orderBy(c.orderBy)
      .limit(c.limit);
  }

  async listMessages(teamId: string, sessionId: string, p: { after?: string; limit: number }) {
    const after = p.after ? sql`${messages.id} > ${p.after}` : undefined;
    return this.db
      .select()
      .from(messages)
      .where(and(eq(messages.sessionId, sessionId), eq(messages.teamId, teamId), after))
      .orderBy(asc(messages.id))
      .limit(p.limit + 1);
  }

  /**
   * With several replicas on one Postgres: a cancel for a run that another replica is running
   * reaches that replica through a NOTIFY, and stops it there.
   */
  connectCancels(listen: NonNullable<Database['listen']>): Promise<void> {
    return this.leases.connectCancels(listen);
  }

  disconnectCancels(): Promise<void> {
    return this.leases.disconnectCancels();
  }

  /** Stops the model call and the running code; the run ends `cancelled`. */
  async cancel(teamId: string, runId: string): Promise<RunRow> {
    const run = await this.getRun(teamId, runId);
    if (!isActive(run)) return run;
    await this.db.update(runs).set({ cancelRequestedAt: new Date() }).where(eq(runs.id, runId));
    const controller = this.active.get(runId);
    if (controller) {
      controller.abort(new Error('cancelled'));
    } else if (
      this.leases.crossReplica &&
      run.status !== 'requires_action' &&
      (await this.leases.cancelElsewhere(runId))
    ) {
      // The replica running it stopped it.
    } else {
      // Queued or waiting for an approval (or its replica is gone): nothing is running, end it here.
      await this.approvals.cancelPending(runId);
      await finishRun(this.writeDeps, run, 'cancelled');
    }
    return this.getRun(teamId, runId);
  }

  /** A team's approvals; for an org admin (`teamId` null), those only an org admin may decide. */
  listApprovals(
    teamId: string | null,
    f: { status?: string; workspace?: string },
    page: { limit: number; after?: string },
  ) {
    return this.approvals.list(teamId, f, page);
  }

  decide(
    principal: Principal,
    approvalId: string,
    decision: 'approve' | 'deny' | 'approve_session',
    reason?: string,
  ): Promise<ApprovalRow> {
    return this.approvals.decide(principal, approvalId, decision, reason);
  }

  /** Approvals past their deadline that no timer caught (e.g. across a restart). */
  sweepExpired(): Promise<number> {
    return this.approvals.sweepExpired();
  }

  /** A decided or expired approval: its run, if it still waits, loops again on this server. */
  private async resume(r: Resume): Promise<void> {
    const run = await this.leases.claimPaused(r.approval.runId);
    if (run) this.launch(run.id, r);
  }

  /** Starts (or resumes) a run's loop; `loaded` spares re-reading what the caller just wrote. */
  private launch(runId: string, resume?: Resume, loaded?: Loaded): void {
    const controller = new AbortController();
    // Every model call and execution of the run listens to this one signal.
    setMaxListeners(0, controller.signal);
    this.active.set(runId, controller);
    const done: Promise<void> = RunLoop.open(this.loopDeps, runId, controller.signal, loaded)
      .then((loop) => loop.loop(resume))
      .catch(async (err) => {
        this.log.error({ err, run: runId }, 'run crashed');
        const [run] = await this.db.select().from(runs).where(eq(runs.id, runId));
        if (run && isActive(run)) {
          await finishRun(this.writeDeps, run, 'failed', { code: 'internal', message: (err as Error).message });
        }
      })
      .finally(() => {
        this.active.delete(runId);
        this.running.delete(done);
      });
    this.running.add(done);
  }
}
