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
