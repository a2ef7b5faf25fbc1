/**
 * The agent as an MCP client: the tools of a workspace's MCP servers (`settings.mcp_servers`),
 * listed and called over Streamable HTTP with the SDK's own client.
 *
 * A tenant's server is untrusted. Its URL goes through the outbound policy (lib/outbound.ts: no
 * address of this host or a private network unless the operator allowed it, checked when the
 * connection is made, no redirects); every connect, listing and call has a deadline (a server that
 * is down, slow or answers garbage is an error, never a wait); what it may send is bounded (bytes
 * of a response, number of tools, the length of their names, descriptions and schemas, the text
 * of a result) before any of it reaches the model. Header values may reference workspace secrets
 * (`${secrets.NAME}`): they are filled in here, per request, and every secret value is masked out
 * of what comes back.
 */
import { createHash } from 'node:crypto';
import type { Client } from '@modelcontextprotocol/client';
import { OutboundPolicy, OutboundRefused } from '../lib/outbound.ts';
import { SecretMask } from '../secrets/masking.ts';
import type { OpenSecret, SecretSource } from '../secrets/store.ts';
import { SECRET_REF, type WorkspaceSettings } from '../workspace/settings.ts';
import { cleanSchema, cleanText, type JsonSchema } from './client-bounds.ts';

export type McpServerConfig = WorkspaceSettings['mcp_servers'][number];

/** A tool as the model is offered it. */
export interface McpTool {
  server: string;
  /** The server's own name of the tool (`server.tool` in XML, in rules and events). */
  name: string;
  /** The function name under native tool calling: `server__tool`, in the API's charset and length. */
  native: string;
  description: string;
  schema: JsonSchema;
}

/** One server's tools, or why there are none. */
interface ServerTools {
  server: string;
  tools: McpTool[];
  error: string | null;
  /** Tools the server offered that were not passed on (bad names, over the limits). */
  dropped: number;
}

export interface ToolSet {
  servers: ServerTools[];
  tools: McpTool[];
}

export const EMPTY_TOOLSET: ToolSet = { servers: [], tools: [] };

/** What one call gave: the text for the model (masked, bounded), or the error. */
export interface CallOutcome {
  text: string;
  /** The server answered, and said the call failed (`isError`). */
  isError: boolean;
  /** The call did not get an answer: unreachable, timeout, refused, garbage, a secret missing… */
  error: string | null;
  truncated: boolean;
  durationMs: number;
}

type Kind = 'timeout' | 'cancelled' | 'refused' | 'unreachable' | 'secret' | 'too_large' | 'protocol';

/** Why an MCP operation failed, in words for the model and the run's events. */
class McpError extends Error {
  constructor(
    readonly kind: Kind,
    message: string,
  ) {
    super(message);
    this.name = 'McpError';
  }
}

/** Bounds on what a server may send. */
const MAX_RESPONSE_BYTES = 1024 * 1024;
const MAX_TOOLS_PER_SERVER = 32;
const MAX_TOOLS = 48;
/** Descriptions and schemas of all offered tools together, in characters (they go into every model request). */
const MAX_OFFERED_CHARS = 48 * 1024;
const MAX_RESULT_CHARS = 16_000;
const MAX_ARGUMENT_CHARS = 64 * 1024;
const MAX_ERROR_CHARS = 500;
const TOOL_NAME = /^[A-Za-z0-9_./-]{1,128}$/;
/** How long a workspace's tool list is used again, and a failed listing remembered. */
const FRESH_MS = 30_000;
const FAILED_MS = 5_000;
const MAX_CACHED = 500;

/** The function name of a tool under native calling: `server__tool`, only [A-Za-z0-9_-], at most 64. */
export function nativeName(server: string, tool: string): string {
  const name = `${server}__${tool.replace(/[^A-Za-z0-9_-]/g, '_')}`;
  if (name.length <= 64) return name;
  const hash = createHash('sha256').update(tool).digest('hex').slice(0, 8);
  return `${name.slice(0, 55)}_${hash}`;
}

/** The header values with every `${secrets.NAME}` filled in; an unknown name is an error. */
export function resolveHeaders(headers: Record<string, string>, secrets: OpenSecret[]): Record<string, string> {
  const byName = new Map(secrets.map((s) => [s.name, s.value]));
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) {
    out[k] = v.replace(SECRET_REF, (_, name: string) => {
      const value = byName.get(name);
      if (value === undefined)
        throw new McpError('secret', `header ${k} references the secret ${name}, which this workspace does not have`);
      return value;
    });
  }
  return out;
}

const referencesSecrets = (s: McpServerConfig) => Object.values(s.headers).some((v) => v.search(SECRET_REF) >= 0);

/** A fetch whose responses end in an error past `max` bytes (`onError` hears it at once: the SDK may not say). */
function bounded(
  fetch: typeof globalThis.fetch,
  max: number,
  onError: (err: McpError) => void,
): typeof globalThis.fetch {
  return (async (input: RequestInfo | URL, init?: RequestInit) => {
    const res = await fetch(input, init);
    if (!res.body) return res;
    let seen = 0;
    const body = res.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, ctl) {
          seen += chunk.byteLength;
          if (seen <= max) return ctl.enqueue(chunk);
          const err = new McpError('too_large', `the server sent more than ${max} bytes in one response`);
          onError(err);
          ctl.error(err);
        },
      }),
    );
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  }) as typeof globalThis.fetch;
}

/** Runs `fn` with a deadline and the run's signal: it settles within `ms` whatever the server does. */
async function within<T>(
  ms: number,
  outer: AbortSignal | undefined,
  what: string,
  fn: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  const ctl = new AbortController();
  const timer = setTimeout(
    () => ctl.abort(new McpError('timeout', `${what} took longer than ${ms / 1000} s (KILN_MCP_TIMEOUT_S)`)),
    ms,
  );
  // An McpError as the reason is the session's own (a response over its bound); anything else is the run's cancel.
  const cancel = () =>
    ctl.abort(outer?.reason instanceof McpError ? outer.reason : new McpError('cancelled', 'the run was cancelled'));
  if (outer?.aborted) cancel();
  outer?.addEventListener('abort', cancel, { once: true });
  const aborted = new Promise<never>((_, reject) =>
    ctl.signal.addEventListener('abort', () => reject(ctl.signal.reason), { once: true }),
  );
  aborted.catch(() => undefined);
  try {
    if (ctl.signal.aborted) throw ctl.signal.reason;
    return await Promise.race([fn(ctl.signal), aborted]);
  } finally {
    clearTimeout(timer);
    outer?.removeEventListener('abort', cancel);
  }
}

/** An error of the SDK, the fetch or the policy, said plainly (and bounded: a server's message is its own). */
function describe(err: unknown, mask: SecretMask | null): McpError {
  if (err instanceof McpError) return err;
  const e = err as Error & { cause?: unknown; code?: string | number };
  if (e instanceof OutboundRefused || (e?.cause as Error | undefined)?.name === 'OutboundRefused') {
    const message = e instanceof OutboundRefused ? e.message : (e.cause as Error).message;
    return new McpError('refused', `the outbound policy refused the server address: ${message}`);
  }
  const cause = e?.cause as (Error & { code?: string }) | undefined;
  if (cause instanceof McpError) return cause;
  let text = String(e?.message ?? e);
  if (cause?.code) text += ` (${cause.code}${cause.message ? `: ${cause.message}` : ''})`;
  text = cleanText(mask ? mask.text(text) : text, MAX_ERROR_CHARS);
  const unreachable = /fetch failed|ECONNREFUSED|ENOTFOUND|ECONNRESET|EHOSTUNREACH|socket/i.test(text);
  return new McpError(
    unreachable ? 'unreachable' : 'protocol',
    unreachable ? `could not reach the server: ${text}` : text,
  );
}

/** The text a tool result gives the model: text blocks as they are, other blocks named, bounded. */
function resultText(result: { content?: unknown; structuredContent?: unknown }): { text: string; truncated: boolean } {
  const parts: string[] = [];
  const blocks = Array.isArray(result.content) ? (result.content as Record<string, unknown>[]) : [];
  for (const b of blocks.slice(0, 100)) {
    if (b.type === 'text' && typeof b.text === 'string') parts.push(b.text);
    else if (b.type === 'image' || b.type === 'audio')
      parts.push(`[${b.type} ${typeof b.mimeType === 'string' ? b.mimeType : ''} not shown]`);
    else if (b.type === 'resource') {
      const r = (b.resource ?? {}) as Record<string, unknown>;
      parts.push(typeof r.text === 'string' ? r.text : `[resource ${String(r.uri ?? '')}]`);
    } else if (b.type === 'resource_link') parts.push(`[link ${String(b.uri ?? '')} ${String(b.name ?? '')}]`);
    else parts.push(`[${String(b.type ?? 'unknown')} content]`);
  }
  if (!parts.length && result.structuredContent !== undefined) parts.push(JSON.stringify(result.structuredContent));
  const text = parts.join('\n') || '(no content)';
  return text.length > MAX_RESULT_CHARS
    ? {
        text: `${text.slice(0, MAX_RESULT_CHARS)}\n[truncated: the result had ${text.length} characters]`,
        truncated: true,
      }
    : { text, truncated: false };
}

type WorkspaceRef = { id: string; settings: Pick<WorkspaceSettings, 'mcp_servers'> };

export class McpClients {
  private readonly policy: OutboundPolicy;
  private readonly cache = new Map<string, { key: string; at: number; ttl: number; set: Promise<ToolSet> }>();

  constructor(private readonly opts: { allow: readonly string[]; timeoutMs: number; secrets: SecretSource }) {
    this.policy = new OutboundPolicy(opts.allow);
  }

  /** The tools of a workspace's servers (listed again after FRESH_MS); a server that fails says why. */
  toolsFor(ws: WorkspaceRef, signal?: AbortSignal): Promise<ToolSet> {
    const servers = ws.settings.mcp_servers ?? [];
    if (!servers.length) return Promise.resolve(EMPTY_TOOLSET);
    const key = JSON.stringify(servers);
    let entry = this.cache.get(ws.id);
    if (!entry || entry.key !== key || Date.now() - entry.at >= entry.ttl) {
      // Shared by every run of the workspace meanwhile, so no run's signal stops it (its deadlines do).
      const fresh = { key, at: Number.POSITIVE_INFINITY, ttl: FRESH_MS, set: this.list(ws.id, servers) };
      // Fresh from when the listing ended (a slow server's listing does not use up its time).
      void fresh.set.then((s) => {
        fresh.at = Date.now();
        if (s.servers.some((x) => x.error)) fresh.ttl = FAILED_MS;
      });
      this.cache.delete(ws.id);
      if (this.cache.size >= MAX_CACHED) this.cache.delete(this.cache.keys().next().value!);
      this.cache.set(ws.id, fresh);
      entry = fresh;
    }
    if (!signal) return entry.set;
    // A cancelled run does not wait for the listing.
    return within(this.opts.timeoutMs * 3, signal, 'listing MCP tools', () => entry.set).catch(() => EMPTY_TOOLSET);
  }

  /** Forgets a workspace's listed tools (its settings changed, or it is gone). */
  forget(workspaceId: string): void {
    this.cache.delete(workspaceId);
  }

  private async list(workspaceId: string, servers: McpServerConfig[]): Promise<ToolSet> {
    const secrets = await this.secretsOf(workspaceId, servers).catch((err: unknown) => err as Error);
    // Every server at once (each within its deadlines); what each offered, or why nothing.
    const answers = await Promise.all(
      servers.map(async (s): Promise<{ raw: unknown[] } | { error: string }> => {
        try {
          if (secrets instanceof Error) throw secrets;
          const listed = await this.session(s, secrets, undefined, (client, sig) =>
            within(this.opts.timeoutMs, sig, `listing the tools of ${s.name}`, (inner) =>
              client.listTools(undefined, { signal: inner, timeout: this.opts.timeoutMs }),
            ),
          );
          return { raw: Array.isArray(listed.tools) ? listed.tools : [] };
        } catch (err) {
          return { error: describe(err, secrets instanceof Error ? null : new SecretMask(secrets)).message };
        }
      }),
    );
    // Bounds across servers, in the order the settings list them.
    let budget = MAX_OFFERED_CHARS;
    const all: McpTool[] = [];
    const natives = new Set<string>();
    const listed = servers.map((s, i): ServerTools => {
      const answer = answers[i]!;
      const entry: ServerTools = {
        server: s.name,
        tools: [],
        error: 'error' in answer ? answer.error : null,
        dropped: 0,
      };
      for (const t of 'raw' in answer ? (answer.raw as Record<string, unknown>[]) : []) {
        const name = typeof t?.name === 'string' ? t.name : '';
        const native = TOOL_NAME.test(name) ? nativeName(s.name, name) : '';
        if (!native || natives.has(native) || entry.tools.length >= MAX_TOOLS_PER_SERVER || all.length >= MAX_TOOLS) {
          entry.dropped++;
          continue;
        }
        const description = cleanText(typeof t.description === 'string' ? t.description : '', 400);
        const schema = cleanSchema(t.inputSchema);
        const cost = description.length + JSON.stringify(schema).length + name.length;
        if (cost > budget) {
          entry.dropped++;
          continue;
        }
        budget -= cost;
        natives.add(native);
        const tool = { server: s.name, name, native, description, schema };
        entry.tools.push(tool);
        all.push(tool);
      }
      return entry;
    });
    return { servers: listed, tools: all };
  }

  /** Calls one tool of one of the workspace's servers; never throws for anything the server does. */
  async call(
    ws: WorkspaceRef,
    call: { server: string; tool: string; arguments: Record<string, unknown> },
    signal?: AbortSignal,
  ): Promise<CallOutcome> {
    const started = performance.now();
    const server = ws.settings.mcp_servers.find((s) => s.name === call.server);
    let mask: SecretMask | null = null;
    const done = (o: Omit<CallOutcome, 'durationMs'>) => ({
      ...o,
      durationMs: Math.round(performance.now() - started),
    });
    try {
      if (!server) throw new McpError('protocol', `this workspace has no MCP server named ${call.server}`);
      if (JSON.stringify(call.arguments).length > MAX_ARGUMENT_CHARS)
        throw new McpError('too_large', `the arguments are longer than ${MAX_ARGUMENT_CHARS} characters`);
      // Every secret of the workspace masks what comes back, whether or not a header uses it.
      const secrets = await this.opts.secrets.openAll(ws.id).catch((err: Error) => {
        throw new McpError('secret', err.message);
      });
      mask = new SecretMask(secrets);
      const result = await this.session(server, secrets, signal, (client, sig) =>
        within(this.opts.timeoutMs, sig, `the call of ${call.server}.${call.tool}`, (inner) =>
          client.callTool(
            { name: call.tool, arguments: call.arguments },
            { signal: inner, timeout: this.opts.timeoutMs },
          ),
        ),
      );
      const { text, truncated } = resultText(result as { content?: unknown; structuredContent?: unknown });
      return done({ text: mask.text(text), isError: result.isError === true, error: null, truncated });
    } catch (err) {
      const e = describe(err, mask);
      return done({ text: '', isError: true, error: e.message, truncated: false });
    }
  }

  /** A call's arguments for the run's events: every workspace secret value in a string masked. */
  async maskArguments(workspaceId: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
    const secrets = await this.opts.secrets.openAll(workspaceId).catch(() => null);
    if (!secrets?.length) return args;
    const mask = new SecretMask(secrets);
    const walk = (v: unknown): unknown =>
      typeof v === 'string'
        ? mask.text(v)
        : Array.isArray(v)
          ? v.map(walk)
          : v && typeof v === 'object'
            ? Object.fromEntries(Object.entries(v).map(([k, x]) => [mask.text(k), walk(x)]))
            : v;
    return walk(args) as Record<string, unknown>;
  }

  /** The workspace's secrets when a header needs them (only then are they opened for a listing). */
  private async secretsOf(workspaceId: string, servers: McpServerConfig[]): Promise<OpenSecret[]> {
    if (!servers.some(referencesSecrets)) return [];
    try {
      return await this.opts.secrets.openAll(workspaceId);
    } catch (err) {
      throw new McpError('secret', (err as Error).message);
    }
  }

  /** Connects (within the deadline), runs `fn` on the connected client, and closes the connection. */
  private async session<T>(
    server: McpServerConfig,
    secrets: OpenSecret[],
    signal: AbortSignal | undefined,
    fn: (client: Client, signal: AbortSignal | undefined) => Promise<T>,
  ): Promise<T> {
    const url = this.policy.checkUrl(server.url);
    const headers = resolveHeaders(server.headers, secrets);
    const broken = new AbortController();
    // Loaded at the first call (~0.1–0.2 s of every start otherwise, for workspaces that may have no MCP server).
    const { Client, StreamableHTTPClientTransport } = await import('@modelcontextprotocol/client');
    const transport = new StreamableHTTPClientTransport(url, {
      fetch: bounded(this.policy.fetch(this.opts.timeoutMs), MAX_RESPONSE_BYTES, (err) => broken.abort(err)),
      requestInit: { headers, redirect: 'manual' },
    });
    const client = new Client({ name: 'kiln', version: '1.0.0' });
    const stop = signal ? AbortSignal.any([signal, broken.signal]) : broken.signal;
    try {
      await within(this.opts.timeoutMs, stop, `connecting to ${server.name}`, (inner) =>
        client.connect(transport, { signal: inner, timeout: this.opts.timeoutMs }),
      );
      return await fn(client, stop);
    } finally {
      // Not awaited for long: a server that hangs must not hold the run at the close either.
      await within(1000, undefined, 'closing', () => client.close()).catch(() => undefined);
    }
  }

  async close(): Promise<void> {
    this.cache.clear();
    await this.policy.close();
  }
}
