import { randomUUID } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { and, asc, eq, inArray, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Database, Db } from '../db/client.ts';
import { messages, runs, sessions, type ApprovalRow, type MessageRow, type RunRow } from '../db/schema/index.ts';
import type { ExecAudit } from '../sandbox/executions.ts';
import type { Principal } from '../auth/principal.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import type { SandboxEngine } from '../sandbox/engine.ts';
import { execInSession } from '../sessions/session-exec.ts';
import { getActiveSessionWithWorkspace, type SessionRow } from '../sessions/sessions.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import { getWorkspace, type WorkspaceRow } from '../workspace/workspaces.ts';
import type { RunEventLog } from './events.ts';
import { insertMessage, insertUsage, messageRow, type NewMessage } from './message-rows.ts';
import { Approvals, type Resume } from './approvals.ts';
import { Leases, type RunLeases } from './leases.ts';
export type { RunLeases } from './leases.ts';
import { finishRun, INTERRUPTED, isActive, RunWrites, startRun, type Queue, type RunEnd, type RunError, type WriteDeps } from './run-writes.ts';
import { recentEvolutions } from '../evolution-log/evolutions.ts';
import { undoEvolution } from '../evolution-log/undo.ts';
import { APPROVAL_EXPIRED, DENIED_BY_POLICY, DENIED_BY_USER, execFeedback, FINISHED, NOT_RUN_AFTER_FINISH, SEARCH_REFUSED, searchFeedback } from './feedback.ts';
import { filterProblem } from '../memory/search.ts';
import { ModelError, type ChatMessage, type ModelClient, type ToolCall } from './llm.ts';
import { decideCode } from './policy.ts';
import type { TranscriptEntry } from './context.ts';
import { fitTranscript, summariseTurns, systemMessage, type RecentEvolutions } from './transcript.ts';
import { parseToolCall, parseXml, TOOL_CORRECTION, toolsFor, XML_CORRECTION, type Action, type Call } from './protocol.ts';
import * as su from './source-update.ts';


const MAX_VIOLATIONS = 3;
const SHUTDOWN = 'shutdown';
interface Ctx {
  run: RunRow;
  session: SessionRow;
  ws: WorkspaceRow;
  model: string;
  signal: AbortSignal;
  /** The transcript not yet condensed away, kept in step with the database by `say`. */
  rows: MessageRow[];
  /** Writes and events of the current step not yet flushed (they go in one statement). */
  writes: RunWrites;
  /** Recent self-evolution changes, read once per run for the prompt (so "undo that" has a name). */
  evolutions: RecentEvolutions;
}

/** What a run's loop starts from. */
type Loaded = { run: RunRow; session: SessionRow; ws: WorkspaceRow };


/**
 * The agent loop as a service: a message starts a run; the run thinks (model), acts (Python in
 * the session sandbox, memory search) and observes until it finishes, hits `max_steps`, fails,
 * is cancelled, or pauses for an approval. All state lives in the database (messages, runs,
 * approvals), so a paused run resumes after a restart.
 */
export class AgentService {
  /** Runs looping in this process: how to stop each, and when it has ended. */
  private readonly active = new Map<string, AbortController>();
  private readonly running = new Set<Promise<void>>();
  private sourceUpdates: su.SourceUpdateSink | undefined;
  private readonly leases: Leases;
  private readonly approvals: Approvals;

  constructor(
    private readonly db: Db,
    readonly events: RunEventLog,
    readonly model: ModelClient,
    private readonly engine: SandboxEngine,
    private readonly repo: WorkspaceService,
    private readonly log: Logger,
    lease: RunLeases = { owner: 'local', leaseMs: 60_000 },
  ) {
    this.leases = new Leases({ db, events, log }, lease, this.active);
    this.approvals = new Approvals({ db, events, log }, (r) => this.resume(r));
  }

  private get writeDeps(): WriteDeps {
    return { db: this.db, events: this.events };
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

  /** Where approved `propose_source_update` patches go; without it the action is refused. */
  allowSourceUpdates(sink: su.SourceUpdateSink): void {
    this.sourceUpdates = sink;
  }

  /** Waits (at most `ms`) for the runs in flight to end, so a planned restart interrupts as few as it can. */
  async drain(ms: number): Promise<void> {
    // Runs that start meanwhile (an approval decided during the drain) are waited for too.
    for (const end = Date.now() + ms; this.running.size > 0 && Date.now() < end; ) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([Promise.allSettled([...this.running]), new Promise((r) => (timer = setTimeout(r, end - Date.now())))]);
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
  async postMessage(teamId: string, sessionId: string, content: string, audit?: ExecAudit): Promise<{ message: MessageRow; run: RunRow }> {
    const { session, workspace } = await getActiveSessionWithWorkspace(this.db, teamId, sessionId);
    const model = this.model.modelFor(workspace.settings.model);
    if (!model) {
      throw new ApiError('model_unavailable', 'no model is configured: set OPENAI_BASE_URL (and OPENAI_API_KEY) and KILN_MODEL, or the workspace setting "model". Sessions, exec, files and memory work without one.');
    }
    const lease = { ...this.leases.lease, until: this.leases.until() };
    const { message, run } = await startRun(this.writeDeps, lease, { teamId, session, workspace, model, content }, audit);
    this.launch(run.id, undefined, { run, session, ws: workspace });
    return { message, run };
  }

  async getRun(teamId: string, runId: string): Promise<RunRow> {
    const [run] = await this.db.select().from(runs).where(and(eq(runs.id, runId), eq(runs.teamId, teamId)));
    if (!run) throw ApiError.notFound('run');
    return run;
  }

  /** The team's runs, id-ordered with the list cursor, narrowed by status, workspace and session. */
  async listRuns(teamId: string, f: ListParams & { status?: RunRow['status'][]; workspace?: string; session?: string }) {
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
    return this.db
      .select()
      .from(messages)
      .where(and(eq(messages.sessionId, sessionId), eq(messages.teamId, teamId), p.after ? sql`${messages.id} > ${p.after}` : undefined))
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
    } else if (this.leases.crossReplica && run.status !== 'requires_action' && (await this.leases.cancelElsewhere(runId))) {
      // The replica running it stopped it.
    } else {
      // Queued or waiting for an approval (or its replica is gone): nothing is running, end it here.
      await this.approvals.cancelPending(runId);
      await this.finish(run, 'cancelled');
    }
    return this.getRun(teamId, runId);
  }

  // ---- approvals -----------------------------------------------------------------------

  /** A team's approvals; for an org admin (`teamId` null), those only an org admin may decide. */
  listApprovals(teamId: string | null, f: { status?: string; workspace?: string }) {
    return this.approvals.list(teamId, f);
  }

  decide(principal: Principal, approvalId: string, decision: 'approve' | 'deny' | 'approve_session', reason?: string): Promise<ApprovalRow> {
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

  // ---- the loop ------------------------------------------------------------------------

  /** Starts (or resumes) a run's loop; `loaded` spares re-reading what the caller just wrote. */
  private launch(runId: string, resume?: Resume, loaded?: Loaded): void {
    const controller = new AbortController();
    // Every model call and execution of the run listens to this one signal.
    setMaxListeners(0, controller.signal);
    this.active.set(runId, controller);
    const done: Promise<void> = this.loop(runId, controller.signal, resume, loaded)
      .catch(async (err) => {
        this.log.error({ err, run: runId }, 'run crashed');
        const [run] = await this.db.select().from(runs).where(eq(runs.id, runId));
        if (run && isActive(run)) await this.finish(run, 'failed', { code: 'internal', message: (err as Error).message });
      })
      .finally(() => {
        this.active.delete(runId);
        this.running.delete(done);
      });
    this.running.add(done);
  }

  private async load(runId: string): Promise<Loaded> {
    const [run] = (await this.db.select().from(runs).where(eq(runs.id, runId))) as [RunRow];
    const [session] = (await this.db.select().from(sessions).where(eq(sessions.id, run.sessionId))) as [SessionRow];
    return { run, session, ws: await getWorkspace(this.db, run.teamId, run.workspaceId) };
  }

  private async loop(runId: string, signal: AbortSignal, resume?: Resume, loaded?: Loaded): Promise<void> {
    const { run, session, ws } = loaded ?? (await this.load(runId));
    const [rows, evolutions] = await Promise.all([
      this.db.select().from(messages).where(and(eq(messages.sessionId, session.id), sql`${messages.summarizedAt} is null`)).orderBy(asc(messages.id)),
      recentEvolutions(this.db, { id: ws.id, dir: this.repo.dirOf(ws.id) }),
    ]);
    const ctx: Ctx = { run, session, ws, model: run.model!, signal, rows, writes: new RunWrites(this.events, run.id), evolutions };
    if (run.status !== 'in_progress') {
      // Written with the first step's step.created (every way the loop goes flushes first).
      const startedAt = new Date();
      ctx.writes.patchRun({ startedAt });
      ctx.writes.emit('run.in_progress', {});
      ctx.run = { ...run, status: 'in_progress', startedAt };
    }
    if (resume) {
      // The decided call first, then the calls of its message still unanswered (it paused there).
      await this.afterApproval(ctx, resume);
      if (resume.approval.toolCallId && (await this.actCalls(ctx, this.unanswered(ctx, resume.approval.toolCallId)))) return;
    }
    let violations = 0;
    for (;;) {
      if (signal.aborted) return this.end(ctx, 'cancelled');
      if (ctx.run.steps >= ws.settings.max_steps) {
        return this.end(ctx, 'failed', { code: 'max_steps', message: `the run reached its limit of ${ws.settings.max_steps} steps without finishing` });
      }
      // The step count is written with the step's usage (one statement), and by `finish`.
      ctx.run = { ...ctx.run, steps: ctx.run.steps + 1 };
      ctx.writes.emit('step.created', { step: ctx.run.steps });
      // Stored while the model thinks; the model call does not need it.
      ctx.writes.writeBehind();

      let turn;
      try {
        const call = async (force?: { budget: number }) =>
          this.model.complete({ model: ctx.model, messages: await this.transcript(ctx, force), tools: ws.settings.protocol === 'tools' ? toolsFor(ws.settings) : undefined, signal });
        try {
          turn = await call();
        } catch (err) {
          // Level 4: the endpoint says the context is too long. Summarise, cut to the limit it
          // names (with room for the answer), and try once more.
          if (!(err instanceof ModelError) || err.code !== 'context_overflow') throw err;
          const limit = err.limit ?? ws.settings.context.max_tokens;
          turn = await call({ budget: Math.floor(Math.min(limit, ws.settings.context.max_tokens) * 0.8) });
        }
      } catch (err) {
        if (!(err instanceof ModelError)) throw err;
        if (err.code === 'cancelled') return this.end(ctx, 'cancelled');
        return this.end(ctx, 'failed', { code: err.code === 'context_overflow' ? 'context_overflow' : 'model_unavailable', message: err.message });
      }
      this.recordUsage(ctx, turn.usage);
      // Tool calls only where tools were offered: calls nobody answers would make the transcript one no endpoint accepts.
      const toolCalls = ws.settings.protocol === 'tools' && turn.toolCalls.length ? this.ownIds(ctx, turn.toolCalls) : undefined;
      this.say(ctx, { role: 'assistant', content: turn.content, toolCalls });

      if (toolCalls) {
        const calls = toolCalls.map(parseToolCall);
        const broken = calls.flatMap((c) => ('violation' in c ? [c.violation] : []));
        // Only a message with no call that can be carried out counts towards the limit.
        violations = broken.length === calls.length ? violations + 1 : 0;
        if (violations > MAX_VIOLATIONS) {
          for (const c of calls) this.reply(ctx, c.toolCallId, TOOL_CORRECTION(broken[0]!));
          return this.end(ctx, 'failed', { code: 'protocol_violation', message: `the model broke the tools protocol ${violations} times in a row (${broken.join('; ')})` });
        }
        if (broken.length) ctx.writes.emit('thinking', { text: turn.content, protocol_violation: broken.join('; '), attempt: violations });
        else if (turn.content.trim()) ctx.writes.emit('thinking', { text: turn.content.trim() });
        if (await this.actCalls(ctx, calls)) return;
        continue;
      }
      // Without a tool call, a reply under tool calling is the model finishing in prose.
      const parsed = ws.settings.protocol === 'xml' ? parseXml(turn.content) : { thinking: null, action: { type: 'finish' as const, summary: turn.content.trim() } };
      if (!parsed.action) {
        violations++;
        if (violations > MAX_VIOLATIONS) {
          return this.end(ctx, 'failed', { code: 'protocol_violation', message: `the model broke the xml protocol ${violations} times in a row (no action tag)` });
        }
        ctx.writes.emit('thinking', { text: turn.content, protocol_violation: 'no action tag', attempt: violations });
        this.reply(ctx, undefined, XML_CORRECTION);
        ctx.writes.writeBehind();
        continue;
      }
      violations = 0;
      if (parsed.thinking) ctx.writes.emit('thinking', { text: parsed.thinking });
      const done = await this.act(ctx, parsed.action, undefined);
      if (done) return;
    }
  }

  /**
   * Carries out the calls of one model message in order, each exactly as a single call is (its
   * own approval decision: a denial answers that call and the next goes on). Returns true when
   * the run is over: finished, or paused at a call that waits for a person, the calls after it
   * left unanswered until the approval is decided (`unanswered` finds them again). A finish
   * among the calls ends the run once the calls before it ran; those after it are answered as
   * not run, so every call has its answer before the run completes.
   */
  private async actCalls(ctx: Ctx, calls: Call[]): Promise<boolean> {
    for (const [i, call] of calls.entries()) {
      // Cancelled between calls: the loop ends the run; the transcript answers the rest as not run.
      if (ctx.signal.aborted) return false;
      if ('violation' in call) {
        this.reply(ctx, call.toolCallId, TOOL_CORRECTION(call.violation));
        continue;
      }
      if (call.action.type === 'finish') {
        this.reply(ctx, call.toolCallId, FINISHED);
        for (const later of calls.slice(i + 1)) this.reply(ctx, later.toolCallId, NOT_RUN_AFTER_FINISH);
        return this.complete(ctx, call.action.summary);
      }
      if (await this.act(ctx, call.action, call.toolCallId)) return true;
    }
    return false;
  }

  /** The calls of the message that made call `toolCallId` that have no answer yet, in order. */
  private unanswered(ctx: Ctx, toolCallId: string): Call[] {
    const calls = (r: MessageRow) => (r.role === 'assistant' ? ((r.toolCalls as ToolCall[] | null) ?? []) : []);
    let at = ctx.rows.length - 1;
    while (at >= 0 && !calls(ctx.rows[at]!).some((c) => c.id === toolCallId)) at--;
    if (at < 0) return [];
    const answered = new Set(ctx.rows.slice(at + 1).flatMap((r) => (r.role === 'tool' ? [r.toolCallId] : [])));
    return calls(ctx.rows[at]!).filter((c) => !answered.has(c.id)).map(parseToolCall);
  }

  /**
   * Every call gets an id of its own: some OpenAI-compatible servers leave ids empty or number
   * them from 0 in every message, and an answer must name exactly one call of the transcript.
   */
  private ownIds(ctx: Ctx, calls: ToolCall[]): ToolCall[] {
    const taken = new Set(ctx.rows.flatMap((r) => ((r.toolCalls as ToolCall[] | null) ?? []).map((c) => c.id)));
    return calls.map((c) => {
      const id = c.id && !taken.has(c.id) ? c.id : `call_${randomUUID().replaceAll('-', '')}`;
      taken.add(id);
      return { ...c, id };
    });
  }

  /** The run's answer to the person, and its end. */
  private async complete(ctx: Ctx, summary: string): Promise<true> {
    const msg = this.say(ctx, { role: 'assistant', content: summary });
    ctx.writes.emit('message.created', { id: msg.id, role: 'assistant', content: summary });
    await this.end(ctx, 'completed');
    return true;
  }

  /** Carries out one action. Returns true when the run is over (finished or paused). */
  private async act(ctx: Ctx, action: Action, toolCallId: string | undefined): Promise<boolean> {
    // A finish that is a tool call is answered by `actCalls`, with the calls after it.
    if (action.type === 'finish') return this.complete(ctx, action.summary);
    if (action.type === 'memory_search') {
      const filters = { path: action.path, since: action.since, until: action.until };
      const problem = filterProblem(filters);
      const hits = problem ? [] : (await this.repo.search(ctx.ws, action.query, { k: 8, ...filters })).hits;
      ctx.writes.emit('memory.searched', { query: action.query, ...filters, hits });
      this.reply(ctx, toolCallId, problem ? SEARCH_REFUSED(problem) : searchFeedback(action.query, hits));
      ctx.writes.writeBehind();
      return false;
    }
    if (action.type === 'undo_evolution') {
      await this.undo(ctx, action.evolutionId, toolCallId);
      return false;
    }
    if (action.type === 'source_update') return this.proposeSourceUpdate(ctx, action, toolCallId);
    ctx.writes.emit('code.proposed', { code: action.code });
    const policy = decideCode(ctx.ws.settings.approval, action.code);
    if (policy.decision === 'deny') {
      this.reply(ctx, toolCallId, DENIED_BY_POLICY(policy.rule));
      ctx.writes.writeBehind();
      return false;
    }
    // approve_session takes effect from the next loop, which reloads the session.
    if (policy.decision === 'ask' && !ctx.session.autoApprove) {
      await ctx.writes.flush();
      await this.requestApproval(ctx, action.code, toolCallId);
      return true;
    }
    await this.runCode(ctx, action.code, toolCallId);
    return false;
  }

  /** Always an org admin's decision, whatever the approval mode or an earlier approve_session. */
  private async proposeSourceUpdate(ctx: Ctx, action: { patch: string; reason: string }, toolCallId: string | undefined): Promise<boolean> {
    const refusal = !ctx.ws.settings.source_updates || !this.sourceUpdates ? su.SOURCE_UPDATE_DISABLED : !action.patch || !action.reason.trim() ? su.SOURCE_UPDATE_INCOMPLETE : null;
    if (refusal) {
      this.reply(ctx, toolCallId, refusal);
      await ctx.writes.flush();
      return false;
    }
    await ctx.writes.flush();
    await this.requestApproval(ctx, su.approvalText(action.reason, action.patch), toolCallId, true);
    return true;
  }

  private requestApproval(ctx: Ctx, code: string, toolCallId: string | undefined, orgAdmin = false): Promise<void> {
    return this.approvals.request(ctx, code, toolCallId, orgAdmin);
  }

  /** Picks up a run whose approval was decided: run the code, or tell the model why not. */
  private async afterApproval(ctx: Ctx, { approval, outcome }: Resume): Promise<void> {
    const toolCallId = approval.toolCallId ?? undefined;
    if (outcome === 'approved' && approval.requiresOrgAdmin) {
      const proposal = su.fromApprovalText(approval.code);
      const sink = this.sourceUpdates;
      const answer = sink
        ? await sink.submit({ ...proposal, author: 'agent' }, undefined).then(su.sourceUpdateSubmitted, (err: Error) => su.sourceUpdateFailed(err.message))
        : su.SOURCE_UPDATE_DISABLED;
      this.reply(ctx, toolCallId, answer);
      await ctx.writes.flush();
      return;
    }
    if (outcome === 'approved') return this.runCode(ctx, approval.code, toolCallId);
    this.reply(ctx, toolCallId, outcome === 'denied' ? DENIED_BY_USER(approval.reason) : APPROVAL_EXPIRED(ctx.ws.settings.approval.timeout_s));
    await ctx.writes.flush();
  }

  private async runCode(ctx: Ctx, code: string, toolCallId: string | undefined): Promise<void> {
    // Cancelled after the model answered: the code is not started (the loop ends the run).
    if (ctx.signal.aborted) return;
    const runId = ctx.run.id;
    ctx.writes.emit('exec.started', {});
    // Stored while the code runs; exec.output events queue up behind it, in order.
    ctx.writes.writeBehind();
    const outputs: Promise<unknown>[] = [];
    const result = await execInSession({ engine: this.engine, workspaces: this.repo }, ctx.ws, { teamId: ctx.run.teamId, sessionId: ctx.session.id, runId }, code, {
      signal: ctx.signal,
      prov: { author: 'agent', sessionId: ctx.session.id, runId },
      // Recorded and audited (as the agent) in the step's last write, with its events.
      audit: { role: 'agent' },
      deferRecord: true,
      onOutput: (stream, data) => void outputs.push(this.events.append(runId, 'exec.output', { stream, data })),
    });
    await Promise.all(outputs);
    const commit = result.workspace;
    if (result.record) ctx.writes.write(...result.record);
    ctx.writes.emit('exec.completed', {
      execution_id: result.execution_id,
      exit_code: result.exit_code,
      error: result.error ?? null,
      truncated: result.truncated,
      restarted: result.restarted,
      duration_ms: result.duration_ms,
      artifacts: result.artifacts,
      commit: commit?.commit ? { sha: commit.commit.sha, kind: commit.commit.kind, paths: commit.commit.paths } : null,
      redactions: commit?.redactions ?? [],
      refused: [...(commit?.refused ?? []), ...(commit?.ignored ?? []), ...(commit?.skipped ?? [])],
    });
    this.reply(ctx, toolCallId, execFeedback(result, commit));
    // Left queued: the loop writes it together with the next step's step.created (or the end).
  }

  /** A user asked to undo a self-evolution change: a revert commit by the agent, within this run. */
  private async undo(ctx: Ctx, evolutionId: string, toolCallId: string | undefined): Promise<void> {
    let feedback: string;
    try {
      const { evolution, sha, paths } = await undoEvolution(this.db, this.repo, ctx.ws, evolutionId, { author: 'agent', sessionId: ctx.session.id, runId: ctx.run.id });
      ctx.writes.emit('evolution.reverted', { evolution_id: evolution.id, commit: sha, paths });
      ctx.evolutions = ctx.evolutions.map((e) => (e.id === evolution.id ? { ...e, status: 'reverted' } : e));
      feedback = `Kiln System: [Undone] evolution ${evolution.id} was reverted by commit ${sha.slice(0, 12)}; restored: ${paths.join(', ')}.`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      feedback = `Kiln System: [Undo failed] ${err.message}`;
    }
    this.reply(ctx, toolCallId, feedback);
    ctx.writes.writeBehind();
  }

  /** The feedback message: a tool result under tool calling, a user message under XML. */
  private reply(ctx: Ctx, toolCallId: string | undefined, content: string): void {
    if (ctx.ws.settings.protocol === 'tools' && toolCallId) this.say(ctx, { role: 'tool', content, toolCallId });
    else this.say(ctx, { role: 'user', content });
  }

  /** Ends the run together with what the step still has queued: one statement. */
  private async end(ctx: Ctx, status: RunEnd, error?: RunError): Promise<void> {
    // A shutdown is no one's cancel: the run was interrupted, as after a crash.
    if (status === 'cancelled' && (ctx.signal.reason as Error | undefined)?.message === SHUTDOWN) return this.end(ctx, 'failed', INTERRUPTED);
    // An earlier write-behind that failed surfaces here, before the run is marked as ended.
    await this.finish(ctx.run, status, error, await ctx.writes.settle());
  }

  private finish(run: RunRow, status: RunEnd, error?: RunError, queued?: Queue): Promise<void> {
    return finishRun(this.writeDeps, run, status, error, queued);
  }

  // ---- transcript ----------------------------------------------------------------------

  /** The request for the next model call (see `fitTranscript`), with its condensation recorded. */
  private async transcript(ctx: Ctx, force?: { budget: number }): Promise<ChatMessage[]> {
    const { messages, condensed } = await fitTranscript(ctx.rows, ctx.ws.settings.context, {
      system: () => systemMessage({ repo: this.repo, engine: this.engine }, ctx),
      summarise: (turns) => this.condense(ctx, turns),
      force,
    });
    if (condensed) {
      ctx.writes.emit('context.condensed', condensed);
      ctx.writes.writeBehind();
    }
    return messages;
  }

  /** Summarises turns out of the transcript (`summariseTurns`), its usage flushed before the commit. */
  private async condense(ctx: Ctx, turns: TranscriptEntry[][]): Promise<boolean> {
    const done = await summariseTurns({ db: this.db, model: this.model, repo: this.repo, log: this.log }, ctx, turns, (usage) => {
      this.recordUsage(ctx, usage);
      return ctx.writes.flush();
    });
    if (!done) return false;
    ctx.session = { ...ctx.session, stateSnapshot: done.state };
    const gone = new Set(done.ids);
    ctx.rows = ctx.rows.filter((r) => !gone.has(r.id));
    return true;
  }

  /** Adds a message to the run's transcript now and queues its row for the step's next flush. */
  private say(ctx: Ctx, m: NewMessage): MessageRow {
    const row = messageRow(ctx.session, ctx.run.id, m);
    ctx.writes.write(insertMessage(row));
    ctx.rows.push(row);
    return row;
  }

  /** Queues one model call's tokens: a usage row, and the run's totals and step count. */
  private recordUsage(ctx: Ctx, u: { promptTokens: number; completionTokens: number }): void {
    ctx.writes.write(insertUsage({ teamId: ctx.run.teamId, workspaceId: ctx.ws.id, runId: ctx.run.id, model: ctx.model }, u));
    ctx.writes.patchRun({ promptTokens: u.promptTokens, completionTokens: u.completionTokens, steps: ctx.run.steps });
  }
}
