import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { serve, type ServerType } from '@hono/node-server';
import type { Logger } from 'pino';
import { bootstrapAdminKey, type BootstrapResult } from './auth/bootstrap.ts';
import { compose } from './compose.ts';
import type { Config } from './config.ts';
import { openDatabase, type Database } from './db/client.ts';
import { DockerBackend, egressOf } from './sandbox/docker/backend.ts';
import { connectDocker } from './sandbox/docker/connect.ts';
import { FleetBackend } from './sandbox/node/fleet.ts';

/** How long an idle HTTP connection is kept open (longer than a load balancer's usual 60 s). */
const KEEP_ALIVE_MS = 65_000;

export interface RunningServer {
  url: string;
  database: Database;
  bootstrap: BootstrapResult;
  close(): Promise<void>;
}

/** Opens the database (migrating it), makes sure an admin key exists and starts listening. */
export async function startServer(config: Config, logger: Logger): Promise<RunningServer> {
  const database = await openDatabase({ url: config.databaseUrl, dataDir: config.dataDir });
  const bootstrap = await bootstrapAdminKey(database.db, { adminKey: config.adminKey, dataDir: config.dataDir });
  const fairShare = config.sandbox.fairShare && { ...config.sandbox.fairShare, log: logger };
  const local = new DockerBackend(connectDocker(config.dockerHost), {
    egress: egressOf(config, logger),
    fairShare,
    probeImage: config.sandboxImage,
  });
  // With sandbox nodes, the backend is the fleet (registered nodes, and this host's engine unless turned off).
  const fleet = config.nodes
    ? new FleetBackend({
        db: database.db,
        credentials: {
          cert: readFileSync(config.nodes.cert, 'utf8'),
          key: readFileSync(config.nodes.key, 'utf8'),
          ca: readFileSync(config.nodes.ca, 'utf8'),
        },
        local: config.nodes.local ? local : undefined,
        log: logger,
      })
    : undefined;
  await fleet?.open();
  const kiln = compose({
    config,
    db: database.db,
    listen: database.listen,
    lock: database.lock,
    onStatement: database.onStatement,
    sandboxes: fleet ?? local,
    logger,
  });
  await kiln.start();
  const { app } = kiln;

  const server = await new Promise<ServerType>((resolve) => {
    const s = serve({ fetch: app.fetch, port: config.port, hostname: config.host }, () => resolve(s));
  });
  // An idle connection is kept longer than a load balancer keeps its own (60 s is the usual), so
  // the balancer closes first: with Node's 5 s, a request it sent on a connection Kiln was closing
  // failed (a 502 to the user). Headers may take that long too (Node asks for more than keep-alive).
  if ('keepAliveTimeout' in server) {
    server.keepAliveTimeout = KEEP_ALIVE_MS;
    server.headersTimeout = KEEP_ALIVE_MS + 1000;
  }
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const url = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
  // Where the other replicas send the requests about sessions whose sandbox this one holds.
  const everywhere = config.host === '0.0.0.0' || config.host === '::';
  await kiln.replicas.open(config.replicaUrl ?? (everywhere ? `http://${hostname()}:${port}` : url));

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      await new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          if ('closeAllConnections' in server) server.closeAllConnections();
        }, config.shutdownGraceMs);
        server.close(() => {
          clearTimeout(force);
          resolve();
        });
        if ('closeIdleConnections' in server) server.closeIdleConnections();
      });
      await kiln.stop(config.shutdownGraceMs);
      fleet?.close();
      await database.close();
    })());
  return { url, database, bootstrap, close };
}
