import { and, asc, eq, inArray, sql } from 'drizzle-orm';
import type { RunEventLog } from '../agent/events.ts';
import { ModelError, type ChatMessage, type ModelClient } from '../agent/llm.ts';
import { insertMessage, insertUsage, messageRow } from '../agent/message-rows.ts';
import { listSkills } from '../workspace/skills.ts';
import type { Db } from '../db/client.ts';
import { messages, runs, sessions, workspaces } from '../db/schema/index.ts';
import { ACTIVE_RUN_STATUSES } from '../db/schema/runs.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { endEvolution, type EvolutionRow } from '../evolution-log/evolutions.ts';
import {
  FILE_TOOLS,
  FILE_TOOLS_XML,
  parseToolActions,
  parseXmlActions,
  runFileAction,
  type ParsedActions,
} from './file-tools.ts';
import { GuardedFiles } from './guarded-files.ts';
import { renderSession } from './transcript.ts';
import type { Logger } from 'pino';

export interface EvolutionDeps {
  db: Db;
  model: ModelClient;
  workspaces: WorkspaceService;
  events: RunEventLog;
  log: Logger;
  maxFileBytes: number;
}

/** A review that goes on longer than this many model calls is stopped (nothing is committed). */
const MAX_REVIEW_STEPS = 16;
const MAX_VIOLATIONS = 3;

const REVIEW_INSTRUCTIONS = `You review a conversation that has ended between a user and an AI agent, to make the agent better next time.
The agent works in a workspace (a git repository): MEMORY.md (core memory, always in its prompt, kept short),
memory/YYYY-MM-DD.md (daily logs), skills/<name>/SKILL.md (procedures), knowledge/ (pages) and prompt files
(AGENT.md persona, RULE.md rules, USER.md about the user, SPEC.md, PYTHON.md).

In this order of priority:
1. A skill that misbehaved in the conversation (an error when it was followed, a missing or wrong step, outdated
   content): fix the skill file itself. Do not write a memory note about the problem instead — fix the source.
2. A procedure worked out in the conversation that will be needed again: turn it into a new skill,
   skills/<short-name>/SKILL.md, starting with front matter
   ---
   name: <short-name>
   description: <one line: when to use it>
   ---
   followed by the steps and the code that worked.
3. A task the agent promised and left undone (or that stopped on a temporary failure): finish it if files are all it
   needs; otherwise hand it back — add it under "## Open tasks" in today's daily log and say so in your summary.
4. Only then fill gaps: lasting facts, preferences and decisions missing from MEMORY.md (within its budget),
   knowledge pages, USER.md / RULE.md for what the user said about themselves or how to work.

The default is to change nothing. Do not write one-off failures, environment noise (network blips, timeouts, a
restarted sandbox), or what is already written. Never invent anything the conversation does not show.
You cannot run code. You may read any file; you may write only MEMORY.md, memory/, skills/ (never skills/builtin/,
which is read-only), knowledge/ and the prompt files. Everything you write lands as one commit when you finish;
the user is told about it and can undo it.`;

/** The transcript (with results and errors), the current skills and memory: what the reviewer needs to start. */
async function reviewBrief(
  deps: EvolutionDeps,
  ws: WorkspaceRow,
  session: SessionRow,
  rows: (typeof messages.$inferSelect)[],
): Promise<string> {
  const dir = deps.workspaces.dirOf(ws.id);
  const skills = await listSkills(dir);
  const memory = (await deps.workspaces.readFile(ws.id, 'MEMORY.md').catch(() => Buffer.from(''))).toString('utf8');
  const ev = ws.settings.evolution;
  return [
    `Today is ${new Date().toISOString().slice(0, 10)}.`,
    `<Skills>\n${skills.map((s) => `- ${s.name}: ${s.description} (${s.path.replace('/workspace/', '')})`).join('\n') || '(none)'}\n</Skills>`,
    `<Core_Memory path="MEMORY.md" limits="${ev.memory_max_entries} entries, ${ev.memory_max_bytes} bytes">\n${memory.trim()}\n</Core_Memory>`,
    session.stateSnapshot ? `<Project_State>\n${session.stateSnapshot.trim()}\n</Project_State>` : '',
    `<Conversation session="${session.id}">\n${renderSession(rows, { perMessage: 4000, total: Math.min(200_000, ws.settings.context.max_tokens * 2) })}\n</Conversation>`,
  ]
    .filter(Boolean)
    .join('\n\n');
}

export type ReviewOutcome =
  | { status: 'committed'; sha: string; paths: string[]; summary: string; runId: string }
  | { status: 'no_change' | 'skipped'; summary: string };

/**
 * The post-session review: the same model with a narrow tool set reads the
 * whole session and may improve skills, memory, knowledge and prompt files through the write
 * guard. Its edits land as one commit with `Kiln-Evolution`, and only then is the session told.
 */
export async function runReview(
  deps: EvolutionDeps,
  evo: EvolutionRow,
  ws: WorkspaceRow,
  signal: AbortSignal,
): Promise<ReviewOutcome> {
  const { db } = deps;
  const [session] = (await db.select().from(sessions).where(eq(sessions.id, evo.sessionId!))) as [
    SessionRow | undefined,
  ];
  if (!session) return done(deps, evo, { status: 'skipped', summary: 'the session no longer exists' });
  const [active] = await db
    .select({ id: runs.id })
    .from(runs)
    .where(and(eq(runs.sessionId, session.id), inArray(runs.status, ACTIVE_RUN_STATUSES)));
  if (active)
    return done(
      deps,
      evo,
      {
        status: 'skipped',
        summary: `the session had a run in progress (${active.id}); it is reviewed once it is idle`,
      },
      session,
    );
  const rows = await db.select().from(messages).where(eq(messages.sessionId, session.id)).orderBy(asc(messages.id));
  if (!rows.some((m) => m.role === 'user'))
    return done(deps, evo, { status: 'skipped', summary: 'the session has no conversation yet' }, session);
  const model = deps.model.modelFor(ws.settings.model);
  if (!model) throw new ModelError('model_not_configured', 'no model is configured for this workspace');

  const tools = ws.settings.protocol === 'tools';
  const chat: ChatMessage[] = [
    {
      role: 'system',
      content: `${REVIEW_INSTRUCTIONS}\n\n${tools ? 'Use the tools; call finish when you are done.' : FILE_TOOLS_XML}`,
    },
    { role: 'user', content: await reviewBrief(deps, ws, session, rows) },
  ];
  const files = new GuardedFiles(deps.workspaces.reader(ws.id), {
    maxFileBytes: deps.maxFileBytes,
    budget: { maxEntries: ws.settings.evolution.memory_max_entries, maxBytes: ws.settings.evolution.memory_max_bytes },
  });
  let summary: string | undefined;
  let violations = 0;
  for (let step = 0; step < MAX_REVIEW_STEPS && summary === undefined; step++) {
    const turn = await deps.model.complete({ model, messages: chat, tools: tools ? FILE_TOOLS : undefined, signal });
    await recordUsage(db, ws, model, turn.usage);
    // An empty answer is not sent back: an assistant message needs content or tool calls.
    if (turn.content || turn.toolCalls.length) {
      chat.push({
        role: 'assistant',
        content: turn.content || null,
        ...(turn.toolCalls.length
          ? {
              tool_calls: turn.toolCalls.map((c) => ({
                id: c.id,
                type: 'function' as const,
                function: { name: c.name, arguments: c.arguments },
              })),
            }
          : {}),
      });
    }
    const parsed: ParsedActions = tools ? parseToolActions(turn) : parseXmlActions(turn.content);
    const results: string[] = [];
    for (const { action, toolCallId } of parsed.actions) {
      const result = action.type === 'finish' ? 'finished' : await runFileAction(files, action);
      if (action.type === 'finish') summary = action.summary.trim();
      if (toolCallId) chat.push({ role: 'tool', tool_call_id: toolCallId, content: result });
      else results.push(`<result of="${action.type}">\n${result}\n</result>`);
    }
    for (const id of parsed.unanswered ?? [])
      chat.push({
        role: 'tool',
        tool_call_id: id,
        content: 'Kiln System: invalid arguments; call the tool again with valid JSON and every required field.',
      });
    if (parsed.violation && !parsed.actions.length) {
      if (++violations > MAX_VIOLATIONS)
        throw new Error(`the reviewer broke the protocol ${violations} times in a row (${parsed.violation})`);
      if (!tools) results.push(`Kiln System: [Protocol Violation] ${parsed.violation}. ${FILE_TOOLS_XML}`);
    } else violations = 0;
    if (results.length && summary === undefined) chat.push({ role: 'user', content: results.join('\n\n') });
  }
  if (summary === undefined)
    throw new Error(`the review did not finish within ${MAX_REVIEW_STEPS} model calls; nothing was committed`);

  if (!files.changed().length)
    return done(deps, evo, { status: 'no_change', summary: summary || 'nothing worth keeping' }, session);
  const title = summary || `Review of session ${session.id}`;
  const outcome = await deps.workspaces.change(
    ws,
    { author: 'agent', sessionId: session.id, evolutionId: evo.id },
    (tree) => files.apply(tree),
    { summary: `Review: ${title}` },
  );
  if (!outcome.commit)
    return done(deps, evo, { status: 'no_change', summary: summary || 'the edits left every file as it was' }, session);
  const runId = await tellSession(deps, ws, session, model, evo, outcome.commit.sha, outcome.commit.paths, title);
  return done(
    deps,
    evo,
    { status: 'committed', sha: outcome.commit.sha, paths: outcome.commit.paths, summary: title, runId },
    session,
  );
}

async function done(
  deps: EvolutionDeps,
  evo: EvolutionRow,
  outcome: ReviewOutcome,
  session?: SessionRow,
): Promise<ReviewOutcome> {
  if (session && outcome.status !== 'skipped')
    await deps.db.update(sessions).set({ lastReviewedAt: new Date() }).where(eq(sessions.id, session.id));
  await endEvolution(deps.db, evo.id, {
    status: outcome.status,
    summary: outcome.summary,
    ...(outcome.status === 'committed'
      ? { commitSha: outcome.sha, changedPaths: outcome.paths, checks: { run_id: outcome.runId } }
      : {}),
  });
  return outcome;
}

/** A review's or dream's model call, counted for the workspace (no run of its own). */
export async function recordUsage(
  db: Db,
  ws: WorkspaceRow,
  model: string,
  u: { promptTokens: number; completionTokens: number },
): Promise<void> {
  await db.execute(insertUsage({ teamId: ws.teamId, workspaceId: ws.id, runId: null, model }, u));
}

/** The run that tells a session about a review is named after the evolution, so it is written once. */
const announcementRun = (evo: { id: string }) => `run_${evo.id.slice(evo.id.indexOf('_') + 1)}`;

/**
 * A review that committed but crashed before the session was told (or the record finished):
 * tell the session now, unless it already was, and finish the record.
 */
export async function finishCommittedReview(
  deps: EvolutionDeps,
  evo: EvolutionRow,
  commit: { sha: string; paths: string[]; summary: string },
): Promise<void> {
  const runId = announcementRun(evo);
  const [[told], [session], [ws]] = await Promise.all([
    deps.db.select({ id: runs.id }).from(runs).where(eq(runs.id, runId)),
    deps.db.select().from(sessions).where(eq(sessions.id, evo.sessionId!)),
    deps.db.select().from(workspaces).where(eq(workspaces.id, evo.workspaceId!)),
  ]);
  const summary = commit.summary.replace(/^Review: /, '');
  if (!told && session && ws)
    await tellSession(
      deps,
      ws as WorkspaceRow,
      session,
      deps.model.modelFor((ws as WorkspaceRow).settings.model) ?? 'unknown',
      evo,
      commit.sha,
      commit.paths,
      summary,
    );
  await done(deps, evo, { status: 'committed', sha: commit.sha, paths: commit.paths, summary, runId }, session);
}

/**
 * Tells the session what changed: a finished run of its own (trigger `review`) holding the
 * message and the `evolution.committed` event, written in one statement.
 */
async function tellSession(
  deps: EvolutionDeps,
  ws: WorkspaceRow,
  session: SessionRow,
  model: string,
  evo: EvolutionRow,
  sha: string,
  paths: string[],
  summary: string,
): Promise<string> {
  const runId = announcementRun(evo);
  const content =
    `I reviewed this conversation and improved the workspace: ${summary}\n` +
    `Changed: ${paths.join(', ')} (commit ${sha.slice(0, 12)}, evolution ${evo.id}). ` +
    'Ask me to undo that change if you do not want it.';
  const message = messageRow(session, runId, { role: 'assistant', content });
  const now = new Date().toISOString();
  const insertRun = sql`insert into runs (id, team_id, workspace_id, session_id, status, model, trigger, created_at, started_at, finished_at)
    values (${runId}, ${ws.teamId}, ${ws.id}, ${session.id}, 'completed', ${model}, 'review', ${now}::timestamptz, ${now}::timestamptz, ${now}::timestamptz)`;
  await deps.events.appendMany(
    runId,
    [
      ['run.created', { run_id: runId, session_id: session.id, model, trigger: 'review' }],
      ['evolution.committed', { evolution_id: evo.id, kind: 'review', commit: sha, paths, summary }],
      ['message.created', { id: message.id, role: 'assistant', content }],
      ['run.completed', { status: 'completed', error: null, steps: 0 }],
    ],
    [insertRun, insertMessage(message)],
  );
  return runId;
}
