import type { ChatCompletionTool } from 'openai/resources/chat/completions';
import type { ModelTurn } from '../agent/llm.ts';
import { ApiError } from '../lib/errors.ts';
import { GuardError, type GuardedFiles } from './guarded-files.ts';

/** What a review may do: read and list workspace files, write or delete the ones the guard allows, finish. */
export type FileAction =
  | { type: 'read_file'; path: string }
  | { type: 'list_files'; path: string }
  | { type: 'write_file'; path: string; content: string }
  | { type: 'delete_file'; path: string }
  | { type: 'finish'; summary: string };

export interface ParsedActions {
  actions: { action: FileAction; toolCallId?: string }[];
  /** Set when the reply could not be understood; the model is told and tries again. */
  violation?: string;
  /** Tool calls that were malformed still need an answer under tool calling. */
  unanswered?: string[];
}

const str = { type: 'string' } as const;
const fn = (
  name: string,
  description: string,
  properties: Record<string, object>,
  required: string[],
): ChatCompletionTool => ({
  type: 'function',
  function: { name, description, parameters: { type: 'object', properties, required } },
});

export const FILE_TOOLS: ChatCompletionTool[] = [
  fn('read_file', 'Read a workspace file (relative path, e.g. skills/report/SKILL.md).', { path: str }, ['path']),
  fn('list_files', 'List the files under a workspace directory ("" for all).', { path: str }, ['path']),
  fn(
    'write_file',
    'Create or replace a file in MEMORY.md, memory/, skills/, knowledge/ or a prompt file.',
    { path: str, content: str },
    ['path', 'content'],
  ),
  fn('delete_file', 'Delete a file you may write.', { path: str }, ['path']),
  fn(
    'finish',
    'End: a one-line summary of what you changed, or empty when nothing was worth changing.',
    { summary: str },
    ['summary'],
  ),
];

export const FILE_TOOLS_XML = `Act with these tags (several per reply are fine; they run in order):
<read_file>relative/path</read_file>
<list_files>directory</list_files>
<write_file path="relative/path">
the complete new content
</write_file>
<delete_file>relative/path</delete_file>
<finish>one line: what you changed, or empty when nothing was worth changing</finish>
You get the results of reads and writes in the next message. End with <finish>.`;

const TAGS =
  /<(read_file|list_files|delete_file|finish)>([\s\S]*?)<\/\1>|<write_file\s+path="([^"]*)"\s*>\n?([\s\S]*?)\n?<\/write_file>|<(finish|list_files)\s*\/>/g;

export function parseXmlActions(reply: string): ParsedActions {
  const actions: ParsedActions['actions'] = [];
  for (const m of reply.matchAll(TAGS)) {
    if (m[3] !== undefined) actions.push({ action: { type: 'write_file', path: m[3], content: m[4] ?? '' } });
    else if (m[5])
      actions.push({ action: m[5] === 'finish' ? { type: 'finish', summary: '' } : { type: 'list_files', path: '' } });
    else {
      const body = (m[2] ?? '').trim();
      const name = m[1] as 'read_file' | 'list_files' | 'delete_file' | 'finish';
      actions.push({ action: name === 'finish' ? { type: 'finish', summary: body } : { type: name, path: body } });
    }
  }
  if (!actions.length) return { actions, violation: 'no action tag' };
  return { actions };
}

export function parseToolActions(turn: ModelTurn): ParsedActions {
  if (!turn.toolCalls.length) return { actions: [{ action: { type: 'finish', summary: turn.content.trim() } }] };
  const actions: ParsedActions['actions'] = [];
  const unanswered: string[] = [];
  for (const call of turn.toolCalls) {
    let args: Record<string, unknown>;
    try {
      args = JSON.parse(call.arguments || '{}') as Record<string, unknown>;
    } catch {
      unanswered.push(call.id);
      continue;
    }
    const s = (k: string) => (typeof args[k] === 'string' ? (args[k] as string) : undefined);
    const path = s('path');
    let action: FileAction | undefined;
    if (call.name === 'finish') action = { type: 'finish', summary: s('summary') ?? '' };
    else if (call.name === 'write_file' && path !== undefined && s('content') !== undefined)
      action = { type: 'write_file', path, content: s('content')! };
    else if (
      (call.name === 'read_file' || call.name === 'list_files' || call.name === 'delete_file') &&
      path !== undefined
    )
      action = { type: call.name, path };
    if (action) actions.push({ action, toolCallId: call.id });
    else unanswered.push(call.id);
  }
  return unanswered.length
    ? { actions, unanswered, violation: 'a tool call had arguments that are not valid JSON or miss a field' }
    : { actions };
}

/** Carries out one file action against the guarded files; what to tell the model. */
export async function runFileAction(files: GuardedFiles, a: Exclude<FileAction, { type: 'finish' }>): Promise<string> {
  try {
    switch (a.type) {
      case 'read_file': {
        const text = await files.read(a.path);
        return text === null ? `${a.path}: no such file` : `${a.path}:\n${text}`;
      }
      case 'list_files': {
        const list = await files.list(a.path);
        return list.length ? list.join('\n') : '(no files)';
      }
      case 'write_file':
        return `wrote ${await files.write(a.path, a.content)} (committed when you finish)`;
      case 'delete_file':
        return `deleted ${await files.delete(a.path)} (committed when you finish)`;
    }
  } catch (err) {
    // The guard's refusals and the repository's own path checks (links out of the workspace).
    if (err instanceof GuardError || err instanceof ApiError) return `refused: ${err.message}`;
    throw err;
  }
}
