import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Embedder } from '../../apps/api/src/memory/embeddings.ts';
import { WorkspaceRepos } from '../../apps/api/src/workspace/repo.ts';
import { WorkspaceService } from '../../apps/api/src/workspace/service.ts';
import { RunEventLog } from '../../apps/api/src/agent/events.ts';
import { ModelClient } from '../../apps/api/src/agent/llm.ts';
import { AgentService } from '../../apps/api/src/agent/service.ts';
import { EvolutionService } from '../../apps/api/src/evolution/service.ts';
import { JobRunner } from '../../apps/api/src/jobs/runner.ts';
import { Writable } from 'node:stream';
import pino from 'pino';
import { createApp } from '../../apps/api/src/app.ts';
import { bootstrapAdminKey } from '../../apps/api/src/auth/bootstrap.ts';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { SandboxEngine, type EngineOptions } from '../../apps/api/src/sandbox/engine.ts';
import { engineOptions } from '../../apps/api/src/server.ts';
import { loadConfig } from '../../apps/api/src/config.ts';
import { createTestDatabase, type Driver, type TestDatabase } from './db.ts';

export const TEMPLATE = fileURLToPath(new URL('../../workspace-template', import.meta.url));

export interface Call {
  key?: string;
  body?: unknown;
  raw?: string;
  headers?: Record<string, string>;
}

export interface TestApp {
  app: ReturnType<typeof createApp>;
  engine: SandboxEngine;
  workspaces: WorkspaceService;
  agent: AgentService;
  /** Reviews and dreams; its job runner is not started: tests run due jobs with `evolution.jobs.drain()`. */
  evolution: EvolutionService;
  database: TestDatabase;
  adminKey: string;
  workspacesDir: string;
  /** Every log line the app wrote, parsed. */
  logs: Record<string, unknown>[];
  /** Raw log output, to check that no secret ever reaches it. */
  logText(): string;
  call(method: string, path: string, opts?: Call): Promise<{ status: number; body: any; headers: Headers }>;
  /** Creates a team plus a key of the given role in it. */
  team(name: string, role?: 'owner' | 'admin' | 'member' | 'viewer'): Promise<{ id: string; key: string }>;
  close(): Promise<void>;
}

/** The real app in-process on a real, freshly migrated database and the real Docker Engine. */
export async function createTestApp(
  opts: {
    driver?: Driver;
    rateLimit?: { perMinute: number; burst: number };
    bodyLimitBytes?: number;
    now?: () => number;
    sandbox?: Partial<EngineOptions>;
    embedder?: Embedder;
    maxFileBytes?: number;
    /** Another app's database and workspaces directory: a second replica of it (neither is dropped by this app's close). */
    replicaOf?: TestApp;
    /** How long this app's runs are its own without renewal (default 60 s). */
    runLeaseMs?: number;
    /** Where the built dashboard is (default apps/dashboard/dist). */
    dashboardDir?: string;
    /** An OpenAI-compatible endpoint (the scripted fake) and its default model. */
    model?: { baseURL: string; model: string; maxRetries?: number };
  } = {},
): Promise<TestApp> {
  const replica = opts.replicaOf;
  const database = replica ? await replica.database.reopen() : await createTestDatabase(opts.driver ?? 'postgres');
  const adminKey = replica?.adminKey ?? generateKey('admin');
  if (!replica) await bootstrapAdminKey(database.db, { adminKey, dataDir: '/nonexistent' });
  let text = '';
  const logs: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      text += chunk.toString();
      for (const line of chunk.toString().split('\n')) if (line.trim()) logs.push(JSON.parse(line));
      cb();
    },
  });
  const logger = pino({ level: 'info' }, sink);
  const backend = new DockerBackend(connectDocker(process.env.DOCKER_HOST));
  const engine = new SandboxEngine(database.db, backend, { ...testEngineOptions(), ...opts.sandbox }, logger);
  await engine.start();
  const workspacesDir = replica?.workspacesDir ?? mkdtempSync(join(tmpdir(), 'kiln-ws-'));
  const workspaces = new WorkspaceService(
    database.db,
    new WorkspaceRepos(workspacesDir, TEMPLATE),
    { maxFileBytes: opts.maxFileBytes ?? 1024 * 1024, embedder: opts.embedder },
    logger,
  );
  workspaces.onCommit((wsId, files, origin) => void engine.pushToWorkspace(wsId, files, origin));
  const modelClient = new ModelClient({
    baseURL: opts.model?.baseURL,
    apiKey: opts.model ? 'test-key' : undefined,
    defaultModel: opts.model?.model,
    maxRetries: opts.model?.maxRetries ?? 0,
    timeoutMs: 30_000,
  });
  const agent = new AgentService(database.db, new RunEventLog(database.db), modelClient, engine, workspaces, logger, {
    owner: `test-${randomBytes(4).toString('hex')}`,
    leaseMs: opts.runLeaseMs ?? 60_000,
  });
  await agent.startup();
  if (database.listen) {
    await agent.events.connect(database.listen);
    await agent.connectCancels(database.listen);
  }
  const jobs = new JobRunner(database.db, { owner: `test-${randomBytes(4).toString('hex')}`, leaseMs: 60_000, pollMs: 60_000 }, logger);
  const evolution = new EvolutionService(
    { db: database.db, model: modelClient, workspaces, events: agent.events, log: logger, maxFileBytes: opts.maxFileBytes ?? 1024 * 1024 },
    jobs,
    { tickMs: 60_000 },
  );
  const app = createApp({
    config: { bodyLimitBytes: opts.bodyLimitBytes ?? 1024 * 1024, rateLimit: opts.rateLimit ?? { perMinute: 1_000_000, burst: 1_000_000 } },
    db: database.db,
    engine,
    workspaces,
    agent,
    evolution,
    logger,
    now: opts.now,
    dashboardDir: opts.dashboardDir,
  });

  const call: TestApp['call'] = async (method, path, o = {}) => {
    const headers: Record<string, string> = { ...o.headers };
    if (o.key) headers.authorization = `Bearer ${o.key}`;
    let body: string | undefined = o.raw;
    if (o.body !== undefined) {
      body = JSON.stringify(o.body);
      headers['content-type'] ??= 'application/json';
    }
    const res = await app.request(path, { method, headers, body });
    const ct = res.headers.get('content-type') ?? '';
    return { status: res.status, headers: res.headers, body: ct.includes('json') ? await res.json() : await res.text() };
  };

  return {
    app,
    database,
    adminKey,
    workspacesDir,
    logs,
    logText: () => text,
    call,
    async team(name, role = 'owner') {
      const t = await call('POST', '/v1/teams', { key: adminKey, body: { name } });
      if (t.status !== 201) throw new Error(`team create failed: ${JSON.stringify(t.body)}`);
      const k = await call('POST', `/v1/teams/${t.body.id}/keys`, { key: adminKey, body: { name: `${role} key`, role } });
      if (k.status !== 201) throw new Error(`key create failed: ${JSON.stringify(k.body)}`);
      return { id: t.body.id, key: k.body.key };
    },
    engine,
    workspaces,
    agent,
    evolution,
    async close() {
      await evolution.stop();
      await agent.stop();
      await agent.events.disconnect();
      await agent.disconnectCancels();
      await engine.stop();
      if (replica) return database.close();
      await database.drop();
      rmSync(workspacesDir, { recursive: true, force: true });
    },
  };
}

/** Server defaults, a unique owner per app (so parallel test files never reap each other) and no warm pool. */
/** KILN_SANDBOX_IMAGE picks the image under test (a new build's tag); the default is kiln-sandbox:latest. */
export function testEngineOptions(): EngineOptions {
  const image = process.env.KILN_SANDBOX_IMAGE;
  return { ...engineOptions(loadConfig(image ? { KILN_SANDBOX_IMAGE: image } : {})), owner: `test-${randomBytes(4).toString('hex')}`, poolSize: 0 };
}
