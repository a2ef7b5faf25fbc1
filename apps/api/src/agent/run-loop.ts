/**
 * One run's loop, created per run (and again when a paused run resumes): it thinks (the model),
 * acts (Python in the session's sandbox, memory search, undo, a source update) and observes until
 * the run finishes, hits `max_steps`, fails, is cancelled (its signal) or pauses for an approval.
 * It holds the run's state in flight: the run, its session and workspace, the transcript not yet
 * condensed away, and its pending writes.
 *
 * May touch only what its deps object gives it: the model, the session's sandbox (through
 * `execInSession`), the workspace (search, commits, undo), its own run's writes and events
 * (through `RunWrites` and `finishRun`), approvals (to pause), and the source-update sink. It
 * writes no other run, and knows nothing of leases, timers or other replicas.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { messages, runs, sessions, type MessageRow, type RunRow } from '../db/schema/index.ts';
import { recentEvolutions } from '../evolution-log/evolutions.ts';
import { undoEvolution } from '../evolution-log/undo.ts';
import { ApiError } from '../lib/errors.ts';
import type { McpClients } from '../mcp/client.ts';
import { filterProblem } from '../memory/search.ts';
import type { SandboxEngine } from '../sandbox/engine.ts';
import { execInSession, wakeSession } from '../sessions/session-exec.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { KilnMetrics } from '../metrics/metrics.ts';
import { getWorkspace, type WorkspaceRow } from '../workspace/records.ts';
import type { Approvals, Resume } from './approvals.ts';
import type { TranscriptEntry } from './context.ts';
import type { RunEventLog } from './events.ts';
import {
  APPROVAL_EXPIRED,
  DENIED_BY_POLICY,
  DENIED_BY_USER,
  execFeedback,
  FINISHED,
  NOT_RUN_AFTER_FINISH,
  SEARCH_REFUSED,
  searchFeedback,
} from './feedback.ts';
import { ModelError, type ChatMessage, type ModelClient, type ModelTurn, type ToolCall } from './llm.ts';
import { insertMessage, insertUsage, messageRow, type NewMessage } from './message-rows.ts';
import { McpSteps } from './mcp-steps.ts';
import { decideCode } from './policy.ts';
import {
  parseToolCall,
  parseXml,
  TOOL_CORRECTION,
  toolsFor,
  XML_CORRECTION,
  type Action,
  type Call,
} from './protocol.ts';
import { finishRun, INTERRUPTED, RunWrites, type RunEnd, type RunError } from './run-writes.ts';
import * as su from './source-update.ts';
import * as tc from './tool-calls.ts';
import { fitTranscript, summariseTurns, systemMessage, type RecentEvolutions } from './transcript.ts';

const MAX_VIOLATIONS = 3;
/** The abort reason of a loop stopped by a shutdown: the run ends interrupted, not cancelled. */
export const SHUTDOWN = 'shutdown';

/** Everything a run's loop may reach. */
export interface RunLoopDeps {
  db: Db;
  events: RunEventLog;
  model: ModelClient;
  engine: SandboxEngine;
  workspaces: WorkspaceService;
  log: Logger;
  approvals: Pick<Approvals, 'request'>;
  /** Where approved source updates go; none: they are refused. */
  sourceUpdates?: su.SourceUpdateSink;
  /** Counts the steps (the app's metrics). */
  metrics?: Pick<KilnMetrics, 'runStep'>;
  /** The workspace's MCP servers (their tools offered to the model, each call under the policy); none: no MCP. */
  mcp?: McpClients;
}

/** What a run's loop starts from. */
export type Loaded = { run: RunRow; session: SessionRow; ws: WorkspaceRow };

export class RunLoop {
  private readonly writes: RunWrites;
  private readonly model: string;
  /** The run's calls of its workspace's MCP tools, and the tools offered at each step. */
  private readonly mcp: McpSteps;

  private constructor(
    private readonly deps: RunLoopDeps,
    private run: RunRow,
    private session: SessionRow,
    private readonly ws: WorkspaceRow,
    private readonly signal: AbortSignal,
    /** The transcript not yet condensed away, kept in step with the database by `say`. */
    private rows: MessageRow[],
    /** Recent self-evolution changes, read once per run for the prompt (so "undo that" has a name). */
    private evolutions: RecentEvolutions,
  ) {
    // Writes and events of the current step not yet flushed (they go in one statement).
    this.writes = new RunWrites(deps.events, run.id);
    this.model = run.model!;
    this.mcp = new McpSteps({
      ws,
      runId: run.id,
      teamId: run.teamId,
      signal,
      writes: this.writes,
      mcp: deps.mcp,
      autoApprove: () => this.session.autoApprove,
      reply: (toolCallId, content) => this.reply(toolCallId, content),
      requestApproval: (code, toolCallId) => this.requestApproval(code, toolCallId),
    });
  }

  /** A run's loop, from the database (`loaded` spares re-reading what the caller just wrote); `signal` stops it. */
  static async open(deps: RunLoopDeps, runId: string, signal: AbortSignal, loaded?: Loaded): Promise<RunLoop> {
    const { db, workspaces } = deps;
    const { run, session, ws } = loaded ?? (await load(db, runId));
    const unsummarised = and(eq(messages.sessionId, session.id), sql`${messages.summarizedAt} is null`);
    const [rows, evolutions] = await Promise.all([
      db.select().from(messages).where(unsummarised).orderBy(asc(messages.id)),
      recentEvolutions(db, { id: ws.id, dir: workspaces.dirOf(ws.id) }),
    ]);
    return new RunLoop(deps, run, session, ws, signal, rows, evolutions);
  }

  /** Runs the loop to the run's end or its next pause; `resume`: it paused at an approval now decided. */
  async loop(resume?: Resume): Promise<void> {
    const { ws, signal } = this;
    const settings = ws.settings;
    if (this.run.status !== 'in_progress') {
      // Written with the first step's step.created (every way the loop goes flushes first).
      const startedAt = new Date();
      this.writes.patchRun({ startedAt });
      this.writes.emit('run.in_progress', {});
      this.run = { ...this.run, status: 'in_progress', startedAt };
    }
    // A paused sandbox of the session resumes while the model thinks, not at the first execution.
    const { engine, workspaces, log } = this.deps;
    wakeSession({ engine, workspaces, log }, ws, {
      teamId: this.run.teamId,
      sessionId: this.session.id,
      runId: this.run.id,
    });
    if (resume) {
      await this.mcp.list();
      // The decided call first, then the calls of its message still unanswered (it paused there).
      if (await this.afterApproval(resume)) return;
      const decided = resume.approval.toolCallId;
      if (decided && (await this.actCalls(this.unanswered(decided)))) return;
    }
    let violations = 0;
    for (;;) {
      if (signal.aborted) return this.end('cancelled');
      if (this.run.steps >= settings.max_steps) {
        const message = `the run reached its limit of ${settings.max_steps} steps without finishing`;
        return this.end('failed', { code: 'max_steps', message });
      }
      // The step count is written with the step's usage (one statement), and by `finishRun`.
      this.run = { ...this.run, steps: this.run.steps + 1 };
      this.writes.emit('step.created', { step: this.run.steps });
      this.deps.metrics?.runStep();
      // Stored while the model thinks; the model call does not need it.
      this.writes.writeBehind();

      let turn: ModelTurn;
      await this.mcp.list();
      try {
        const tools = settings.protocol === 'tools' ? toolsFor(settings, this.mcp.tools.tools) : undefined;
        const call = async (force?: { budget: number }) =>
          this.deps.model.complete({ model: this.model, messages: await this.transcript(force), tools, signal });
        try {
          turn = await call();
        } catch (err) {
          // Level 4: the endpoint says the context is too long. Summarise, cut to the limit it
          // names (with room for the answer), and try once more.
          if (!(err instanceof ModelError) || err.code !== 'context_overflow') throw err;
          const limit = err.limit ?? settings.context.max_tokens;
          turn = await call({ budget: Math.floor(Math.min(limit, settings.context.max_tokens) * 0.8) });
        }
      } catch (err) {
        if (!(err instanceof ModelError)) throw err;
        if (err.code === 'cancelled') return this.end('cancelled');
        const code = err.code === 'context_overflow' ? 'context_overflow' : 'model_unavailable';
        return this.end('failed', { code, message: err.message });
      }
      this.recordUsage(turn.usage);
      // Tool calls only where tools were offered: calls nobody answers would make the transcript
      // one no endpoint accepts.
      const offered = settings.protocol === 'tools' && turn.toolCalls.length;
      const toolCalls = offered ? this.ownIds(turn.toolCalls) : undefined;
      this.say({ role: 'assistant', content: turn.content, toolCalls });

      if (toolCalls) {
        const calls = toolCalls.map((c) => parseToolCall(c, this.mcp.tools.tools));
        const broken = calls.flatMap((c) => ('violation' in c ? [c.violation] : []));
        // Only a message with no call that can be carried out counts towards the limit.
        violations = broken.length === calls.length ? violations + 1 : 0;
        if (violations > MAX_VIOLATIONS) {
          for (const c of calls) this.reply(c.toolCallId, TOOL_CORRECTION(broken[0]!));
          const message = `the model broke the tools protocol ${violations} times in a row (${broken.join('; ')})`;
          return this.end('failed', { code: 'protocol_violation', message });
        }
        if (broken.length) {
          const violation = broken.join('; ');
          this.writes.emit('thinking', { text: turn.content, protocol_violation: violation, attempt: violations });
        } else if (turn.content.trim()) {
          this.writes.emit('thinking', { text: turn.content.trim() });
        }
        if (await this.actCalls(calls)) return;
        continue;
      }
      // Without a tool call, a reply under tool calling is the model finishing in prose.
      const parsed =
        settings.protocol === 'xml'
          ? parseXml(turn.content)
          : { thinking: null, action: { type: 'finish' as const, summary: turn.content.trim() } };
      if (!parsed.action) {
        violations++;
        if (violations > MAX_VIOLATIONS) {
          const message = `the model broke the xml protocol ${violations} times in a row (no action tag)`;
          return this.end('failed', { code: 'protocol_violation', message });
        }
        this.writes.emit('thinking', { text: turn.content, protocol_violation: 'no action tag', attempt: violations });
        this.reply(undefined, XML_CORRECTION);
        this.writes.writeBehind();
        continue;
      }
      violations = 0;
      if (parsed.thinking) this.writes.emit('thinking', { text: parsed.thinking });
      const done = await this.act(parsed.action, undefined);
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
  private async actCalls(calls: Call[]): Promise<boolean> {
    for (const [i, call] of calls.entries()) {
      // Cancelled between calls: the loop ends the run; the transcript answers the rest as not run.
      if (this.signal.aborted) return false;
      if ('violation' in call) {
        this.reply(call.toolCallId, TOOL_CORRECTION(call.violation));
        continue;
      }
      if (call.action.type === 'finish') {
        this.reply(call.toolCallId, FINISHED);
        for (const later of calls.slice(i + 1)) this.reply(later.toolCallId, NOT_RUN_AFTER_FINISH);
        return this.complete(call.action.summary);
      }
      if (await this.act(call.action, call.toolCallId)) return true;
    }
    return false;
  }

  /** The calls of the message that made call `toolCallId` that have no answer yet, in order. */
  private unanswered(toolCallId: string): Call[] {
    const calls = (r: MessageRow) => (r.role === 'assistant' ? ((r.toolCalls as ToolCall[] | null) ?? []) : []);
    let at = this.rows.length - 1;
    while (at >= 0 && !calls(this.rows[at]!).some((c) => c.id === toolCallId)) at--;
    if (at < 0) return [];
    const answered = new Set(this.rows.slice(at + 1).flatMap((r) => (r.role === 'tool' ? [r.toolCallId] : [])));
    return calls(this.rows[at]!)
      .filter((c) => !answered.has(c.id))
      .map((c) => parseToolCall(c, this.mcp.tools.tools));
  }

  /**
   * Every call gets an id of its own: some OpenAI-compatible servers leave ids empty or number
   * them from 0 in every message, and an answer must name exactly one call of the transcript.
   */
  private ownIds(calls: ToolCall[]): ToolCall[] {
    const taken = new Set(this.rows.flatMap((r) => ((r.toolCalls as ToolCall[] | null) ?? []).map((c) => c.id)));
    return calls.map((c) => {
      const id = c.id && !taken.has(c.id) ? c.id : `call_${randomUUID().replaceAll('-', '')}`;
      taken.add(id);
      return { ...c, id };
    });
  }

  /** The run's answer to the person, and its end. */
  private async complete(summary: string): Promise<true> {
    const msg = this.say({ role: 'assistant', content: summary });
    this.writes.emit('message.created', { id: msg.id, role: 'assistant', content: summary });
    await this.end('completed');
    return true;
  }

  /** Carries out one action. Returns true when the run is over (finished or paused). */
  private async act(action: Action, toolCallId: string | undefined): Promise<boolean> {
    // A finish that is a tool call is answered by `actCalls`, with the calls after it.
    if (action.type === 'finish') return this.complete(action.summary);
    if (action.type === 'memory_search') {
      const filters = { path: action.path, since: action.since, until: action.until };
      const problem = filterProblem(filters);
      const hits = problem ? [] : (await this.deps.workspaces.search(this.ws, action.query, { k: 8, ...filters })).hits;
      this.writes.emit('memory.searched', { query: action.query, ...filters, hits });
      this.reply(toolCallId, problem ? SEARCH_REFUSED(problem) : searchFeedback(action.query, hits));
      this.writes.writeBehind();
      return false;
    }
    if (action.type === 'undo_evolution') {
      await this.undo(action.evolutionId, toolCallId);
      return false;
    }
    if (action.type === 'source_update') return this.proposeSourceUpdate(action, toolCallId);
    if (action.type === 'tool') return this.mcp.propose(action, toolCallId);
    if (tc.isToolApprovalText(action.code)) {
      // Never Python, and an approval of it would read as a tool call's.
      this.reply(toolCallId, tc.NOT_PYTHON);
      this.writes.writeBehind();
      return false;
    }
    this.writes.emit('code.proposed', { code: action.code });
    const policy = decideCode(this.ws.settings.approval, action.code);
    if (policy.decision === 'deny') {
      this.reply(toolCallId, DENIED_BY_POLICY(policy.rule));
      this.writes.writeBehind();
      return false;
    }
    // approve_session takes effect from the next loop, which reloads the session.
    if (policy.decision === 'ask' && !this.session.autoApprove) {
      await this.writes.flush();
      await this.requestApproval(action.code, toolCallId);
      return true;
    }
    return this.runCode(action.code, toolCallId);
  }

  /** Always an org admin's decision, whatever the approval mode or an earlier approve_session. */
  private async proposeSourceUpdate(
    action: { patch: string; reason: string },
    toolCallId: string | undefined,
  ): Promise<boolean> {
    const refusal = su.proposalRefusal(this.ws.settings.source_updates, this.deps.sourceUpdates, action);
    if (refusal) {
      this.reply(toolCallId, refusal);
      await this.writes.flush();
      return false;
    }
    await this.writes.flush();
    await this.requestApproval(su.approvalText(action.reason, action.patch), toolCallId, true);
    return true;
  }

  /** Pauses the run at this call until a person decides (`orgAdmin`: only an org admin may). */
  private requestApproval(code: string, toolCallId: string | undefined, orgAdmin = false): Promise<void> {
    const at = { run: this.run, ws: this.ws, session: this.session };
    return this.deps.approvals.request(at, code, toolCallId, orgAdmin);
  }

  /**
   * Picks up a run whose approval was decided: run the code, or tell the model why not. Returns
   * true when the run is over (the approved code found no sandbox to run in).
   */
  private async afterApproval({ approval, outcome }: Resume): Promise<boolean> {
    const toolCallId = approval.toolCallId ?? undefined;
    if (outcome === 'approved' && approval.requiresOrgAdmin) {
      this.reply(toolCallId, await su.submitApproved(this.deps.sourceUpdates, approval.code));
      await this.writes.flush();
      return false;
    }
    const call = tc.fromToolApprovalText(approval.code);
    if (call) {
      await this.mcp.afterApproval(call, { approval, outcome }, toolCallId);
      return false;
    }
    if (outcome === 'approved') return this.runCode(approval.code, toolCallId);
    const timeout = this.ws.settings.approval.timeout_s;
    this.reply(toolCallId, outcome === 'denied' ? DENIED_BY_USER(approval.reason) : APPROVAL_EXPIRED(timeout));
    await this.writes.flush();
    return false;
  }

  /** Runs the code in the session's sandbox; returns true when the run is over (no sandbox to run it in). */
  private async runCode(code: string, toolCallId: string | undefined): Promise<boolean> {
    // Cancelled after the model answered: the code is not started (the loop ends the run).
    if (this.signal.aborted) return false;
    const runId = this.run.id;
    const sessionId = this.session.id;
    this.writes.emit('exec.started', {});
    // Stored while the code runs; exec.output events queue up behind it, in order.
    this.writes.writeBehind();
    const outputs: Promise<unknown>[] = [];
    const { engine, workspaces, events } = this.deps;
    const by = { teamId: this.run.teamId, sessionId, runId };
    let result: Awaited<ReturnType<typeof execInSession>>;
    try {
      result = await execInSession({ engine, workspaces }, this.ws, by, code, {
        signal: this.signal,
        prov: { author: 'agent', sessionId, runId },
        // Recorded and audited (as the agent) in the step's last write, with its events.
        audit: { role: 'agent' },
        deferRecord: true,
        onOutput: (stream, data) => void outputs.push(events.append(runId, 'exec.output', { stream, data })),
      });
    } catch (err) {
      // No sandbox to run the code in (the team is at its cap, or the engine refused to start
      // one): the call is answered, so the session's transcript stays one an endpoint accepts,
      // and the run ends saying why, not as a crash ("internal").
      if (!(err instanceof ApiError) || (err.code !== 'sandbox_unavailable' && err.code !== 'unavailable')) throw err;
      await Promise.all(outputs);
      this.deps.log.warn({ err, run: runId, session: sessionId }, 'an agent run’s code found no sandbox to run in');
      // Its exec.started is answered too (a viewer of the run is not left with code forever running).
      this.writes.emit('exec.completed', execCompleted(null, { type: 'SandboxUnavailable', message: err.message }));
      this.reply(toolCallId, `Kiln System: [Not run] ${err.message}`);
      await this.end('failed', { code: 'sandbox_unavailable', message: err.message });
      return true;
    }
    await Promise.all(outputs);
    const commit = result.workspace;
    if (result.record) this.writes.write(...result.record);
    this.writes.emit('exec.completed', execCompleted(result));
    this.reply(toolCallId, execFeedback(result, commit));
    // Left queued: the loop writes it together with the next step's step.created (or the end).
    return false;
  }

  /** A user asked to undo a self-evolution change: a revert commit by the agent, within this run. */
  private async undo(evolutionId: string, toolCallId: string | undefined): Promise<void> {
    let feedback: string;
    try {
      const by = { author: 'agent' as const, sessionId: this.session.id, runId: this.run.id };
      const { evolution, sha, paths } = await undoEvolution(
        this.deps.db,
        this.deps.workspaces,
        this.ws,
        evolutionId,
        by,
      );
      this.writes.emit('evolution.reverted', { evolution_id: evolution.id, commit: sha, paths });
      this.evolutions = this.evolutions.map((e) => (e.id === evolution.id ? { ...e, status: 'reverted' } : e));
      const reverted = `evolution ${evolution.id} was reverted by commit ${sha.slice(0, 12)}`;
      feedback = `Kiln System: [Undone] ${reverted}; restored: ${paths.join(', ')}.`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      feedback = `Kiln System: [Undo failed] ${err.message}`;
    }
    this.reply(toolCallId, feedback);
    this.writes.writeBehind();
  }

  /** The feedback message: a tool result under tool calling, a user message under XML. */
  private reply(toolCallId: string | undefined, content: string): void {
    if (this.ws.settings.protocol === 'tools' && toolCallId) this.say({ role: 'tool', content, toolCallId });
    else this.say({ role: 'user', content });
  }

  /** Ends the run together with what the step still has queued: one statement. */
  private async end(status: RunEnd, error?: RunError): Promise<void> {
    // A shutdown is no one's cancel: the run was interrupted, as after a crash.
    const shutdown = (this.signal.reason as Error | undefined)?.message === SHUTDOWN;
    if (status === 'cancelled' && shutdown) return this.end('failed', INTERRUPTED);
    // An earlier write-behind that failed surfaces here, before the run is marked as ended.
    await finishRun(this.deps, this.run, status, error, await this.writes.settle());
  }

  /** The request for the next model call (`fitTranscript`), with its condensation recorded. */
  private async transcript(force?: { budget: number }): Promise<ChatMessage[]> {
    const { messages, condensed } = await fitTranscript(this.rows, this.ws.settings.context, {
      system: () =>
        systemMessage(this.deps, {
          ws: this.ws,
          session: this.session,
          evolutions: this.evolutions,
          mcp: this.mcp.tools,
        }),
      summarise: (turns) => this.condense(turns),
      force,
    });
    if (condensed) {
      this.writes.emit('context.condensed', condensed);
      this.writes.writeBehind();
    }
    return messages;
  }

  /** Summarises turns out of the transcript (`summariseTurns`), its usage stored before the commit. */
  private async condense(turns: TranscriptEntry[][]): Promise<boolean> {
    const at = { run: this.run, session: this.session, ws: this.ws, model: this.model, signal: this.signal };
    const done = await summariseTurns(this.deps, at, turns, (usage) => {
      this.recordUsage(usage);
      return this.writes.flush();
    });
    if (!done) return false;
    this.session = { ...this.session, stateSnapshot: done.state };
    const gone = new Set(done.ids);
    this.rows = this.rows.filter((r) => !gone.has(r.id));
    return true;
  }

  /** Adds a message to the run's transcript now and queues its row for the step's next flush. */
  private say(m: NewMessage): MessageRow {
    const row = messageRow(this.session, this.run.id, m);
    this.writes.write(insertMessage(row));
    this.rows.push(row);
    return row;
  }

  /** Queues one model call's tokens: a usage row, and the run's totals and step count. */
  private recordUsage(u: { promptTokens: number; completionTokens: number }): void {
    const by = { teamId: this.run.teamId, workspaceId: this.ws.id, runId: this.run.id, model: this.model };
    this.writes.write(insertUsage(by, u));
    this.writes.patchRun({ promptTokens: u.promptTokens, completionTokens: u.completionTokens, steps: this.run.steps });
  }
}

async function load(db: Db, runId: string): Promise<Loaded> {
  const [run] = (await db.select().from(runs).where(eq(runs.id, runId))) as [RunRow];
  const [session] = (await db.select().from(sessions).where(eq(sessions.id, run.sessionId))) as [SessionRow];
  return { run, session, ws: await getWorkspace(db, run.teamId, run.workspaceId) };
}

/**
 * A run's `exec.completed` event: what its execution gave, or (`result` null) that the code did
 * not run, `error` saying why.
 */
function execCompleted(
  result: Awaited<ReturnType<typeof execInSession>> | null,
  error?: { type: string; message: string },
) {
  const commit = result?.workspace;
  return {
    execution_id: result?.execution_id ?? null,
    exit_code: result?.exit_code ?? null,
    error: error ?? result?.error ?? null,
    truncated: result?.truncated ?? false,
    restarted: result?.restarted ?? false,
    // The sandbox was paused and resumed for this execution (or at the run's start): how long that took.
    resumed_ms: result?.resumed_ms ?? null,
    duration_ms: result?.duration_ms ?? 0,
    artifacts: result?.artifacts ?? [],
    egress: result?.egress ?? [],
    commit: commit?.commit ? { sha: commit.commit.sha, kind: commit.commit.kind, paths: commit.commit.paths } : null,
    redactions: commit?.redactions ?? [],
    refused: [...(commit?.refused ?? []), ...(commit?.ignored ?? []), ...(commit?.skipped ?? [])],
  };
}
