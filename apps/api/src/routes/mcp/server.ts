import { createRoute, z } from '@hono/zod-openapi';
import type { McpServer, Variables } from '@modelcontextprotocol/server';
import type { Logger } from 'pino';
import type { RunEventLog } from '../../agent/events.ts';
import { errorResponses } from '../../http/router.ts';
import { type AppFetch, KilnApi, ToolFailure } from './server-api.ts';
import { registerTools } from './server-tools.ts';

/** The most workspaces the resource lists name (their skills included). */
const MAX_LISTED_WORKSPACES = 100;

interface McpCall {
  api: KilnApi;
  log: Logger;
}

const one = (v: Variables[string] | undefined) => (Array.isArray(v) ? v[0] : v) ?? '';

/** The MCP SDK's server half, loaded at the first /mcp request (~0.1–0.2 s of every start otherwise). */
type Sdk = typeof import('@modelcontextprotocol/server');

/** The workspace's MEMORY.md and its skills, as resources of each workspace of the caller's team. */
function registerResources(
  { ResourceNotFoundError, ResourceTemplate }: Sdk,
  server: McpServer,
  { api }: McpCall,
): void {
  const memoryUri = (ws: string) => `kiln://workspaces/${ws}/memory`;
  const skillUri = (ws: string, skill: string) => `kiln://workspaces/${ws}/skills/${encodeURIComponent(skill)}`;
  const text = async (uri: URL, wsId: string, path: string, mimeType: string) => {
    const f = await api.call<{ type: string; content?: string }>(
      'GET',
      `/v1/workspaces/${wsId}/files?${new URLSearchParams({ path })}`,
    );
    return { contents: [{ uri: uri.href, mimeType, text: f.content ?? '' }] };
  };
  /** The API's not_found is the resource's: MCP answers it as a missing resource. */
  const orMissing = async <T>(uri: URL, fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof ToolFailure && err.code === 'not_found')
        throw new ResourceNotFoundError(uri.href, err.message);
      throw err;
    }
  };

  server.registerResource(
    'memory',
    new ResourceTemplate('kiln://workspaces/{workspace}/memory', {
      list: async () => ({
        resources: (await api.workspaces(MAX_LISTED_WORKSPACES)).map((ws) => ({
          uri: memoryUri(ws.id),
          name: `${ws.name}/MEMORY.md`,
          title: `Core memory of ${ws.name}`,
          mimeType: 'text/markdown',
        })),
      }),
    }),
    {
      title: 'A workspace\u2019s core memory (MEMORY.md)',
      description: 'What the agent of the workspace keeps in mind in every run',
      mimeType: 'text/markdown',
    },
    (uri, vars) =>
      orMissing(uri, async () =>
        text(uri, (await api.workspace(one(vars.workspace))).id, 'MEMORY.md', 'text/markdown'),
      ),
  );

  server.registerResource(
    'skill',
    new ResourceTemplate('kiln://workspaces/{workspace}/skills/{skill}', {
      list: async () => {
        const resources = [];
        for (const ws of await api.workspaces(MAX_LISTED_WORKSPACES)) {
          const skills = await api.call<{ data: { name: string; description: string }[] }>(
            'GET',
            `/v1/workspaces/${ws.id}/skills`,
          );
          for (const s of skills.data)
            resources.push({
              uri: skillUri(ws.id, s.name),
              name: `${ws.name}/skills/${s.name}`,
              title: s.name,
              description: s.description,
              mimeType: 'text/markdown',
            });
        }
        return { resources };
      },
    }),
    {
      title: 'A skill of a workspace (its SKILL.md)',
      description: 'Instructions the agent of the workspace follows for one kind of task',
      mimeType: 'text/markdown',
    },
    (uri, vars) =>
      orMissing(uri, async () => {
        const ws = await api.workspace(one(vars.workspace));
        const name = decodeURIComponent(one(vars.skill));
        const skills = await api.call<{ data: { name: string; path: string }[] }>(
          'GET',
          `/v1/workspaces/${ws.id}/skills`,
        );
        const skill = skills.data.find((s) => s.name === name);
        if (!skill) throw new ToolFailure('not_found', `no skill ${JSON.stringify(name)} in workspace ${ws.id}`);
        return text(uri, ws.id, skill.path, 'text/markdown');
      }),
  );
}

/** /mcp as the OpenAPI document shows it: one JSON-RPC message per POST. */
export const mcpRoute = createRoute({
  operationId: 'postMcpMessage',
  method: 'post',
  path: '/mcp',
  tags: ['MCP'],
  security: [{ bearer: [] }],
  summary:
    'Model Context Protocol endpoint (Streamable HTTP, stateless): Kiln\u2019s tools and resources for MCP clients',
  description:
    'One JSON-RPC message per request (initialize, tools/list, tools/call, resources/list, resources/read, …), ' +
    'answered as JSON or as a one-request SSE stream (send `Accept: application/json, text/event-stream`). ' +
    'No MCP session is kept: every request is served on its own, so any replica can answer it. ' +
    'GET and DELETE (session streams) are answered 405. See docs/mcp.md.',
  request: {
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              jsonrpc: z.literal('2.0'),
              id: z.union([z.string(), z.number()]).optional(),
              method: z.string(),
              params: z.record(z.string(), z.unknown()).optional(),
            })
            .openapi('JsonRpcMessage'),
        },
      },
      required: true,
    },
  },
  responses: {
    200: {
      description: 'The JSON-RPC response (tool errors are results with isError: true)',
      content: {
        'application/json': { schema: z.record(z.string(), z.unknown()) },
        'text/event-stream': { schema: z.string() },
      },
    },
    202: { description: 'A notification was accepted' },
    ...errorResponses,
    405: { description: 'GET/DELETE: this endpoint keeps no MCP sessions' },
    406: { description: 'The Accept header does not allow application/json and text/event-stream' },
  },
});

export interface McpDeps {
  /** The app itself: the tools call its /v1 routes in-process. */
  fetch: AppFetch;
  events: RunEventLog;
  /** The largest MCP request body read (the app's body limit). */
  maxBodyBytes: number;
  logger: Logger;
  /** How long ask_agent waits for a run. */
  askAgentWaitMs?: number;
}

/**
 * The MCP server: stateless Streamable HTTP, a fresh server per request (no MCP session state to
 * share between replicas), the tools and resources acting through the caller's own API. Mount it
 * behind authn and the rate limit; it returns the handler for /mcp.
 */
export function mcpHandler(deps: McpDeps) {
  let handler: Promise<ReturnType<Sdk['createMcpHandler']>> | undefined;
  const make = (sdk: Sdk) =>
    sdk.createMcpHandler(
      ({ authInfo }) => {
        const call = authInfo?.extra?.call as McpCall;
        const server = new sdk.McpServer(
          { name: 'kiln', version: '1', title: 'Kiln' },
          {
            instructions:
              'Kiln workspaces: git-backed files, a Python sandbox per session, memory and an agent. Name a workspace by id or name.',
          },
        );
        registerTools(server, {
          api: call.api,
          events: deps.events,
          askAgentWaitMs: deps.askAgentWaitMs,
          logError: (err, tool) => call.log.error({ err, tool }, 'mcp tool failed'),
        });
        registerResources(sdk, server, call);
        return server;
      },
      {
        maxRequestBodySize: deps.maxBodyBytes,
        onerror: (err) => deps.logger.info({ err: err.message }, 'mcp request refused'),
      },
    );
  return {
    /** Serves one /mcp request for the authenticated caller. */
    async serve(req: Request, caller: { keyId: string; authorization: string; requestId: string; log: Logger }) {
      const call: McpCall = { api: new KilnApi(deps.fetch, caller.authorization, caller.requestId), log: caller.log };
      handler ??= import('@modelcontextprotocol/server').then(make);
      return (await handler).fetch(req, {
        authInfo: { token: '', clientId: caller.keyId, scopes: [], extra: { call } },
      });
    },
  };
}
