/**
 * A run's request to the model: the system prompt rebuilt from the workspace, then the stored
 * transcript condensed to fit (context condensation, four levels). Owns turning message rows
 * into chat messages, the levels, and the summary of old turns into the daily log and the
 * session's <Current_Project_State>.
 *
 * May touch: the workspace (reads for the prompt, the daily log's commit), the model (the
 * summary), the session's snapshot and the messages' `summarized_at`. Never the run's row or its
 * events: the run loop records the summary's usage and the `context.condensed` event.
 */
import { eq, inArray } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { messages, sessions, type MessageRow, type RunRow } from '../db/schema/index.ts';
import type { ToolSet } from '../mcp/client.ts';
import type { SandboxEngine } from '../sandbox/engine.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';
import type { recentEvolutions } from '../evolution-log/evolutions.ts';
import {
  answerEveryCall,
  fits,
  messageTokens,
  parseSummary,
  reduceOldTurns,
  renderTurns,
  splitTurns,
  SUMMARY_INSTRUCTIONS,
  truncateOldResults,
  type TranscriptEntry,
} from './context.ts';
import { NOT_RUN_RUN_ENDED } from './feedback.ts';
import { ModelError, type ChatMessage, type ModelClient, type ModelTurn, type ToolCall } from './llm.ts';
import { buildSystemPrompt } from './prompt.ts';

/** Level 1: an earlier tool result longer than this (tokens) keeps only its head and tail. */
const TOOL_RESULT_CAP = 1000;
/** Level 2 instead of 3 when the token limit is hit with more turns than this. */
const FEW_TURNS = 4;

/** Feedback Kiln writes into the transcript starts with this; everything else from `user` is a person. */
export const FEEDBACK_PREFIX = 'Kiln System:';

/** Recent self-evolution changes, as the prompt lists them. */
export type RecentEvolutions = Awaited<ReturnType<typeof recentEvolutions>>;

/** A stored message as the model gets it, and whether a person wrote it (it then starts a turn). */
export function toEntry(m: MessageRow): TranscriptEntry {
  let message: ChatMessage;
  if (m.role === 'assistant') {
    const calls = (m.toolCalls as ToolCall[] | null) ?? undefined;
    const toolCalls = calls?.map((c) => ({
      id: c.id,
      type: 'function' as const,
      function: { name: c.name, arguments: c.arguments },
    }));
    message = { role: 'assistant', content: m.content || null, ...(toolCalls ? { tool_calls: toolCalls } : {}) };
  } else if (m.role === 'tool') {
    message = { role: 'tool', content: m.content, tool_call_id: m.toolCallId! };
  } else {
    message = { role: 'user', content: m.content };
  }
  return { id: m.id, message, person: m.role === 'user' && !m.content.startsWith(FEEDBACK_PREFIX) };
}

/**
 * Level 4's last resort: drops the oldest exchanges of the current turn (an answer with its
 * results, never one without the other) until `fits`, keeping the person's message.
 */
export async function trimCurrentTurn(
  turns: TranscriptEntry[][],
  fits: (ts: TranscriptEntry[][]) => Promise<boolean>,
): Promise<TranscriptEntry[][]> {
  const current = [...turns.at(-1)!];
  const older = turns.slice(0, -1);
  while (current.length > 2 && !(await fits([...older, current]))) {
    let end = 2;
    while (end < current.length && current[end]!.message.role !== 'assistant') end++;
    current.splice(1, end - 1);
  }
  return [...older, current];
}

/** What a condensation did, as the `context.condensed` event reports it. */
export interface Condensed {
  levels: number[];
  before_tokens: number;
  after_tokens: number;
  budget: number;
}

/** How `fitTranscript` gets the system prompt and summarises turns; both may be called again after a summary. */
export interface FitSteps {
  /** The system prompt as it is now (a summary changes the project state it shows). */
  system: () => Promise<ChatMessage>;
  /** Summarises these turns out of the transcript; false when no summary could be made (the turns stay). */
  summarise: (turns: TranscriptEntry[][]) => Promise<boolean>;
  /** After a context-length error: summarise every earlier turn and cut the current one to `budget`. */
  force?: { budget: number };
}

/**
 * The request for the next model call: the system prompt, then the transcript, condensed when it
 * grows: (1) old tool results over a cap keep head and tail; (2) over the turn limit, the oldest
 * half of whole turns is summarised and leaves the transcript; (3) over the token limit, earlier
 * turns shrink to their first message and last answer; (4) with `force`, every earlier turn is
 * summarised and the current one cut to the budget. `condensed` is null when no level applied.
 */
export async function fitTranscript(
  rows: MessageRow[],
  limits: WorkspaceSettings['context'],
  steps: FitSteps,
): Promise<{ messages: ChatMessage[]; condensed: Condensed | null }> {
  const { force } = steps;
  const budget = force?.budget ?? limits.max_tokens;
  let turns = splitTurns(answerEveryCall(rows.map(toEntry), NOT_RUN_RUN_ENDED));
  const flat = (head: ChatMessage, ts: TranscriptEntry[][]) => [head, ...ts.flat().map((e) => e.message)];
  let head = await steps.system();
  const levels: number[] = [];
  const original = flat(head, turns);

  const summariseOldest = async (count: number) => {
    if (count <= 0) return;
    if (await steps.summarise(turns.slice(0, count))) {
      turns = turns.slice(count);
      head = await steps.system();
      levels.push(2);
    }
  };
  if (force) await summariseOldest(turns.length - 1);
  else if (turns.length > limits.max_turns) await summariseOldest(Math.floor(turns.length / 2));
  const truncated = await truncateOldResults(turns, TOOL_RESULT_CAP);
  if (truncated.changed) levels.push(1);
  turns = truncated.turns;
  if (!(await fits(flat(head, turns), budget)) && turns.length > FEW_TURNS && !force) {
    await summariseOldest(Math.floor(turns.length / 2));
  }
  if (!(await fits(flat(head, turns), budget))) {
    turns = reduceOldTurns(turns);
    levels.push(3);
  }
  if (force && !(await fits(flat(head, turns), budget))) {
    turns = await trimCurrentTurn(turns, (ts) => fits(flat(head, ts), budget));
    levels.push(4);
  }
  const out = flat(head, turns);
  if (!levels.length) return { messages: out, condensed: null };
  const [before, after] = await Promise.all([messageTokens(original), messageTokens(out)]);
  return {
    messages: out,
    condensed: { levels: [...new Set(levels)].sort(), before_tokens: before, after_tokens: after, budget },
  };
}

/** The system prompt, rebuilt from the workspace's files, the session's project state and recent evolutions. */
export async function systemMessage(
  deps: { workspaces: WorkspaceService; engine: SandboxEngine },
  at: { ws: WorkspaceRow; session: SessionRow; evolutions: RecentEvolutions; mcp?: ToolSet },
): Promise<ChatMessage> {
  return {
    role: 'system',
    content: await buildSystemPrompt({
      dir: deps.workspaces.dirOf(at.ws.id),
      settings: at.ws.settings,
      limits: deps.engine.settings.limitsFor(at.ws.settings.sandbox),
      snapshot: at.session.stateSnapshot,
      now: new Date(),
      evolutions: at.evolutions,
      mcp: at.mcp,
      secrets: await deps.engine.secretNames(at.ws.id),
    }),
  };
}

/** What summarising reaches. */
export interface SummaryDeps {
  db: Db;
  model: ModelClient;
  workspaces: WorkspaceService;
  log: Logger;
}

/**
 * Summarises turns with the model into today's daily log (a commit) and the session's
 * <Current_Project_State>, and marks their messages summarised. Null when the summary could not
 * be made (the turns then stay, and the cheaper levels apply); otherwise the new state and the
 * ids of the messages that left the transcript. `recordUsage` is awaited before anything is
 * committed, with the summary call's tokens.
 */
export async function summariseTurns(
  deps: SummaryDeps,
  at: { run: RunRow; session: SessionRow; ws: WorkspaceRow; model: string; signal: AbortSignal },
  turns: TranscriptEntry[][],
  recordUsage: (u: { promptTokens: number; completionTokens: number }) => Promise<void>,
): Promise<{ state: string; ids: string[] } | null> {
  const { session } = at;
  const previous = session.stateSnapshot ? `Previous project state:\n${session.stateSnapshot}\n\n` : '';
  let reply: ModelTurn;
  try {
    reply = await deps.model.complete({
      model: at.model,
      messages: [
        { role: 'system', content: SUMMARY_INSTRUCTIONS },
        { role: 'user', content: `${previous}Conversation to condense:\n\n${renderTurns(turns)}` },
      ],
      signal: at.signal,
    });
  } catch (err) {
    if (err instanceof ModelError && err.code === 'cancelled') throw err;
    deps.log.warn({ err, run: at.run.id }, 'context summary failed');
    return null;
  }
  await recordUsage(reply.usage);
  const summary = parseSummary(reply.content);
  if (!summary) return null;
  const day = new Date().toISOString().slice(0, 10);
  const path = `memory/${day}.md`;
  await deps.workspaces.change(
    at.ws,
    { author: 'agent', sessionId: session.id, runId: at.run.id },
    async (tree) => {
      const existing = (await tree.readFile(path).catch(() => null))?.toString('utf8') ?? `# ${day}\n`;
      const heading = `## ${new Date().toISOString().slice(11, 16)} — condensed session ${session.id}`;
      await tree.writeFile(path, Buffer.from(`${existing.trimEnd()}\n\n${heading}\n\n${summary.log}\n`));
    },
    { summary: `Condense ${turns.length} earlier turn(s) into the daily log` },
  );
  const ids = turns.flat().map((e) => e.id);
  await deps.db.update(sessions).set({ stateSnapshot: summary.state }).where(eq(sessions.id, session.id));
  await deps.db.update(messages).set({ summarizedAt: new Date() }).where(inArray(messages.id, ids));
  return { state: summary.state, ids };
}
