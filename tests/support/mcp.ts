import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { createMcpHandler, type McpServer } from '@modelcontextprotocol/server';

/**
 * An MCP server the test makes with the SDK (`build` registers its tools), served over
 * Streamable HTTP on 127.0.0.1 at `url`; `onRequest` sees every request first (its headers).
 */
export async function serveMcp(build: () => McpServer, onRequest?: (req: Request) => void) {
  const handler = createMcpHandler(build);
  const server: ServerType = serve({
    fetch: (req) => {
      onRequest?.(req);
      return handler.fetch(req);
    },
    hostname: '127.0.0.1',
    port: 0,
  });
  await new Promise<void>((r) => (server.listening ? r() : server.once('listening', () => r())));
  const http = server as Server;
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    /** Stops listening; open connections (a call that hangs) are cut too unless `keep`. */
    close: (keep = false) =>
      new Promise<void>((r) => {
        if (!keep) http.closeAllConnections();
        http.close(() => r());
      }),
    closeAll: () => http.closeAllConnections(),
  };
}

/** One MCP tool call to an app's /mcp, as curl sends it (no initialize: the server is stateless). */
export function callMcpTool(
  app: { request: (path: string, init: RequestInit) => Response | Promise<Response> },
  key: string,
  name: string,
  args: Record<string, unknown>,
): Promise<Response> {
  return Promise.resolve(
    app.request('/mcp', {
      method: 'POST',
      headers: {
        authorization: `Bearer ${key}`,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: args } }),
    }),
  );
}
