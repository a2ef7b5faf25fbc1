import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Writable } from 'node:stream';
import pino from 'pino';
import { bootstrapAdminKey } from '../../apps/api/src/auth/bootstrap.ts';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { compose, type Kiln } from '../../apps/api/src/compose.ts';
import { loadConfig } from '../../apps/api/src/config.ts';
import type { Db } from '../../apps/api/src/db/client.ts';
import type { StatementListener } from '../../apps/api/src/db/statements.ts';
import type { Embedder } from '../../apps/api/src/memory/embeddings.ts';
import type { SandboxBackend } from '../../apps/api/src/sandbox/backend.ts';
import { DockerBackend, egressOf } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import type { EngineOptions } from '../../apps/api/src/sandbox/engine.ts';
import { createTestDatabase, type Driver, type TestDatabase } from './db.ts';

/** One key for every app of a test file, so a replica opens what its primary sealed. */
const SECRETS_KEY = randomBytes(32).toString('base64');

export const TEMPLATE = fileURLToPath(new URL('../../workspace-template', import.meta.url));

interface Call {
  key?: string;
  body?: unknown;
  raw?: string;
  headers?: Record<string, string>;
}

export interface TestApp {
  app: Kiln['app'];
  engine: Kiln['engine'];
  workspaces: Kiln['workspaces'];
  agent: Kiln['agent'];
  events: Kiln['events'];
  /** Sandbox templates; their builds are jobs of `evolution.jobs` (drained by the tests). */
  templates: Kiln['templates'];
  /** Reviews and dreams; its job runner is not started: tests run due jobs with `evolution.jobs.drain()`. */
  evolution: Kiln['evolution'];
  /** News of writes that make cached keys, sessions and settings stale (from this and other replicas). */
  news: Kiln['news'];
  /** The replicas sharing its database; not opened: a test that serves the app over HTTP opens it with its URL. */
  replicas: Kiln['replicas'];
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
  /** Turns the app's statement timing (its metrics' listener, on from the start as in production) off or on again. */
  timeStatements(on: boolean): void;
  close(): Promise<void>;
}

/**
 * The real app in-process, wired by the server's own `compose`, on a real, freshly migrated
 * database and the real Docker Engine (`sandbox: false`: no container runtime, for suites that
 * run no code). Its job runner and the background re-index are not started: tests drive them.
 */
export async function createTestApp(
  opts: {
    driver?: Driver;
    /** Another Postgres server to make the database on (its admin URL); default the suite's. */
    pgAdminUrl?: string;
    rateLimit?: { perMinute: number; burst: number };
    bodyLimitBytes?: number;
    /** The clock of the rate limiter and of memory search's recency. */
    now?: () => number;
    /** The job runner's clock (due times, leases, webhook retry schedules); default the wall clock. */
    jobsNow?: () => number;
    /** Engine timings and limits, or false for no container runtime (running code answers 503). */
    sandbox?: Partial<EngineOptions> | false;
    /**
     * The sandbox backend (default: the Docker Engine); the unit tests give the in-process fake; a
     * function is given the app's database (a fleet of nodes reads its registry there).
     */
    backend?: SandboxBackend | ((db: Db) => SandboxBackend);
    embedder?: Embedder;
    /** The memory vectors' first wait after a failed embedding. */
    vectorRetryMs?: number;
    maxFileBytes?: number;
    /** Another app's database and workspaces directory: a second replica of it (neither is dropped by this app's close). */
    replicaOf?: TestApp;
    /** How long this app's runs are its own without renewal (default 60 s). */
    runLeaseMs?: number;
    /** Where the built dashboard is (default apps/dashboard/dist). */
    dashboardDir?: string;
    /** An OpenAI-compatible endpoint (the scripted fake) and its default model. */
    model?: { baseURL: string; model: string; maxRetries?: number };
    /** Mount the platform's self-update routes (/v1/system/…), on this checkout as the source. */
    selfUpdate?: boolean;
    /** More server settings (KILN_* variables), applied last. */
    env?: Record<string, string>;
  } = {},
): Promise<TestApp> {
  const replica = opts.replicaOf;
  const database = replica
    ? await replica.database.reopen()
    : await createTestDatabase(opts.driver ?? 'postgres', opts.pgAdminUrl);
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
  const workspacesDir = replica?.workspacesDir ?? mkdtempSync(join(tmpdir(), 'kiln-ws-'));
  const config = loadConfig({
    // A unique owner per app, so parallel test files never reap each other's sandboxes.
    KILN_INSTANCE_ID: `test-${randomBytes(4).toString('hex')}`,
    // The image under test (a new build's tag); the default is kiln-sandbox:latest.
    ...(process.env.KILN_SANDBOX_IMAGE ? { KILN_SANDBOX_IMAGE: process.env.KILN_SANDBOX_IMAGE } : {}),
    KILN_SANDBOX_POOL_SIZE: '0',
    // Words only, so rankings do not move as vectors arrive in the background; the suites of the
    // vectors (memory-search, memory-vectors) give an embedder or KILN_EMBEDDINGS_MODEL.
    KILN_EMBEDDINGS_MODEL: 'none',
    // Filled containers for recent workspaces hold extra mounts: the suites that want them say so.
    KILN_SANDBOX_PREPARED_POOL_SIZE: '0',
    // A test app that closes is gone for good: its live sandboxes go with it (sandbox-pause.test.ts
    // turns pausing them at shutdown back on, as a server has it).
    KILN_SANDBOX_PAUSE_AT_SHUTDOWN: 'off',
    KILN_SECRETS_KEY: SECRETS_KEY,
    KILN_WORKSPACES_DIR: workspacesDir,
    // Each sandbox's workspace mount (sandbox/workspace-mounts.ts) beside the workspaces, not in the checkout.
    KILN_SANDBOX_MOUNT_DIR: `${workspacesDir}.mounts`,
    KILN_WORKSPACE_TEMPLATE: TEMPLATE,
    KILN_WORKSPACE_MAX_FILE_BYTES: String(opts.maxFileBytes ?? 1024 * 1024),
    KILN_BODY_LIMIT_BYTES: String(opts.bodyLimitBytes ?? 1024 * 1024),
    KILN_RATE_LIMIT_PER_MINUTE: String(opts.rateLimit?.perMinute ?? 1_000_000),
    KILN_RATE_LIMIT_BURST: String(opts.rateLimit?.burst ?? 1_000_000),
    ...(opts.model
      ? { OPENAI_BASE_URL: opts.model.baseURL, OPENAI_API_KEY: 'test-key', KILN_MODEL: opts.model.model }
      : {}),
    KILN_MODEL_MAX_RETRIES: String(opts.model?.maxRetries ?? 0),
    KILN_MODEL_TIMEOUT_S: '30',
    // Jobs are run by the tests (evolution.jobs.drain()), not by a poller.
    KILN_JOBS_POLL_MS: '60000',
    KILN_JOBS_LEASE_S: '60',
    KILN_EVOLUTION_TICK_S: '60',
    ...opts.env,
  });
  // The app's statement listener, kept so that timeStatements(false) can take it off the database.
  let statementListener: StatementListener | undefined;
  let stopListening: (() => void) | undefined;
  const kiln = compose({
    config: { ...config, runLeaseMs: opts.runLeaseMs ?? 60_000 },
    db: database.db,
    listen: database.listen,
    lock: database.lock,
    onStatement: (listener) => {
      statementListener = listener;
      stopListening = database.onStatement(listener);
      return () => {
        stopListening?.();
        stopListening = undefined;
      };
    },
    sandboxes:
      opts.sandbox === false
        ? null
        : ((typeof opts.backend === 'function' ? opts.backend(database.db) : opts.backend) ??
          new DockerBackend(connectDocker(process.env.DOCKER_HOST), {
            egress: egressOf(config, logger),
            fairShare: config.sandbox.fairShare && { ...config.sandbox.fairShare, log: logger },
            probeImage: config.sandboxImage,
          })),
    logger,
    selfUpdate: opts.selfUpdate ?? false,
    embedder: opts.embedder,
    vectorRetryMs: opts.vectorRetryMs,
    // runc unless a test asks for another: only the suites written for both runtimes pay for gVisor.
    engine: { defaultRuntime: 'runc', ...(opts.sandbox || {}) },
    now: opts.now,
    jobsNow: opts.jobsNow,
    dashboardDir: opts.dashboardDir,
  });
  await kiln.start({ background: false, repair: !replica });
  const { app, engine, workspaces, agent, events, evolution, templates, news } = kiln;

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
    return {
      status: res.status,
      headers: res.headers,
      body: ct.includes('json') ? await res.json() : await res.text(),
    };
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
      const k = await call('POST', `/v1/teams/${t.body.id}/keys`, {
        key: adminKey,
        body: { name: `${role} key`, role },
      });
      if (k.status !== 201) throw new Error(`key create failed: ${JSON.stringify(k.body)}`);
      return { id: t.body.id, key: k.body.key };
    },
    timeStatements(on) {
      if (on && !stopListening && statementListener) stopListening = database.onStatement(statementListener);
      if (!on) {
        stopListening?.();
        stopListening = undefined;
      }
    },
    engine,
    workspaces,
    agent,
    events,
    evolution,
    templates,
    news,
    replicas: kiln.replicas,
    async close() {
      await kiln.stop();
      if (replica) return database.close();
      await database.drop();
      rmSync(workspacesDir, { recursive: true, force: true });
      rmSync(`${workspacesDir}.mounts`, { recursive: true, force: true });
    },
  };
}
