import { serve, type ServerType } from '@hono/node-server';
import type { Logger } from 'pino';
import { createApp } from './app.ts';
import { bootstrapAdminKey, type BootstrapResult } from './auth/bootstrap.ts';
import type { Config } from './config.ts';
import { openDatabase, type Database } from './db/client.ts';
import { connectDocker } from './sandbox/docker/connect.ts';
import { DockerBackend } from './sandbox/docker/backend.ts';
import { SandboxEngine, type EngineOptions } from './sandbox/engine.ts';
import { openAiEmbedder } from './memory/embeddings.ts';
import { RunEventLog } from './agent/events.ts';
import { ModelClient } from './agent/llm.ts';
import { AgentService } from './agent/service.ts';
import { WorkspaceRepos } from './workspace/repo.ts';
import { WorkspaceService } from './workspace/service.ts';
import { SelfUpdates } from './platform/self-update.ts';
import { EvolutionService } from './evolution/service.ts';
import { JobRunner } from './jobs/runner.ts';

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
  const engine = new SandboxEngine(database.db, new DockerBackend(connectDocker(config.dockerHost)), engineOptions(config), logger);
  await engine.start();
  const workspaces = workspaceService(config, database.db, logger);
  await workspaces.repairAll();
  // Indexes built by an older chunking or ranking are rebuilt in the background: start-up does not wait.
  void workspaces.reindexStale();
  // A commit made elsewhere (files API, revert, another session) updates live sandbox copies.
  workspaces.onCommit((wsId, files, origin) => void engine.pushToWorkspace(wsId, files, origin));
  const agent = agentService(config, database.db, engine, workspaces, logger);
  await agent.startup();
  if (database.listen) {
    await agent.events.connect(database.listen);
    await agent.connectCancels(database.listen);
  }
  const evolution = evolutionService(config, database.db, agent, workspaces, logger);
  await evolution.start();
  const updates = new SelfUpdates(database.db, { ...config.selfUpdate, dataDir: config.dataDir, dockerHost: config.dockerHost }, logger);
  await updates.startup();
  agent.allowSourceUpdates(updates);
  const app = createApp({ config, db: database.db, engine, workspaces, agent, evolution, updates, logger });

  const server = await new Promise<ServerType>((resolve) => {
    const s = serve({ fetch: app.fetch, port: config.port, hostname: config.host }, () => resolve(s));
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const url = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;

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
      updates.stop();
      await agent.drain(config.shutdownGraceMs);
      await evolution.stop();
      await workspaces.stopReindexing();
      await agent.stop();
      await agent.events.disconnect();
      await agent.disconnectCancels();
      await engine.stop();
      await database.close();
    })());
  return { url, database, bootstrap, close };
}

export function engineOptions(config: Config): EngineOptions {
  const s = config.sandbox;
  return {
    image: config.sandboxImage,
    owner: config.instanceId,
    poolSize: s.poolSize,
    idleMs: s.idleS * 1000,
    maxLifetimeMs: s.maxLifetimeS * 1000,
    perTeamMax: s.perTeamMax,
    maxLimits: s.max,
    maxOutputBytes: s.maxOutputBytes,
    reapIntervalMs: s.reapIntervalS * 1000,
  };
}

export function workspaceService(config: Config, db: Database['db'], logger: Logger): WorkspaceService {
  const { baseURL, apiKey, embeddingsModel } = config.openai;
  return new WorkspaceService(db, new WorkspaceRepos(config.workspaces.dir, config.workspaces.template), {
    maxFileBytes: config.workspaces.maxFileBytes,
    maxQuota: config.workspaces.maxQuota,
    embedder: embeddingsModel ? openAiEmbedder({ model: embeddingsModel, baseURL, apiKey }) : undefined,
  }, logger);
}

/** Reviews and dreams as durable jobs, taken by this instance's job runner. */
export function evolutionService(config: Config, db: Database['db'], agent: AgentService, workspaces: WorkspaceService, logger: Logger): EvolutionService {
  const jobs = new JobRunner(db, { owner: config.instanceId, leaseMs: config.jobs.leaseMs, pollMs: config.jobs.pollMs }, logger);
  return new EvolutionService(
    { db, model: agent.model, workspaces, events: agent.events, log: logger, maxFileBytes: config.workspaces.maxFileBytes },
    jobs,
    { tickMs: config.evolutionTickMs },
  );
}

export function agentService(config: Config, db: Database['db'], engine: SandboxEngine, workspaces: WorkspaceService, logger: Logger): AgentService {
  const o = config.openai;
  const model = new ModelClient({ baseURL: o.baseURL, apiKey: o.apiKey, defaultModel: o.model, maxRetries: o.maxRetries, timeoutMs: o.timeoutMs });
  return new AgentService(db, new RunEventLog(db), model, engine, workspaces, logger, { owner: config.instanceId, leaseMs: config.runLeaseMs });
}
