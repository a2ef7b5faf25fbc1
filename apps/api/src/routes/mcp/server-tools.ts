import type { CallToolResult, McpServer, ServerContext } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { RunEvent, RunEventLog } from '../../agent/events.ts';
import { type KilnApi, type Page, ToolFailure, type WorkspaceRef } from './server-api.ts';

/** The most characters any one text field of a tool's answer carries (the rest is cut, and said so). */
const MAX_TEXT = 64 * 1024;
/** The most directory entries, commits, hits or artifacts an answer lists. */
const MAX_ITEMS = 500;
/** How long ask_agent follows a run before it answers with the run still going (its id, to follow by the API). */
const ASK_AGENT_WAIT_MS = 10 * 60_000;

const STOPS = new Set(['run.completed', 'run.failed', 'run.cancelled', 'run.requires_action']);

const workspaceArg = z
  .string()
  .trim()
  .min(1)
  .max(100)
  .describe('The workspace: its id (ws_…) or its name, in the team of the key');
const sessionArg = z
  .string()
  .regex(/^ses_[0-9a-z]{1,60}$/, 'must be a session id (ses_…)')
  .optional()
  .describe('A session of that workspace to continue (its id, ses_…); omitted: a new session, whose id is returned');
const pathArg = z
  .string()
  .min(1)
  .max(1024)
  .describe('A path relative to the workspace root, e.g. MEMORY.md or knowledge/notes.md');

/** Cuts `text` to `max` characters. */
function clip(text: string, max = MAX_TEXT): { text: string; cut: boolean } {
  return text.length > max ? { text: text.slice(0, max), cut: true } : { text, cut: false };
}

const answer = (value: Record<string, unknown>): CallToolResult => ({
  content: [{ type: 'text', text: JSON.stringify(value) }],
  structuredContent: value,
});

/** What a tool says when it fails: the envelope's code and message, never a protocol error. */
function failure(err: unknown, log: (err: unknown) => void): CallToolResult {
  let text: string;
  if (err instanceof ToolFailure) text = err.message;
  else {
    log(err);
    text = 'internal: the tool failed unexpectedly; the server logged why';
  }
  return { content: [{ type: 'text', text }], isError: true };
}

interface Session {
  id: string;
  workspace_id: string;
}

/** The session to use: the caller's, checked to be in that workspace (404 otherwise), or a new one. */
async function sessionFor(api: KilnApi, ws: WorkspaceRef, session: string | undefined, title: string) {
  if (!session) return (await api.call<Session>('POST', `/v1/workspaces/${ws.id}/sessions`, { json: { title } })).id;
  const s = await api.call<Session>('GET', `/v1/sessions/${session}`);
  if (s.workspace_id !== ws.id) throw new ToolFailure('not_found', `session ${session} is not in workspace ${ws.id}`);
  return s.id;
}

/**
 * Runs `fn` in the session to use; a session started for it is ended again when `fn` fails, so
 * a refused call leaves no empty session behind.
 */
async function inSession<T>(
  api: KilnApi,
  ws: WorkspaceRef,
  session: string | undefined,
  title: string,
  fn: (sessionId: string) => Promise<T>,
): Promise<T> {
  const id = await sessionFor(api, ws, session, title);
  try {
    return await fn(id);
  } catch (err) {
    if (!session) await api.call('DELETE', `/v1/sessions/${id}`).catch(() => undefined);
    throw err;
  }
}

/**
 * Ends the sandbox a call without a session ran in, so that it stops counting against the team's
 * sandboxes when the call returns (the session stays, to be passed back). Should that fail for
 * another reason than the sandbox being gone already, the session is ended, which ends its sandbox.
 */
async function endSandbox(api: KilnApi, sessionId: string, sandboxId: string): Promise<void> {
  await api.call('DELETE', `/v1/sandboxes/${sandboxId}`).catch(async (err) => {
    if (err instanceof ToolFailure && err.code === 'not_found') return;
    await api.call('DELETE', `/v1/sessions/${sessionId}`);
  });
}

const filesPath = (ws: WorkspaceRef, path: string) => `/v1/workspaces/${ws.id}/files?${new URLSearchParams({ path })}`;

interface ExecAnswer {
  stdout: string;
  stderr: string;
  error?: { type: string; message: string; traceback?: string };
  exit_code: number;
  truncated: boolean;
  restarted: boolean;
  execution_id: string;
  sandbox_id: string;
  artifacts: { name: string; mime: string; base64: string }[];
  workspace: { commit: { sha: string } | null } | null;
}

interface Commit {
  sha: string;
  author: string;
  summary: string;
  paths: string[];
  run_id: string | null;
  created_at: string;
}

interface FileAnswer {
  path: string;
  type: 'file' | 'dir';
  size?: number;
  encoding?: 'utf-8' | 'base64';
  content?: string;
  entries?: { name: string; path: string; type: 'file' | 'dir'; size: number }[];
}

/**
 * Follows a run's events from its start until it ends or pauses, the client gives up (`signal`),
 * or `maxMs` passes: the events seen, and whether the run stopped.
 */
function followRun(events: RunEventLog, runId: string, signal: AbortSignal, maxMs: number) {
  const seen: RunEvent[] = [];
  const stop = new AbortController();
  return new Promise<{ seen: RunEvent[]; stopped: boolean }>((resolve, reject) => {
    let settled = false;
    const settle = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      stop.abort();
      fn();
    };
    const timer = setTimeout(() => settle(() => resolve({ seen, stopped: false })), maxMs);
    timer.unref();
    signal.addEventListener('abort', () => settle(() => resolve({ seen, stopped: false })), { once: true });
    events
      .follow(
        runId,
        0,
        (ev) => {
          seen.push(ev);
          if (STOPS.has(ev.event)) settle(() => resolve({ seen, stopped: true }));
        },
        stop.signal,
      )
      .catch((err) => settle(() => reject(err)));
  });
}

export interface ToolDeps {
  api: KilnApi;
  events: RunEventLog;
  /** Logs an unexpected failure (with the request's id). */
  logError: (err: unknown, tool: string) => void;
  /** How long ask_agent waits for a run (default ASK_AGENT_WAIT_MS). */
  askAgentWaitMs?: number;
}

/** Registers Kiln's tools on one request's server; each calls the caller's API. */
export function registerTools(server: McpServer, deps: ToolDeps): void {
  const { api } = deps;
  const wrap =
    <A>(tool: string, fn: (args: A, ctx: ServerContext) => Promise<Record<string, unknown>>) =>
    async (args: A, ctx: ServerContext): Promise<CallToolResult> => {
      try {
        return answer(await fn(args, ctx));
      } catch (err) {
        return failure(err, (e) => deps.logError(e, tool));
      }
    };
  const read = { readOnlyHint: true, destructiveHint: false, openWorldHint: false };
  const write = { readOnlyHint: false, openWorldHint: false };
  const kit: Kit = { server, api, deps, wrap, read, write };
  for (const register of [
    toolRunPython,
    toolListFiles,
    toolReadFile,
    toolWriteFile,
    toolMemorySearch,
    toolListCommits,
    toolRevertCommit,
    toolAskAgent,
  ])
    register(kit);
}

/** What each tool's registration reaches: the request's server, the caller's API, and the shared wrappers. */
interface Kit {
  server: McpServer;
  api: KilnApi;
  deps: ToolDeps;
  wrap: <A>(
    tool: string,
    fn: (args: A, ctx: ServerContext) => Promise<Record<string, unknown>>,
  ) => (args: A, ctx: ServerContext) => Promise<CallToolResult>;
  read: { readOnlyHint: boolean; destructiveHint: boolean; openWorldHint: boolean };
  write: { readOnlyHint: boolean; openWorldHint: boolean };
}

function toolRunPython({ server, api, wrap, write }: Kit): void {
  server.registerTool(
    'run_python',
    {
      title: 'Run Python in a workspace sandbox',
      description:
        'Runs Python in a session of the workspace: a stateful interpreter (variables, imports and files in /tmp ' +
        'are kept between calls with the same session) whose /workspace is the workspace; changes it makes there ' +
        'are committed. The value of a last bare expression is printed to stdout. Without `session` the call runs ' +
        'in a new session whose interpreter ends with the call; pass the returned session_id back as `session` ' +
        'to go on in that session, whose interpreter is then kept between calls.',
      inputSchema: z.object({
        workspace: workspaceArg,
        session: sessionArg,
        code: z.string().min(1).max(1_000_000).describe('Python source to run'),
      }),
      annotations: { ...write, destructiveHint: true },
    },
    wrap('run_python', async ({ workspace, session, code }) => {
      const ws = await api.workspace(workspace);
      const { sessionId, r } = await inSession(api, ws, session, 'MCP run_python', async (sessionId) => ({
        sessionId,
        r: await api.call<ExecAnswer>('POST', `/v1/sessions/${sessionId}/exec`, { json: { code } }),
      }));
      // A failed call ended its new session (inSession); a call that ran ends its sandbox here.
      if (!session) await endSandbox(api, sessionId, r.sandbox_id);
      const stdout = clip(r.stdout);
      const stderr = clip(r.stderr);
      return {
        workspace_id: ws.id,
        session_id: sessionId,
        execution_id: r.execution_id,
        stdout: stdout.text,
        stderr: stderr.text,
        error: r.error ? { ...r.error, traceback: r.error.traceback && clip(r.error.traceback).text } : null,
        exit_code: r.exit_code,
        truncated: r.truncated || stdout.cut || stderr.cut,
        restarted: r.restarted,
        artifacts: r.artifacts
          .slice(0, MAX_ITEMS)
          .map((a) => ({ name: a.name, mime: a.mime, bytes: Math.floor((a.base64.length * 3) / 4) })),
        commit: r.workspace?.commit?.sha ?? null,
      };
    }),
  );
}

function toolListFiles({ server, api, wrap, read }: Kit): void {
  server.registerTool(
    'list_files',
    {
      title: 'List a workspace directory',
      description: 'The entries of a directory of the workspace (its root when `path` is omitted).',
      inputSchema: z.object({
        workspace: workspaceArg,
        path: pathArg.optional().describe('A directory relative to the workspace root; omitted: the root'),
      }),
      annotations: read,
    },
    wrap('list_files', async ({ workspace, path }) => {
      const ws = await api.workspace(workspace);
      const f = await api.call<FileAnswer>('GET', filesPath(ws, path ?? ''));
      if (f.type !== 'dir') throw new ToolFailure('invalid_request', `${f.path} is a file: use read_file`);
      const entries = f.entries ?? [];
      return {
        workspace_id: ws.id,
        path: f.path,
        entries: entries.slice(0, MAX_ITEMS),
        truncated: entries.length > MAX_ITEMS,
      };
    }),
  );
}

function toolReadFile({ server, api, wrap, read }: Kit): void {
  server.registerTool(
    'read_file',
    {
      title: 'Read a workspace file',
      description: 'A file of the workspace as it is now: UTF-8 text, or base64 for binary content.',
      inputSchema: z.object({ workspace: workspaceArg, path: pathArg }),
      annotations: read,
    },
    wrap('read_file', async ({ workspace, path }) => {
      const ws = await api.workspace(workspace);
      const f = await api.call<FileAnswer>('GET', filesPath(ws, path));
      if (f.type !== 'file') throw new ToolFailure('invalid_request', `${f.path} is a directory: use list_files`);
      const content = clip(f.content ?? '');
      return {
        workspace_id: ws.id,
        path: f.path,
        size: f.size,
        encoding: f.encoding,
        content: content.text,
        truncated: content.cut,
      };
    }),
  );
}

function toolWriteFile({ server, api, wrap, write }: Kit): void {
  server.registerTool(
    'write_file',
    {
      title: 'Write a workspace file',
      description:
        'Writes (creates or replaces) a file of the workspace and commits it as the key\u2019s user. ' +
        'Secrets in it are redacted before the commit; files Kiln protects are refused.',
      inputSchema: z.object({
        workspace: workspaceArg,
        path: pathArg,
        content: z.string().max(10_000_000).describe('The whole new content of the file (UTF-8 text)'),
      }),
      annotations: { ...write, destructiveHint: true, idempotentHint: true },
    },
    wrap('write_file', async ({ workspace, path, content }) => {
      const ws = await api.workspace(workspace);
      const r = await api.call<{ commit: Commit | null; redactions: unknown[]; refused: unknown[] }>(
        'PUT',
        filesPath(ws, path),
        { raw: content },
      );
      return { workspace_id: ws.id, path, commit: r.commit, redactions: r.redactions, refused: r.refused };
    }),
  );
}

function toolMemorySearch({ server, api, wrap, read }: Kit): void {
  server.registerTool(
    'memory_search',
    {
      title: 'Search a workspace\u2019s memory',
      description:
        'Searches core memory (MEMORY.md), the daily logs, knowledge and skills of the workspace; the best-matching ' +
        'lines come back as snippets, best first.',
      inputSchema: z.object({
        workspace: workspaceArg,
        query: z.string().trim().min(1).max(500).describe('What to find: words, identifiers, phrases'),
      }),
      annotations: read,
    },
    wrap('memory_search', async ({ workspace, query }) => {
      const ws = await api.workspace(workspace);
      const q = new URLSearchParams({ q: query, k: '10' });
      const r = await api.call<{ data: { snippet: string }[] }>('GET', `/v1/workspaces/${ws.id}/memory/search?${q}`);
      return { workspace_id: ws.id, query, hits: r.data.map((h) => ({ ...h, snippet: clip(h.snippet, 4000).text })) };
    }),
  );
}

function toolListCommits({ server, api, wrap, read }: Kit): void {
  server.registerTool(
    'list_commits',
    {
      title: 'List a workspace\u2019s commits',
      description:
        'The workspace\u2019s history, newest first (the 50 newest): who made each commit and what it changed.',
      inputSchema: z.object({ workspace: workspaceArg }),
      annotations: read,
    },
    wrap('list_commits', async ({ workspace }) => {
      const ws = await api.workspace(workspace);
      const r = await api.call<Page<Commit>>('GET', `/v1/workspaces/${ws.id}/commits?limit=50`);
      return { workspace_id: ws.id, commits: r.data, has_more: r.has_more };
    }),
  );
}

function toolRevertCommit({ server, api, wrap, write }: Kit): void {
  server.registerTool(
    'revert_commit',
    {
      title: 'Revert a commit',
      description:
        'Reverts one commit of the workspace with a new commit (as the key\u2019s user); refused (conflict) when it ' +
        'cannot apply cleanly, and then nothing changes.',
      inputSchema: z.object({
        workspace: workspaceArg,
        sha: z
          .string()
          .regex(/^[0-9a-f]{4,40}$/, 'must be 4 to 40 lowercase hex digits')
          .describe('The commit to revert (its sha, or a unique prefix of it)'),
      }),
      annotations: { ...write, destructiveHint: true },
    },
    wrap('revert_commit', async ({ workspace, sha }) => {
      const ws = await api.workspace(workspace);
      const r = await api.call<{ commit: Commit | null }>('POST', `/v1/workspaces/${ws.id}/commits/${sha}/revert`);
      return { workspace_id: ws.id, reverted: sha, commit: r.commit };
    }),
  );
}

function toolAskAgent({ server, api, deps, wrap, write }: Kit): void {
  server.registerTool(
    'ask_agent',
    {
      title: 'Ask the workspace\u2019s agent',
      description:
        'Sends a message to the workspace\u2019s agent and waits until its run finishes or pauses. Finished: the ' +
        'answer and the commits the run made. Paused (status requires_action): the pending approval; a person ' +
        'decides it with POST /v1/approvals/{id} and the run then continues (GET /v1/runs/{run}/events).',
      inputSchema: z.object({
        workspace: workspaceArg,
        session: sessionArg,
        message: z.string().trim().min(1).max(200_000).describe('What to ask or tell the agent'),
      }),
      annotations: { ...write, destructiveHint: true },
    },
    wrap('ask_agent', async ({ workspace, session, message }, ctx) => {
      const ws = await api.workspace(workspace);
      const { sessionId, runId } = await inSession(api, ws, session, 'MCP ask_agent', async (sessionId) => {
        const posted = await api.call<{ run: { id: string } }>('POST', `/v1/sessions/${sessionId}/messages`, {
          json: { content: message },
        });
        return { sessionId, runId: posted.run.id };
      });
      const { seen, stopped } = await followRun(
        deps.events,
        runId,
        ctx.mcpReq.signal,
        deps.askAgentWaitMs ?? ASK_AGENT_WAIT_MS,
      );
      const run = await api.call<{ status: string; error: unknown; steps: number }>('GET', `/v1/runs/${runId}`);
      const said = seen.filter(
        (e) => e.event === 'message.created' && (e.data as { role?: string }).role === 'assistant',
      );
      const last = said.at(-1)?.data as { content?: string } | undefined;
      const commits = seen
        .map((e) =>
          e.event === 'exec.completed'
            ? (e.data as { commit?: { sha: string; kind: string; paths: string[] } | null }).commit
            : e.event === 'evolution.reverted'
              ? {
                  sha: (e.data as { commit: string }).commit,
                  kind: 'revert',
                  paths: (e.data as { paths: string[] }).paths,
                }
              : null,
        )
        .filter((c) => !!c)
        .slice(0, MAX_ITEMS);
      let approval: unknown = null;
      const paused = seen.filter((e) => e.event === 'run.requires_action').at(-1);
      if (run.status === 'requires_action' && paused) {
        const id = (paused.data as { approval_id: string }).approval_id;
        const q = new URLSearchParams({ status: 'pending', workspace: ws.id });
        const pending = await api.call<Page<{ id: string; code: string }>>('GET', `/v1/approvals?${q}`);
        const a = pending.data.find((p) => p.id === id);
        approval = a ? { ...a, code: clip(a.code).text } : { id };
      }
      return {
        workspace_id: ws.id,
        session_id: sessionId,
        run_id: runId,
        status: run.status,
        ...(stopped ? {} : { note: 'the run is still going: follow it with GET /v1/runs/{run}/events' }),
        answer: last?.content === undefined ? null : clip(last.content).text,
        commits,
        approval,
        error: run.error,
        steps: run.steps,
      };
    }),
  );
}
