import { auditRow, insertAudit } from '../audit/audit.ts';
import { EMPTY_TOOLSET, type McpClients, type ToolSet } from '../mcp/client.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import type { Resume } from './approvals.ts';
import { decideTool } from './policy.ts';
import type { Action } from './protocol.ts';
import type { RunWrites } from './run-writes.ts';
import * as tc from './tool-calls.ts';

/** What a run's MCP steps reach of their run's loop (run-loop.ts). */
interface McpStepContext {
  ws: WorkspaceRow;
  runId: string;
  teamId: string;
  signal: AbortSignal;
  writes: RunWrites;
  /** The client of workspaces' MCP servers; none: every call is refused. */
  mcp?: McpClients;
  /** Whether the session approves everything itself (`approve_session`), as it is now. */
  autoApprove(): boolean;
  /** Answers the model (a tool result, or a user message under XML). */
  reply(toolCallId: string | undefined, content: string): void;
  /** Pauses the run at this call until a person decides. */
  requestApproval(code: string, toolCallId: string | undefined): Promise<void>;
}

/**
 * The agent's calls of its workspace's MCP tools, for one run: the tools offered at each step, a
 * call checked and put under the approval policy (deny, ask: the run pauses, allow), made within
 * KILN_MCP_TIMEOUT_S, recorded (event and audit row) and answered.
 */
export class McpSteps {
  /** The tools offered in the current step (listed again, from a short cache, before every model call). */
  tools: ToolSet = EMPTY_TOOLSET;

  constructor(private readonly c: McpStepContext) {}

  /** The MCP tools of the workspace for this step (a server that fails is named in the prompt, not fatal). */
  async list(): Promise<void> {
    const { mcp, ws, signal } = this.c;
    this.tools = mcp && ws.settings.mcp_servers.length ? await mcp.toolsFor(ws, signal) : EMPTY_TOOLSET;
  }

  /**
   * A call of an MCP tool: refused at once when it cannot be made (unreadable, no such server or
   * tool), then the approval policy as for code. Returns true when the run paused for an approval.
   */
  async propose(action: Extract<Action, { type: 'tool' }>, toolCallId: string | undefined): Promise<boolean> {
    const { mcp, ws, writes } = this.c;
    const call = { server: action.server, tool: action.tool, arguments: action.arguments };
    const listed = this.tools.servers.find((s) => s.server === call.server);
    const problem =
      action.problem ??
      (!mcp
        ? 'this server has no MCP client'
        : !ws.settings.mcp_servers.some((s) => s.name === call.server)
          ? `this workspace has no MCP server named ${JSON.stringify(call.server)} (servers: ${ws.settings.mcp_servers.map((s) => s.name).join(', ') || 'none'})`
          : listed && !listed.error && !listed.tools.some((t) => t.name === call.tool)
            ? `the server ${call.server} has no tool ${JSON.stringify(call.tool)} (tools: ${listed.tools.map((t) => t.name).join(', ') || 'none'})`
            : undefined);
    if (problem) {
      this.c.reply(toolCallId, tc.TOOL_PROBLEM(call, problem));
      writes.writeBehind();
      return false;
    }
    const policy = decideTool(ws.settings.approval, call);
    const args = mcp ? await mcp.maskArguments(ws.id, call.arguments) : call.arguments;
    writes.emit('tool.call', { server: call.server, tool: call.tool, arguments: args, decision: policy.decision });
    if (policy.decision === 'deny') {
      this.c.reply(toolCallId, tc.TOOL_DENIED_BY_POLICY(policy.rule));
      writes.writeBehind();
      return false;
    }
    if (policy.decision === 'ask' && !this.c.autoApprove()) {
      await writes.flush();
      await this.c.requestApproval(tc.toolApprovalText(call), toolCallId);
      return true;
    }
    await this.run(call, toolCallId);
    return false;
  }

  /** A decided approval of a tool call: make it, unless a deny rule added meanwhile still wins; else tell the model why not. */
  async afterApproval(
    call: tc.ToolCallRequest,
    { approval, outcome }: Resume,
    toolCallId: string | undefined,
  ): Promise<void> {
    const { ws, writes } = this.c;
    const now = decideTool(ws.settings.approval, call);
    if (outcome === 'approved' && now.decision !== 'deny') return this.run(call, toolCallId);
    this.c.reply(
      toolCallId,
      outcome === 'approved'
        ? tc.TOOL_DENIED_BY_POLICY(now.rule)
        : outcome === 'denied'
          ? tc.TOOL_DENIED_BY_USER(approval.reason)
          : tc.TOOL_APPROVAL_EXPIRED(ws.settings.approval.timeout_s),
    );
    await writes.flush();
  }

  /** Makes the call (bounded by KILN_MCP_TIMEOUT_S), records it (event and audit row) and answers the model. */
  private async run(call: tc.ToolCallRequest, toolCallId: string | undefined): Promise<void> {
    const { mcp, ws, signal, writes } = this.c;
    if (signal.aborted) return;
    const outcome = mcp
      ? await mcp.call(ws, call, signal)
      : { text: '', isError: true, error: 'this server has no MCP client', truncated: false, durationMs: 0 };
    const result = {
      server: call.server,
      tool: call.tool,
      duration_ms: outcome.durationMs,
      error: outcome.error,
      is_error: outcome.isError,
      truncated: outcome.truncated,
    };
    writes.emit('tool.result', { ...result, content: outcome.text });
    const audit = auditRow(
      {
        action: 'agent.tool_call',
        resourceType: 'run',
        resourceId: this.c.runId,
        teamId: this.c.teamId,
        after: result,
      },
      undefined,
    );
    audit.actorRole = 'agent';
    writes.write(insertAudit(audit));
    this.c.reply(toolCallId, tc.toolFeedback(call, outcome));
    writes.writeBehind();
  }
}
