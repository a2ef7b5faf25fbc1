/**
 * Calls of MCP tools as the run sees them: what a paused call's approval stores (and reads back
 * once decided), and what the model is told about a call.
 */
import type { CallOutcome } from '../mcp/client.ts';

export interface ToolCallRequest {
  server: string;
  tool: string;
  arguments: Record<string, unknown>;
}

/**
 * The first line of an approval for a tool call. It is not Python (a run of it is a SyntaxError),
 * and code that starts with it is refused before the policy sees it (`isToolApprovalText`), so a
 * decided approval with it can only be a tool call's.
 */
const PREFIX = 'Kiln MCP tool call: ';

/** What the approval shows the person (and stores): the tool, then its arguments exactly as they will be sent. */
export const toolApprovalText = (c: ToolCallRequest) =>
  `${PREFIX}${c.server}.${c.tool}\nArguments:\n${JSON.stringify(c.arguments, null, 2)}`;

export const isToolApprovalText = (text: string) => text.startsWith(PREFIX);

export function fromToolApprovalText(text: string): ToolCallRequest | null {
  if (!isToolApprovalText(text)) return null;
  const nl = text.indexOf('\n');
  const name = text.slice(PREFIX.length, nl);
  const dot = name.indexOf('.');
  const body = text.slice(text.indexOf('\n', nl + 1) + 1);
  try {
    return { server: name.slice(0, dot), tool: name.slice(dot + 1), arguments: JSON.parse(body) };
  } catch {
    return null;
  }
}

export const toolFeedback = (c: ToolCallRequest, o: CallOutcome) =>
  o.error
    ? `Kiln System: [Tool Error] ${c.server}.${c.tool} gave no result: ${o.error}. Do not wait for it: try another way, or finish and say what failed.`
    : `Kiln System: [Tool Result${o.isError ? ': the tool reported an error' : ''}] ${c.server}.${c.tool}\n${o.text}`;

export const TOOL_PROBLEM = (c: { server: string; tool: string }, problem: string) =>
  `Kiln System: [Tool Error] ${c.server && c.tool ? `${c.server}.${c.tool}` : 'the tool call'} was not made: ${problem}. Call it again with valid arguments.`;

export const TOOL_DENIED_BY_POLICY = (rule?: string) =>
  `Kiln System: [Denied by policy] This tool call was not made: the workspace's approval policy does not allow it${rule ? ` (rule ${JSON.stringify(rule)})` : ''}. Find another way, or finish and explain what you need.`;

export const TOOL_DENIED_BY_USER = (reason?: string | null) =>
  `Kiln System: [User Denied] A person refused this tool call${reason ? `: ${reason}` : ''}. It was not made. Reconsider your approach and confirm the next step with the user.`;

export const TOOL_APPROVAL_EXPIRED = (seconds: number) =>
  `Kiln System: [Approval Expired] Nobody decided within ${seconds} s, so the tool call was not made. This was not a refusal: nobody answered. Finish and tell the user what is waiting for approval, or try a step that needs none.`;

export const NOT_PYTHON =
  'Kiln System: [Not run] This is not Python: code may not start with the text Kiln uses for tool-call approvals. Call the tool with <tool name="server.tool">{…}</tool> (or its function) instead.';
