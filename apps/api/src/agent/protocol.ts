import type { ChatCompletionTool } from 'openai/resources/chat/completions';
import type { ToolCall } from './llm.ts';
import { SOURCE_UPDATE_TOOL } from './source-update.ts';
import type { McpTool } from '../mcp/client.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';
import { tag, withoutBlock } from '../lib/text.ts';

export type Action =
  | { type: 'python'; code: string }
  | { type: 'memory_search'; query: string; path?: string; since?: string; until?: string }
  | { type: 'finish'; summary: string }
  | { type: 'source_update'; patch: string; reason: string }
  | { type: 'undo_evolution'; evolutionId: string }
  /** A tool of one of the workspace's MCP servers; `problem`: the call could not be read (told to the model). */
  | { type: 'tool'; server: string; tool: string; arguments: Record<string, unknown>; problem?: string };

export interface Parsed {
  thinking: string | null;
  action: Action | null;
}

/** Code inside <python> may still be wrapped in a Markdown fence; take the code only. */
const unfence = (code: string) => /^```(?:python|py)?\s*\n([\s\S]*?)\n?```\s*$/i.exec(code.trim())?.[1] ?? code;

const unfenceDiff = (patch: string) => /^```(?:diff|patch)?\s*\n([\s\S]*?)\n?```\s*$/i.exec(patch.trim())?.[1] ?? patch;

/** Read first: a patch may itself contain the other tags. */
function parseSourceUpdate(reply: string): Action | null {
  const block = tag(reply, 'propose_source_update');
  if (block === null) return null;
  const patch = unfenceDiff(tag(block, 'patch') ?? '').trim();
  return { type: 'source_update', patch: patch ? `${patch}\n` : '', reason: tag(block, 'reason') ?? '' };
}

/** A tool call's arguments: one JSON object (empty: none), or why not. */
function toolArguments(text: string): { arguments: Record<string, unknown>; problem?: string } {
  if (!text.trim()) return { arguments: {} };
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { arguments: {}, problem: `the arguments are not valid JSON (${(err as Error).message.slice(0, 200)})` };
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    return { arguments: {}, problem: 'the arguments must be one JSON object, e.g. {"key": "value"}' };
  return { arguments: value as Record<string, unknown> };
}

/**
 * `<tool name="server.tool">{json}</tool>`: the first such tag, read with plain searches (the reply
 * is the model's). A tag without a `server.tool` name or with arguments that are not one JSON
 * object is still a tool action, with the problem to tell the model.
 */
function parseToolTag(reply: string): Action | null {
  const lower = reply.toLowerCase();
  const at = lower.indexOf('<tool');
  if (at < 0) return null;
  const close = reply.indexOf('>', at);
  const end = lower.indexOf('</tool>', close);
  if (close < 0 || end < 0) return null;
  const head = reply.slice(at + 5, close);
  if (head && !/^\s/.test(head)) return null;
  const name = /^\s*name\s*=\s*(?:"([^"]*)"|'([^']*)')\s*\/?$/.exec(head);
  const full = name ? (name[1] ?? name[2] ?? '') : '';
  const dot = full.indexOf('.');
  const [server, tool] = dot > 0 ? [full.slice(0, dot), full.slice(dot + 1)] : ['', ''];
  const args = toolArguments(reply.slice(close + 1, end));
  const problem =
    !server || !tool
      ? 'a <tool> tag needs name="server.tool", e.g. <tool name="github.create_issue">{"title": "…"}</tool>'
      : args.problem;
  return { type: 'tool', server, tool, arguments: args.arguments, ...(problem ? { problem } : {}) };
}

/** The XML protocol: <thinking>, then one of <python>, <tool>, <memory_search>, <undo_evolution>, <finish> (or <propose_source_update>). */
export function parseXml(reply: string): Parsed {
  const update = parseSourceUpdate(reply);
  if (update) return { thinking: tag(withoutBlock(reply, 'propose_source_update'), 'thinking'), action: update };
  const thinking = tag(reply, 'thinking');
  const finish = tag(reply, 'finish');
  const python = tag(reply, 'python');
  const search = tag(reply, 'memory_search');
  const undo = tag(reply, 'undo_evolution');
  let action: Action | null = null;
  if (finish !== null) action = { type: 'finish', summary: finish };
  else if (python) action = { type: 'python', code: unfence(python) };
  else
    action =
      parseToolTag(reply) ??
      (search ? { type: 'memory_search', query: search } : undo ? { type: 'undo_evolution', evolutionId: undo } : null);
  return { thinking, action };
}

export const XML_CORRECTION =
  'Kiln System: [Protocol Violation] Your reply has no action tag. Reply with <thinking>…</thinking> followed by exactly one of ' +
  '<python>code</python>, <tool name="server.tool">{json arguments}</tool> (when MCP tools are listed), <memory_search>query</memory_search>, <undo_evolution>evolution id</undo_evolution> or <finish>summary</finish>. Try again.';

export const TOOLS: ChatCompletionTool[] = [
  {
    type: 'function',
    function: {
      name: 'python',
      description:
        'Run Python in the session sandbox (variables persist between calls). Returns stdout, stderr and any error.',
      parameters: {
        type: 'object',
        properties: { code: { type: 'string', description: 'The Python code to run' } },
        required: ['code'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'memory_search',
      description:
        'Search core memory, the daily logs of every past day, knowledge pages and skills. Returns the best-matching lines with their file, line numbers and date.',
      parameters: {
        type: 'object',
        properties: {
          query: {
            type: 'string',
            description: 'The words to look for: names, things, identifiers (not a whole question)',
          },
          path: {
            type: 'string',
            description: 'Optional: only files under this path, e.g. memory/ (daily logs), knowledge/, skills/',
          },
          since: { type: 'string', description: 'Optional: only daily logs of this day or later (YYYY-MM-DD)' },
          until: { type: 'string', description: 'Optional: only daily logs of this day or earlier (YYYY-MM-DD)' },
        },
        required: ['query'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'undo_evolution',
      description:
        'Undo a change self-evolution made to the workspace (a review or dream), by its evolution id, when the user asks for it.',
      parameters: { type: 'object', properties: { evolution_id: { type: 'string' } }, required: ['evolution_id'] },
    },
  },
  {
    type: 'function',
    function: {
      name: 'finish',
      description: 'End the task with a short summary for the user.',
      parameters: { type: 'object', properties: { summary: { type: 'string' } }, required: ['summary'] },
    },
  },
];

/** The function tool of an MCP server's tool (its name, description and schema already bounded). */
const mcpFunction = (t: McpTool): ChatCompletionTool => ({
  type: 'function',
  function: {
    name: t.native,
    description: `[MCP server ${t.server}, tool ${t.name}] ${t.description}`.trim(),
    parameters: t.schema,
  },
});

/** The tools offered to the model: `propose_source_update` only where an org admin enabled it, then the MCP servers' tools. */
export const toolsFor = (settings: WorkspaceSettings, mcp: McpTool[] = []): ChatCompletionTool[] => [
  ...(settings.source_updates ? [...TOOLS, SOURCE_UPDATE_TOOL] : TOOLS),
  ...mcp.map(mcpFunction),
];

/** One tool call of a model message: the action it asks for, or why it cannot be carried out. */
export type Call = { toolCallId: string; action: Action } | { toolCallId: string; violation: string };

/**
 * Native tool calling: each tool call of a message is an action of its own (a message may hold
 * several: OpenAI-compatible models call tools in parallel by default). Arguments that are not
 * valid JSON, an unknown tool or a missing argument are a protocol violation of that call only.
 */
export function parseToolCall(call: ToolCall, mcp: McpTool[] = []): Call {
  const toolCallId = call.id;
  if (call.name.includes('__')) {
    const tool = mcp.find((t) => t.native === call.name);
    if (!tool) return { violation: `unknown tool ${call.name} (not among the MCP tools offered now)`, toolCallId };
    const args = toolArguments(call.arguments);
    const action = { type: 'tool' as const, server: tool.server, tool: tool.name, arguments: args.arguments };
    return { action: args.problem ? { ...action, problem: args.problem } : action, toolCallId };
  }
  let args: Record<string, unknown>;
  try {
    args = JSON.parse(call.arguments || '{}') as Record<string, unknown>;
  } catch {
    return { violation: `the arguments of ${call.name} are not valid JSON`, toolCallId };
  }
  const str = (k: string) => (typeof args[k] === 'string' ? (args[k] as string) : '');
  if (call.name === 'python' && str('code')) return { action: { type: 'python', code: str('code') }, toolCallId };
  if (call.name === 'memory_search' && str('query')) {
    const opt = (k: string) => (str(k) ? { [k]: str(k) } : {});
    return {
      action: { type: 'memory_search', query: str('query'), ...opt('path'), ...opt('since'), ...opt('until') },
      toolCallId,
    };
  }
  if (call.name === 'propose_source_update')
    return { action: { type: 'source_update', patch: str('patch'), reason: str('reason') }, toolCallId };
  if (call.name === 'undo_evolution' && str('evolution_id'))
    return { action: { type: 'undo_evolution', evolutionId: str('evolution_id') }, toolCallId };
  if (call.name === 'finish') return { action: { type: 'finish', summary: str('summary') }, toolCallId };
  return { violation: `unknown tool ${call.name} or missing arguments`, toolCallId };
}

export const TOOL_CORRECTION = (violation: string) =>
  `Kiln System: [Protocol Violation] ${violation}. Call the tool again with valid JSON arguments.`;
