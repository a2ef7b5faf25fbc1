import { Replicas } from './http/replicas.ts';
import type { Logger } from 'pino';
import { RunEventLog } from './agent/events.ts';
import { ModelClient } from './agent/llm.ts';
import { AgentService } from './agent/service.ts';
import { createApp } from './app.ts';
import type { Config } from './config.ts';
import { CacheNews } from './db/cache-news.ts';
import type { Database, Db } from './db/client.ts';
import { EvolutionService } from './evolution/service.ts';
import { JobRunner } from './jobs/runner.ts';
import { KilnMetrics } from './metrics/metrics.ts';
import { McpClients } from './mcp/client.ts';
import { type Embedder, localEmbedder, openAiEmbedder } from './memory/embeddings.ts';
import { VectorFill } from './memory/vectors.ts';
import { SelfUpdates } from './platform/self-update.ts';
import type { SandboxBackend } from './sandbox/backend.ts';
import { type EngineOptions, SandboxEngine } from './sandbox/engine.ts';
import { NoSandboxes } from './sandbox/no-sandboxes.ts';
import { FleetBackend } from './sandbox/node/fleet.ts';
import { NodeRegistry } from './sandbox/node/registry.ts';
import { TemplateService } from './templates/service.ts';
import { Sealer } from './secrets/sealing.ts';
import { SecretStore } from './secrets/store.ts';
import { WorkspaceRepos } from './workspace/git-repos.ts';
import { WorkspaceService } from './workspace/service.ts';
import { SANDBOX_RUNTIMES } from './workspace/settings.ts';
import { WebhookService } from './webhooks/service.ts';

export interface ComposeOptions {
  config: Config;
  db: Db;
  /** The database's LISTEN/NOTIFY (Postgres): run events and cancels then reach every replica. */
  listen?: Database['listen'];
  /** The database's statement timings: their latency is one of the app's metrics. */
  onStatement?: Database['onStatement'];
  /** The database's lock across processes (Postgres): a workspace's writes are serialised across replicas. */
  lock?: Database['lock'];
  /** Where sandboxes run; null for none (running code answers 503, /readyz says why). */
  sandboxes: SandboxBackend | null;
  logger: Logger;
  /** Platform self-update and its /v1/system routes (default on; off in in-process test apps). */
  selfUpdate?: boolean;
  /** Seams for tests: another embedder, engine timings, the clock of the rate limiter and of memory search's recency, the dashboard's files. */
  embedder?: Embedder;
  /** The memory vectors' first wait after a failed embedding (default 5 s). */
  vectorRetryMs?: number;
  engine?: Partial<EngineOptions>;
  now?: () => number;
  /** The job runner's clock (due times, leases, webhook retry schedules); default the wall clock. */
  jobsNow?: () => number;
  dashboardDir?: string;
}

/** Every part of one Kiln server, built and wired but not started. */
export interface Kiln {
  app: ReturnType<typeof createApp>;
  engine: SandboxEngine;
  workspaces: WorkspaceService;
  agent: AgentService;
  /** Every run's events: the agent writes them, reviews announce theirs, the routes stream them. */
  events: RunEventLog;
  evolution: EvolutionService;
  /** The job runner: reviews, dreams, template builds and webhook deliveries, each in its lane. */
  jobs: JobRunner;
  /** Sandbox templates; their builds are jobs. */
  templates: TemplateService;
  /** Webhooks; their fan-outs and deliveries are jobs. */
  webhooks: WebhookService;
  updates?: SelfUpdates;
  /** This app's Prometheus metrics (its own registry), served at GET /metrics. */
  metrics: KilnMetrics;
  /** News of writes that make other replicas' cached keys, sessions and settings stale. */
  news: CacheNews;
  /**
   * The API replicas sharing the database; `open(url)` once listening (server.ts) says where this
   * one is reached, and requests about a session held by another are sent on to it.
   */
  replicas: Replicas;
  /**
   * Starts the parts in order: sandboxes (pool, reaper), the repair of every workspace
   * repository (`repair`, default on; a second in-process replica of a running app skips it),
   * the agent (resuming or interrupting runs, renewing leases) and its listeners, then, with
   * `background` (default on; tests drive these themselves), evolution's schedule, the job runner
   * and the re-index of stale memory indexes, and last self-update.
   */
  start(opts?: { background?: boolean; repair?: boolean }): Promise<void>;
  /** Stops them in reverse, after waiting up to `graceMs` for runs in flight. The database stays open. */
  stop(graceMs?: number): Promise<void>;
}

function engineOptions(config: Config): EngineOptions {
  const s = config.sandbox;
  return {
    image: config.sandboxImage,
    instance: config.instanceId,
    poolSize: s.poolSize,
    preparedPoolSize: s.preparedPoolSize,
    templatePoolSize: config.templates.poolSize,
    idleMs: s.idleS * 1000,
    maxIdleMs: s.maxIdleS * 1000,
    maxLifetimeMs: s.maxLifetimeS * 1000,
    pausedTtlMs: s.pause.ttlS * 1000,
    maxPausedTtlMs: s.pause.maxTtlS * 1000,
    pause: s.pause.enabled
      ? {
          maxBytes: { team: s.pause.maxMbPerTeam * 2 ** 20, all: s.pause.maxMb * 2 ** 20 },
          atShutdown: s.pause.atShutdown,
        }
      : undefined,
    perTeamMax: s.perTeamMax,
    maxLimits: s.max,
    maxOutputBytes: s.maxOutputBytes,
    reapIntervalMs: s.reapIntervalS * 1000,
    runtimes: s.runtimes,
    workspaceMount: s.workspaceMount,
    egress: { enabled: config.egress.enabled, maxAllow: config.egress.maxAllow },
  };
}

/** The one place the parts are built and wired: `server.ts` and the tests' in-process apps call it. */
export function compose(o: ComposeOptions): Kiln {
  const { config, db, logger } = o;
  const { baseURL, apiKey, embeddingsModel, model, maxRetries, timeoutMs } = config.openai;
  // A registry of this app's own: several apps (tests, replicas) may share the process.
  const metrics = new KilnMetrics({ db, log: logger, models: [model], runtimes: SANDBOX_RUNTIMES });
  const sealer = new Sealer(config.secretsKey);
  const secrets = new SecretStore(db, sealer);

  // Reviews, dreams, template builds and webhook deliveries are durable jobs, taken by this
  // instance's job runner: a part of its own, started and stopped here (each service only
  // registers its handlers with it).
  const jobs = new JobRunner(db, { instance: config.instanceId, ...config.jobs, now: o.jobsNow }, logger);

  // Template builds: their images are built where the sandboxes run, and the warm pool keeps a
  // few containers of each image in use (it is told through `onPoolImages`, once it runs).
  const { poolSize: _, ...templateOptions } = config.templates;
  const templates = new TemplateService(
    db,
    o.sandboxes?.images ?? null,
    jobs,
    {
      baseImage: config.sandboxImage,
      ...templateOptions,
      onPoolImages: (images) => engine.setTemplateImages(images),
    },
    logger,
  );
  // The replicas sharing the database: a request about a session goes to the one holding its
  // sandbox, and a running sandbox of one that is gone is taken over where its session's next request lands.
  const replicas = new Replicas(db, { instance: config.instanceId, secretsKey: config.secretsKey, log: logger });
  const engine = new SandboxEngine(
    db,
    o.sandboxes ?? new NoSandboxes(),
    // Without a container runtime (NoSandboxes) there is nothing to mount a workspace for.
    {
      ...engineOptions(config),
      instanceGone: (instance) => replicas.gone(instance),
      ...(o.sandboxes ? {} : { workspaceMount: undefined }),
      ...o.engine,
    },
    logger,
    secrets,
    metrics,
    templates,
  );
  metrics.watchPool(() => engine.poolReady);

  const embedder =
    o.embedder ??
    (embeddingsModel === 'builtin'
      ? localEmbedder()
      : embeddingsModel
        ? openAiEmbedder({ model: embeddingsModel, baseURL, apiKey })
        : undefined);
  // Chunks are written without new vectors and embedded after, in the background (vectors.ts).
  const vectors = embedder && new VectorFill(db, embedder, logger, o.vectorRetryMs);
  const repos = new WorkspaceRepos(config.workspaces.dir, config.workspaces.template);
  const workspaces = new WorkspaceService(
    db,
    repos,
    {
      maxFileBytes: config.workspaces.maxFileBytes,
      maxQuota: config.workspaces.maxQuota,
      perTeam: config.workspaces.perTeam,
      vectors,
      sharedLock: o.lock,
      now: o.now,
      // A commit made elsewhere (files API, revert, another session) updates live sandbox copies; a
      // container the warm pool holds filled with the workspace is refilled (in the background).
      onCommit: (wsId, files, origin) => {
        void engine.pushToWorkspace(wsId, files, origin);
        engine.workspaceChanged(wsId);
      },
    },
    logger,
  );

  const modelClient = new ModelClient({ baseURL, apiKey, defaultModel: model, maxRetries, timeoutMs, metrics });
  const events = new RunEventLog(db);
  const updateOptions = {
    ...config.selfUpdate,
    dataDir: config.dataDir,
    dockerHost: config.dockerHost,
    sandboxImage: config.sandboxImage,
  };
  const updates = o.selfUpdate === false ? undefined : new SelfUpdates(db, updateOptions, logger);
  // Workspaces' MCP servers are tenants' URLs: only through the outbound policy, each step bounded in time.
  const mcp = new McpClients({ allow: config.outbound.allow, timeoutMs: config.mcp.timeoutMs, secrets });
  const agent = new AgentService({
    db,
    events,
    model: modelClient,
    engine,
    workspaces,
    log: logger,
    lease: { instance: config.instanceId, leaseMs: config.runLeaseMs },
    metrics,
    mcp,
    sourceUpdates: updates,
  });

  const evolution = new EvolutionService(
    { db, model: modelClient, workspaces, events, log: logger, maxFileBytes: config.workspaces.maxFileBytes },
    jobs,
    { tickMs: config.evolutionTickMs },
  );

  // The events that owe webhook deliveries are written by their owners.
  const webhooks = new WebhookService(
    db,
    sealer,
    jobs,
    { ...config.webhooks, outboundAllow: config.outbound.allow },
    logger,
  );

  const news = new CacheNews(db);
  const parts = {
    engine,
    workspaces,
    agent,
    events,
    evolution,
    jobs,
    templates,
    webhooks,
    updates,
    metrics,
    news,
    replicas,
  };
  const nodes = {
    registry: new NodeRegistry(db),
    fleet: o.sandboxes instanceof FleetBackend ? o.sandboxes : undefined,
  };
  metrics.watchNodes(async () =>
    (await nodes.registry.list()).map((n) => ({
      name: n.name,
      heard: n.health === 'heard',
      draining: n.state === 'draining',
      memoryMb: n.capacity.memory_mb,
      committedMemoryMb: n.committed.memory_mb,
      cpus: n.capacity.cpus,
      committedCpus: n.committed.cpus,
      sandboxes: n.sandboxes,
    })),
  );
  const app = createApp({
    ...parts,
    nodes,
    secrets,
    sealer,
    config,
    db,
    logger,
    now: o.now,
    dashboardDir: o.dashboardDir,
  });
  // Statements are timed from the moment the app is built until it stops.
  const stopTimings = o.onStatement?.((driver, kind, s) => metrics.statement(driver, kind, s));

  return {
    ...parts,
    app,
    async start({ background = true, repair = true } = {}) {
      // The first search's question would otherwise wait for the encoder's model to load.
      void workspaces.warmSearch();
      await engine.start();
      await templates.start();
      if (repair) await workspaces.repairAll();
      // Indexes built by an older chunking or ranking are rebuilt in the background: start-up does not wait.
      if (background) void workspaces.reindexStale();
      await agent.startup();
      if (o.listen) {
        await events.connect(o.listen);
        await agent.connectCancels(o.listen);
        await news.connect(o.listen);
      }
      if (background) {
        await evolution.start();
        await jobs.start();
      }
      await updates?.startup();
    },
    async stop(graceMs = 0) {
      // The others stop sending requests here before the sandboxes go.
      await replicas.close();
      updates?.stop();
      await agent.drain(graceMs);
      // Builds in flight go back to the queue before the job runner stops.
      await templates.stop();
      await evolution.stop();
      await jobs.stop();
      await workspaces.stopReindexing();
      await agent.stop();
      await events.disconnect();
      await agent.disconnectCancels();
      await news.disconnect();
      await mcp.close();
      await engine.stop();
      stopTimings?.();
      await webhooks.close();
    },
  };
}
