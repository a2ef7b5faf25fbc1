import { createHash } from 'node:crypto';
import { and, asc, eq, gte, inArray, isNull, sql } from 'drizzle-orm';
import { ModelError, type ChatMessage } from '../agent/llm.ts';
import { evolutions, messages, sessions } from '../db/schema/index.ts';
import { tag } from '../lib/text.ts';
import { memoryEntries } from '../memory/budget.ts';
import { LOG_LINE_RULES, toLogLines } from '../memory/chunker.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { endEvolution, type EvolutionRow } from '../evolution-log/evolutions.ts';
import { GuardedFiles, GuardError } from './guarded-files.ts';
import { recordUsage, type EvolutionDeps } from './review.ts';
import { renderSession } from './transcript.ts';

/** Marks which messages a daily log already holds, so none is written twice (even when a session spans days). */
const MARK = /<!-- kiln-logged: ([0-9a-f ]+) -->/g;

const DAILY_LOG_INSTRUCTIONS = `You write an AI agent's daily log from the day's conversations.
Reply with exactly:
<daily_log>
The day's log, under one "### " heading per session: what was asked, what was done, decisions, results,
problems, open tasks. Facts only, nothing the conversations do not show.
${LOG_LINE_RULES}
</daily_log>`;

const DREAM_INSTRUCTIONS = `You are the agent's memory, consolidating at night ("deep dream").
You get the current core memory (MEMORY.md) and the daily logs of the last days. Produce the new MEMORY.md:
- merge entries that say nearly the same thing into one denser entry;
- when a newer log contradicts an entry, the newer fact replaces the old one;
- drop entries that are stale, temporary, empty or covered by another entry;
- add what the logs show is worth keeping for good: preferences, decisions, rules, lessons, stable facts;
- never invent anything that neither the memory nor the logs say;
- every entry is one line starting with "- "; keep the title line; at most {max_entries} entries and {max_bytes} bytes.
Reply with exactly three sections:
<memory>
the complete new MEMORY.md
</memory>
<diary>
a short narrative of this consolidation: what you noticed, what you merged, replaced, dropped and added, and why
</diary>
<summary>one line for the evolution log</summary>`;

/** Calendar day of an instant in a time zone, as YYYY-MM-DD. */
export function dayIn(date: Date, timeZone: string): string {
  return new Intl.DateTimeFormat('en-CA', { timeZone, year: 'numeric', month: '2-digit', day: '2-digit' }).format(date);
}

const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const logPath = (day: string) => `memory/${day}.md`;

interface DreamResult {
  memory: string;
  diary: string;
  summary: string;
}

/** The model's consolidation, checked before anything is written: complete, non-empty and within the cap. */
function parseDream(reply: string, cap: { maxEntries: number; maxBytes: number }): DreamResult | { invalid: string } {
  const section = (name: string) => tag(reply, name) ?? undefined;
  const memory = section('memory');
  const diary = section('diary');
  if (memory === undefined) return { invalid: 'the reply has no complete <memory>…</memory> section (cut off?)' };
  if (diary === undefined) return { invalid: 'the reply has no complete <diary>…</diary> section (cut off?)' };
  const entries = memoryEntries(memory);
  if (!memory || entries.length === 0)
    return { invalid: 'the new MEMORY.md has no entries; an empty core memory is never written' };
  if (entries.length > cap.maxEntries)
    return { invalid: `the new MEMORY.md has ${entries.length} entries; the limit is ${cap.maxEntries}` };
  const bytes = Buffer.byteLength(`${memory}\n`);
  if (bytes > cap.maxBytes) return { invalid: `the new MEMORY.md is ${bytes} bytes; the limit is ${cap.maxBytes}` };
  if (!diary) return { invalid: 'the diary is empty' };
  return { memory: `${memory}\n`, diary, summary: section('summary') || 'Consolidated core memory' };
}

export type DreamOutcome =
  | { status: 'committed'; sha: string; paths: string[]; summary: string }
  | { status: 'skipped'; summary: string };

/**
 * Deep dream (nightly memory consolidation) for `days` calendar days ending today in the workspace's time
 * zone: (1) the sessions' context not yet in a daily log is summarised into memory/YYYY-MM-DD.md,
 * each message once (hash marks); (2) MEMORY.md is distilled with those logs by the model, its
 * answer validated before anything is written; (3) a diary goes to memory/dreams/. One commit.
 * Nothing new since the last dream: skipped, and said so.
 */
export async function runDream(
  deps: EvolutionDeps,
  evo: EvolutionRow,
  ws: WorkspaceRow,
  days: number,
  signal: AbortSignal,
): Promise<DreamOutcome> {
  const { db } = deps;
  const ev = ws.settings.evolution;
  const cap = { maxEntries: ev.memory_max_entries, maxBytes: ev.memory_max_bytes };
  const model = deps.model.modelFor(ws.settings.model);
  if (!model) throw new ModelError('model_not_configured', 'no model is configured for this workspace');
  const now = new Date();
  const window = Array.from({ length: days }, (_, i) =>
    dayIn(new Date(now.getTime() - i * 86_400_000), ev.timezone),
  ).reverse();
  const files = new GuardedFiles(deps.workspaces.reader(ws.id), { maxFileBytes: deps.maxFileBytes, budget: cap });
  const ask = async (messages: ChatMessage[]) => {
    const turn = await deps.model.complete({ model, messages, signal });
    await recordUsage(db, ws, model, turn.usage);
    return turn.content;
  };

  // (1) The day's unsummarised context into the daily logs, each message once.
  const logged = await loggedMarks(files);
  const since = new Date(now.getTime() - (days + 1) * 86_400_000);
  const rows = await db
    .select({ m: messages })
    .from(messages)
    .innerJoin(sessions, eq(sessions.id, messages.sessionId))
    .where(
      and(
        eq(sessions.workspaceId, ws.id),
        isNull(messages.summarizedAt),
        gte(messages.createdAt, since),
        inArray(messages.role, ['user', 'assistant', 'tool']),
      ),
    )
    .orderBy(asc(messages.id));
  const fresh = new Map<string, (typeof rows)[number]['m'][]>();
  for (const { m } of rows) {
    const day = dayIn(m.createdAt, ev.timezone);
    const mark = markOf(m.sessionId, m.contentHash);
    if (!window.includes(day) || logged.has(mark)) continue;
    fresh.set(day, [...(fresh.get(day) ?? []), m]);
  }
  let loggedMessages = 0;
  for (const [day, list] of fresh) {
    const bySession = new Map<string, typeof list>();
    for (const m of list) bySession.set(m.sessionId, [...(bySession.get(m.sessionId) ?? []), m]);
    const text = [...bySession]
      .map(([id, ms]) => `<Session id="${id}">\n${renderSession(ms, { perMessage: 2000, total: 60_000 })}\n</Session>`)
      .join('\n\n');
    const reply = await ask([
      { role: 'system', content: DAILY_LOG_INSTRUCTIONS },
      { role: 'user', content: `Conversations of ${day}:\n\n${text}` },
    ]);
    const log = toLogLines(/<daily_log>([\s\S]*?)<\/daily_log>/i.exec(reply)?.[1]?.trim() ?? '');
    if (!log) throw new Error(`the daily log for ${day} came back empty or malformed; nothing was written`);
    const existing = (await files.read(logPath(day))) ?? `# ${day}\n`;
    const marks = list.map((m) => markOf(m.sessionId, m.contentHash)).join(' ');
    await files.write(
      logPath(day),
      `${existing.trimEnd()}\n\n## Sessions of the day (dream)\n\n${log}\n<!-- kiln-logged: ${marks} -->\n`,
    );
    loggedMessages += list.length;
  }

  // (2) Distil MEMORY.md with the window's logs — unless nothing changed since the last dream.
  const logs = (await Promise.all(window.map(async (day) => ({ day, text: await files.read(logPath(day)) })))).filter(
    (l): l is { day: string; text: string } => Boolean(l.text?.trim()),
  );
  const memory = (await files.read('MEMORY.md')) ?? '';
  const inputHash = sha(JSON.stringify([memory, logs]));
  if (!logs.length) return skip(deps, evo, `no daily log for ${window.join(', ')}: nothing to consolidate`, inputHash);
  const [last] = await db
    .select({ checks: evolutions.checks })
    .from(evolutions)
    .where(
      and(
        eq(evolutions.workspaceId, ws.id),
        eq(evolutions.kind, 'dream'),
        inArray(evolutions.status, ['committed', 'skipped']),
      ),
    )
    .orderBy(sql`${evolutions.finishedAt} desc nulls last`)
    .limit(1);
  if ((last?.checks as { input_hash?: string } | null)?.input_hash === inputHash) {
    return skip(deps, evo, 'nothing new since the last dream: the memory and the daily logs are unchanged', inputHash);
  }
  const instructions = DREAM_INSTRUCTIONS.replace('{max_entries}', String(cap.maxEntries)).replace(
    '{max_bytes}',
    String(cap.maxBytes),
  );
  const chat: ChatMessage[] = [
    { role: 'system', content: instructions },
    {
      role: 'user',
      content: `<Core_Memory>\n${memory.trim()}\n</Core_Memory>\n\n${logs.map((l) => `<Daily_Log day="${l.day}">\n${l.text.replace(MARK, '').trim()}\n</Daily_Log>`).join('\n\n')}`,
    },
  ];
  let result = parseDream(await ask(chat), cap);
  if ('invalid' in result) {
    // One more try, told exactly what was wrong; a second bad answer fails the dream and writes nothing.
    chat.push({
      role: 'user',
      content: `Kiln System: that answer was not used: ${result.invalid}. Reply again with all three sections.`,
    });
    result = parseDream(await ask(chat), cap);
    if ('invalid' in result) throw new InvalidDream(result.invalid);
  }
  try {
    if (result.memory !== memory) await files.write('MEMORY.md', result.memory);
    const today = window.at(-1)!;
    const diaryPath = `memory/dreams/${today}.md`;
    const previous = (await files.read(diaryPath)) ?? `# Dream of ${today}\n`;
    await files.write(
      diaryPath,
      `${previous.trimEnd()}\n\n## ${new Date().toISOString().slice(11, 16)} UTC\n\n${result.diary}\n`,
    );
  } catch (err) {
    if (err instanceof GuardError) throw new InvalidDream(err.message);
    throw err;
  }
  const outcome = await deps.workspaces.change(
    ws,
    { author: 'agent', evolutionId: evo.id },
    (tree) => files.apply(tree),
    { summary: `Dream: ${result.summary}` },
  );
  if (!outcome.commit) return skip(deps, evo, 'the dream changed nothing', inputHash);
  await endEvolution(db, evo.id, {
    status: 'committed',
    summary: result.summary,
    commitSha: outcome.commit.sha,
    changedPaths: outcome.commit.paths,
    diary: result.diary,
    // The next dream compares its inputs with this: the memory as it is now, and the same logs.
    checks: { input_hash: sha(JSON.stringify([result.memory, logs])), days: window, logged_messages: loggedMessages },
  });
  return { status: 'committed', sha: outcome.commit.sha, paths: outcome.commit.paths, summary: result.summary };
}

/** A model answer that failed validation twice: the dream fails for good (a retry would not help). */
export class InvalidDream extends Error {}

const markOf = (sessionId: string, contentHash: string) => sha(`${sessionId}\n${contentHash}`).slice(0, 16);

/** Every message mark in the daily logs (all days: a message is logged once, whatever day it is seen again). */
async function loggedMarks(files: GuardedFiles): Promise<Set<string>> {
  const out = new Set<string>();
  for (const path of await files.list('memory')) {
    if (!/^memory\/\d{4}-\d{2}-\d{2}\.md$/.test(path)) continue;
    for (const m of ((await files.read(path)) ?? '').matchAll(MARK))
      for (const h of m[1]!.trim().split(/\s+/)) out.add(h);
  }
  return out;
}

async function skip(deps: EvolutionDeps, evo: EvolutionRow, summary: string, inputHash: string): Promise<DreamOutcome> {
  await endEvolution(deps.db, evo.id, { status: 'skipped', summary, checks: { input_hash: inputHash } });
  return { status: 'skipped', summary };
}
