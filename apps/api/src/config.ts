import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { parseCidr } from './lib/cidr.ts';
import { ConfigError } from './lib/errors.ts';
import { parseAllowEntry } from './lib/outbound.ts';
import { DEFAULT_CHECK_TESTS } from './platform/self-check.ts';
import { installationSecretsKey, parseKey } from './secrets/sealing.ts';
import { MAX_ALLOW } from './workspace/egress-allow.ts';
import type { QuotaMax } from './workspace/quota.ts';
import type { WebhookOptions } from './webhooks/service.ts';
import { SANDBOX_RUNTIMES, type SandboxRuntime } from './workspace/settings.ts';

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

const schema = z.object({
  KILN_PORT: int(0, 65535).default(7700),
  KILN_HOST: z.string().min(1).default('127.0.0.1'),
  KILN_DATA_DIR: z.string().min(1).default('./data'),
  DATABASE_URL: z
    .string()
    .regex(/^postgres(ql)?:\/\//, 'must be a postgres:// or postgresql:// URL')
    .optional(),
  KILN_ADMIN_KEY: z
    .string()
    .regex(
      /^kiln_admin_[A-Za-z0-9_-]{24,}$/,
      'must look like kiln_admin_ followed by at least 24 letters, digits, _ or -',
    )
    .optional(),
  KILN_SECRETS_KEY: z
    .string()
    .refine(
      (v) => parseKey(v) !== undefined,
      'must be 32 bytes written as base64 or hex (e.g. openssl rand -base64 32)',
    )
    .optional(),
  KILN_LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  KILN_BODY_LIMIT_BYTES: int(1024, 100 * 1024 * 1024).default(5 * 1024 * 1024),
  KILN_RATE_LIMIT_PER_MINUTE: int(1, 1_000_000).default(600),
  KILN_RATE_LIMIT_BURST: int(1, 1_000_000).default(120),
  KILN_SANDBOX_IMAGE: z.string().min(1).default('kiln-sandbox:latest'),
  DOCKER_HOST: z.string().optional(),
  KILN_SHUTDOWN_GRACE_MS: int(0, 600_000).default(10_000),
  KILN_INSTANCE_ID: z
    .string()
    .regex(/^[A-Za-z0-9._-]{1,64}$/, 'letters, digits, . _ - only (max 64)')
    .optional(),
  // Where the other API replicas reach this one (http/replicas.ts); unset, its listening address
  // (this host's name when it listens on every interface).
  KILN_REPLICA_URL: z
    .string()
    .url()
    .regex(/^https?:\/\/[^/?#]+$/, 'http(s)://host:port, with no path')
    .optional(),
  KILN_SANDBOX_POOL_SIZE: int(0, 64).default(2),
  // Warm containers kept filled with a recently used workspace's tree (host mounts only; 0: none).
  KILN_SANDBOX_PREPARED_POOL_SIZE: int(0, 16).default(2),
  KILN_SANDBOX_IDLE_S: int(10, 7 * 86_400).default(900),
  // The most a workspace's sandbox.idle_s may be (within the bounds workspace/settings.ts gives it).
  KILN_SANDBOX_MAX_IDLE_S: int(60, 30 * 86_400).default(86_400),
  KILN_SANDBOX_MAX_LIFETIME_S: int(60, 30 * 86_400).default(43_200),
  // Idle gVisor sandboxes are paused (checkpointed to disk) rather than removed, where dockerd can.
  KILN_SANDBOX_PAUSE: z.enum(['on', 'off']).default('on'),
  KILN_SANDBOX_PAUSED_TTL_S: int(0, 30 * 86_400).default(7 * 86_400),
  KILN_SANDBOX_MAX_PAUSED_TTL_S: int(0, 30 * 86_400).default(30 * 86_400),
  KILN_SANDBOX_PAUSED_MAX_MB_PER_TEAM: int(1, 16_777_216).default(10_240),
  KILN_SANDBOX_PAUSED_MAX_MB: int(1, 16_777_216).default(51_200),
  // At shutdown, live sandboxes that can be paused are paused (their sessions resume them after the restart).
  KILN_SANDBOX_PAUSE_AT_SHUTDOWN: z.enum(['on', 'off']).default('on'),
  KILN_SANDBOX_MAX_PER_TEAM: int(1, 10_000).default(10),
  KILN_SANDBOX_REAP_INTERVAL_S: int(1, 3600).default(60),
  KILN_SANDBOX_MAX_MEMORY_MB: int(64, 1_048_576).default(4096),
  KILN_SANDBOX_MAX_CPUS: z.coerce.number().min(0.1).max(1024).default(2),
  KILN_SANDBOX_MAX_PIDS: int(16, 1_000_000).default(1024),
  KILN_SANDBOX_MAX_TIMEOUT_S: int(1, 86_400).default(600),
  KILN_SANDBOX_MAX_DISK_MB: int(16, 1_048_576).default(2048),
  // Comma list of the runtimes workspaces may pick; unset, runc plus gvisor when dockerd has kiln-gvisor-nonet.
  KILN_SANDBOX_RUNTIMES: z
    .string()
    .transform((v) => v.split(',').map((r) => r.trim()))
    .pipe(
      z
        .array(z.enum(SANDBOX_RUNTIMES, { message: `each must be one of ${SANDBOX_RUNTIMES.join(', ')}` }))
        .min(1)
        .refine((l) => new Set(l).size === l.length, 'lists a runtime twice'),
    )
    .optional(),
  KILN_SANDBOX_MAX_OUTPUT_BYTES: int(1024, 64 * 1024 * 1024).default(65_536),
  // How a new sandbox gets the workspace (sandbox/workspace-mounts.ts): a host tmpfs of its own
  // bind-mounted at /workspace, filled by a local copy (auto: when possible), or a tar through the runner.
  KILN_SANDBOX_WORKSPACE_MOUNT: z.enum(['auto', 'on', 'off']).default('auto'),
  KILN_SANDBOX_MOUNT_DIR: z.string().min(1).optional(),
  // What this instance's workspace mounts together may be sized at (host memory); default: half the host's.
  KILN_SANDBOX_MOUNT_MAX_MB: int(1, 1_048_576).optional(),
  // Fair share of the host (sandbox/docker/cgroups.ts): each team's sandboxes in one cgroup with
  // one CPU/IO weight, under a parent for all sandboxes weighted below the rest of the host.
  // auto: where the host allows it (local engine, cgroupfs driver, cgroup fs writable), else off, logged.
  KILN_SANDBOX_FAIR_SHARE: z.enum(['on', 'off', 'auto']).default('auto'),
  KILN_SANDBOX_CGROUP: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,64}$/, 'a cgroup name: letters, digits, _ - only (max 64)')
    .default('kiln'),
  KILN_SANDBOX_CPU_WEIGHT: int(1, 10_000).default(50),
  KILN_SANDBOX_TEAM_WEIGHT: int(1, 10_000).default(100),
  // A cap on each team's sandboxes' CPUs together; unset, none (the weights share what is free).
  KILN_SANDBOX_TEAM_MAX_CPUS: z.coerce.number().min(0.1).max(1024).optional(),
  // Sandbox nodes (docs/scaling.md): on, new sandboxes are placed across the registered nodes
  // (and this host's engine unless KILN_SANDBOX_LOCAL=off), reached with this replica's certificate.
  KILN_SANDBOX_NODES: z.enum(['on', 'off']).default('off'),
  KILN_SANDBOX_LOCAL: z.enum(['on', 'off']).default('on'),
  KILN_NODE_CERT: z.string().min(1).optional(),
  KILN_NODE_KEY: z.string().min(1).optional(),
  KILN_NODE_CA: z.string().min(1).optional(),
  // Egress: whether workspaces may set sandbox.network = allowlist, and how the proxy is set up.
  KILN_EGRESS: z.enum(['on', 'off']).default('on'),
  KILN_EGRESS_IMAGE: z.string().min(1).default('kiln-egress:latest'),
  // off: gVisor sandboxes get no egress bridge (allowlist workspaces then run under runc).
  KILN_EGRESS_GVISOR: z.enum(['on', 'off']).default('on'),
  KILN_EGRESS_MAX_ALLOW: int(0, MAX_ALLOW).default(MAX_ALLOW),
  KILN_EGRESS_SUBNETS: z
    .string()
    .refine((v) => {
      const c = parseCidr(v);
      return c !== undefined && c.prefix >= 8 && c.prefix <= 24;
    }, 'must be an IPv4 CIDR from /8 to /24, e.g. 10.231.0.0/16')
    .default('10.231.0.0/16'),
  KILN_EGRESS_UPSTREAM_NETWORK: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/, 'a Docker network name')
    .optional(),
  KILN_WORKSPACES_DIR: z.string().min(1).optional(),
  KILN_WORKSPACE_TEMPLATE: z.string().min(1).optional(),
  KILN_WORKSPACE_MAX_FILE_BYTES: int(1024, 100 * 1024 * 1024).default(1024 * 1024),
  KILN_SANDBOX_MAX_FILES_PER_STEP: int(1, 1_000_000).default(10_000),
  // A step's changes come back in one runner frame (base64, at most 64 MiB).
  KILN_SANDBOX_MAX_BYTES_PER_STEP: int(1024, 32 * 1024 * 1024).default(32 * 1024 * 1024),
  KILN_WORKSPACE_MAX_FILES: int(1, 10_000_000).default(50_000),
  // Neither copy into a new sandbox holds the working tree in the API's memory (a host mount's copy
  // is file to file, the tar path streams 4 MiB frames): the sandbox's /workspace bounds it.
  KILN_WORKSPACE_MAX_BYTES: int(1024, 1024 ** 4).default(200 * 1024 * 1024),
  // One team's share of the host's disk: its live workspaces, and their working trees' bytes together.
  KILN_WORKSPACES_MAX_PER_TEAM: int(1, 100_000).default(50),
  KILN_TEAM_WORKSPACE_BYTES_MAX: int(1024, 1024 ** 5).default(2 * 1024 ** 3),
  OPENAI_BASE_URL: z.string().url().optional(),
  OPENAI_API_KEY: z.string().min(1).optional(),
  KILN_EMBEDDINGS_MODEL: z.string().min(1).max(200).optional(),
  KILN_MODEL: z.string().min(1).max(200).optional(),
  KILN_MODEL_MAX_RETRIES: int(0, 10).default(3),
  KILN_MODEL_TIMEOUT_S: int(1, 3600).default(120),
  KILN_SOURCE_DIR: z.string().min(1).optional(),
  KILN_SELF_CHECK_TIMEOUT_S: int(10, 7200).default(600),
  KILN_SELF_CHECK_TESTS: z
    .string()
    .max(2000)
    .transform((s) => s.split(/\s+/).filter(Boolean))
    .pipe(
      z
        .array(
          z
            .string()
            .regex(
              /^(?!-)(?!\/)(?!.*(?:^|\/)\.\.(?:\/|$))[A-Za-z0-9_./-]+$/,
              'each entry is a test file or directory inside the checkout: letters, digits, _ . / -, not absolute, no .., not an option',
            ),
        )
        .min(1)
        .max(50),
    )
    .default(DEFAULT_CHECK_TESTS),
  KILN_RESTART_STOP_TIMEOUT_S: int(1, 3600).default(60),
  KILN_RESTART_READY_TIMEOUT_S: int(1, 3600).default(60),
  KILN_EVOLUTION_TICK_S: int(1, 3600).default(60),
  KILN_JOBS_POLL_MS: int(50, 600_000).default(2000),
  KILN_JOBS_LEASE_S: int(5, 86_400).default(300),
  KILN_RUN_LEASE_S: int(3, 3_600).default(60),
  // Templates: where their pip packages (wheels only) and apt packages come from, and their bounds.
  KILN_PIP_INDEX_URL: z
    .string()
    .url()
    .regex(/^https?:\/\//, 'must be an http(s) URL')
    .default('https://pypi.org/simple'),
  // Also debootstrap's (sandbox-image/build.ts), which takes file: mirrors too; templates use only an http(s) one.
  KILN_DEBIAN_MIRROR: z
    .string()
    .regex(/^[a-z]+:\S+$/, 'must be a mirror URL without spaces')
    .optional(),
  KILN_TEMPLATE_BUILD_TIMEOUT_S: int(5, 6 * 3600).default(1200),
  KILN_TEMPLATE_MAX_LOG_BYTES: int(4096, 16 * 1024 * 1024).default(256 * 1024),
  KILN_TEMPLATE_POOL_SIZE: int(0, 8).default(1),
  // Builds run in a lane of their own, never ahead of reviews and dreams; one team's builds take
  // at most KILN_TEMPLATE_BUILD_TEAM_CONCURRENCY of its slots, across replicas.
  KILN_TEMPLATE_BUILD_CONCURRENCY: int(1, 16).default(2),
  KILN_TEMPLATE_BUILD_TEAM_CONCURRENCY: int(1, 16).default(1),
  KILN_TEMPLATES_MAX_PER_TEAM: int(1, 10_000).default(20),
  KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM: int(1, 1000).default(3),
  /** Non-public addresses (or CIDRs) that tenant-chosen URLs (MCP servers, webhooks) may reach, comma-separated. */
  KILN_OUTBOUND_ALLOW: z
    .string()
    .refine(
      (v) => v.split(',').every((x) => !x.trim() || parseAllowEntry(x) !== null),
      'must be comma-separated IP addresses or CIDRs, e.g. 127.0.0.1,10.0.0.0/8',
    )
    .default(''),
  /** The bearer token Prometheus scrapes GET /metrics with (an org-admin key works too). */
  KILN_METRICS_TOKEN: z
    .string()
    .regex(/^[\x21-\x7e]{16,512}$/, 'must be 16 to 512 printable characters without spaces (e.g. openssl rand -hex 32)')
    .optional(),
  // The longest a workspace's MCP server may take to connect, to list its tools, or to answer one call.
  KILN_MCP_TIMEOUT_S: int(1, 600).default(30),
  // Webhooks: attempts per delivery, the first retry's wait (each later one 3 times longer, ±20 %), one attempt's deadline.
  KILN_WEBHOOK_MAX_ATTEMPTS: int(1, 20).default(8),
  KILN_WEBHOOK_RETRY_BASE_S: int(1, 86_400).default(60),
  KILN_WEBHOOK_TIMEOUT_S: int(1, 120).default(10),
  KILN_WEBHOOK_MAX_PER_TEAM: int(1, 1000).default(20),
  // Deliveries in flight at once in this server, and at most this many of them one team's (across replicas).
  KILN_WEBHOOK_CONCURRENCY: int(1, 256).default(8),
  KILN_WEBHOOK_TEAM_CONCURRENCY: int(1, 256).default(2),
  // How often the webhook lane looks for owed deliveries (events are owed by the statement that ends a run, elsewhere).
  KILN_WEBHOOK_POLL_MS: int(50, 60_000).default(500),
});

/** Settings whose values must never be echoed, even in an error. */
const SECRETS = new Set(['KILN_ADMIN_KEY', 'DATABASE_URL', 'OPENAI_API_KEY', 'KILN_SECRETS_KEY', 'KILN_METRICS_TOKEN']);

export type Config = {
  port: number;
  host: string;
  dataDir: string;
  databaseUrl?: string;
  adminKey?: string;
  logLevel: z.infer<typeof schema>['KILN_LOG_LEVEL'];
  bodyLimitBytes: number;
  rateLimit: { perMinute: number; burst: number };
  sandboxImage: string;
  dockerHost?: string;
  /**
   * KILN_SANDBOX_NODES=on: sandboxes on the registered nodes (sandbox/node/fleet.ts), and on this
   * host's engine too when `local`; the files of this replica's node-protocol certificate.
   */
  nodes?: { local: boolean; cert: string; key: string; ca: string };
  shutdownGraceMs: number;
  /**
   * Stable across restarts of this server, distinct between replicas and installations: it
   * owns its containers. Unset, it is made once and kept in `<dataDir>/instance-id`.
   */
  instanceId: string;
  /** KILN_REPLICA_URL: where the other replicas reach this one; unset, decided once listening (server.ts). */
  replicaUrl?: string;
  /**
   * The key that seals workspace secrets (AES-256-GCM). Unset, it is made once and kept in
   * `<dataDir>/secrets.key` (mode 0600).
   */
  secretsKey: Buffer;
  workspaces: {
    dir: string;
    template: string;
    maxFileBytes: number;
    maxQuota: QuotaMax;
    /** Per team: how many live workspaces, and how many bytes of working trees together. */
    perTeam: { count: number; bytes: number };
  };
  openai: {
    baseURL?: string;
    apiKey?: string;
    /** `builtin`: the encoder inside Kiln; another name: that model of the endpoint; unset (or `none`): no vectors. */
    embeddingsModel?: string;
    model?: string;
    maxRetries: number;
    timeoutMs: number;
  };
  /** Durable jobs (reviews, dreams): how often to look for due ones, how long a claim lasts without a heartbeat. */
  jobs: { pollMs: number; leaseMs: number };
  /** How long a run is its server's without renewal (renewed every third of it). */
  runLeaseMs: number;
  /** How often idle sessions and dream schedules are checked. */
  evolutionTickMs: number;
  sandbox: {
    poolSize: number;
    preparedPoolSize: number;
    idleS: number;
    /** The largest `sandbox.idle_s` a workspace may set. */
    maxIdleS: number;
    maxLifetimeS: number;
    /** Pausing idle sandboxes (KILN_SANDBOX_PAUSE*); off: idle sandboxes are removed. */
    pause: {
      enabled: boolean;
      ttlS: number;
      maxTtlS: number;
      maxMbPerTeam: number;
      maxMb: number;
      /** Live sandboxes that can be are paused at shutdown rather than removed. */
      atShutdown: boolean;
    };
    perTeamMax: number;
    reapIntervalS: number;
    maxOutputBytes: number;
    /** The runtimes workspaces may pick (KILN_SANDBOX_RUNTIMES); unset, decided at start-up from what dockerd has. */
    runtimes?: SandboxRuntime[];
    max: { memoryMb: number; cpus: number; pids: number; timeoutS: number; diskMb: number };
    /**
     * KILN_SANDBOX_FAIR_SHARE on or auto: the team cgroups' parent and weights (sandbox/docker/cgroups.ts),
     * with `auto` where the host decides (else no fair share, logged); off, unset.
     */
    fairShare?: { parent: string; parentWeight: number; teamWeight: number; teamCpus?: number; auto: boolean };
    /** Host workspace mounts (sandbox/workspace-mounts.ts). */
    workspaceMount: {
      mode: 'auto' | 'on' | 'off';
      dir: string;
      maxMb: number;
    };
  };
  /** Sandbox templates: package sources, build bounds, warm containers per template in use. */
  templates: {
    pipIndexUrl: string;
    debianMirror?: string;
    buildTimeoutMs: number;
    maxLogBytes: number;
    poolSize: number;
    /** The build lane: builds at once in this process, and of one team at once across replicas. */
    buildConcurrency: number;
    buildTeamConcurrency: number;
    /** Per team: templates, and templates waiting for (or in) a build. */
    maxPerTeam: number;
    maxQueuedPerTeam: number;
  };
  /**
   * Sandbox egress: off forbids `sandbox.network: allowlist` (and treats workspaces that have it
   * as none); the proxy image, the pool the sandboxes' own /29 networks are drawn from, and a
   * Docker network the proxy joins whose private addresses it may reach (tests' upstreams).
   */
  egress: {
    enabled: boolean;
    image: string;
    maxAllow: number;
    subnets: { base: number; prefix: number };
    upstreamNetwork?: string;
    /**
     * Where gVisor sandboxes' bridge sockets are made (egress.ts): under /run as root, else the
     * temporary directory; unset when the Docker Engine is not on this host (its gVisor sandboxes
     * then get no egress). Kept short: a Unix socket's path has at most 107 bytes.
     */
    bridgeDir?: string;
  };
  /**
   * Requests to URLs tenants chose (their MCP servers, webhook receivers) reach public addresses
   * only, and these non-public ones (KILN_OUTBOUND_ALLOW).
   */
  outbound: { allow: string[] };
  /** GET /metrics: the bearer token that may scrape it besides org-admin keys (KILN_METRICS_TOKEN). */
  metrics: { token?: string };
  /** The agent as an MCP client: each connect, tool listing and call to a workspace's server is cut off after this. */
  mcp: { timeoutMs: number };
  /** Webhook deliveries: attempts, backoff, deadline, webhooks per team, concurrency, poll (KILN_WEBHOOK_*). */
  webhooks: Omit<WebhookOptions, 'outboundAllow'>;
  /** Platform self-update: the git checkout of Kiln's own source and the deadlines of its steps. */
  selfUpdate: {
    sourceDir: string;
    checkTimeoutMs: number;
    /** What the self-check's test step runs (vitest paths inside the checkout). */
    checkTests: string[];
    stopTimeoutMs: number;
    readyTimeoutMs: number;
  };
};

/**
 * This installation's default instance id: made once (random, so two servers on one host with
 * their own data directories never share it) and read back from `<dataDir>/instance-id` after.
 */
export function installationInstanceId(dataDir: string): string {
  const file = join(dataDir, 'instance-id');
  try {
    const id = readFileSync(file, 'utf8').trim();
    if (/^[A-Za-z0-9._-]{1,64}$/.test(id)) return id;
  } catch (err) {
    if ((err as { code?: string }).code !== 'ENOENT') throw err;
  }
  mkdirSync(dataDir, { recursive: true });
  const id = `kiln-${randomBytes(8).toString('hex')}`;
  writeFileSync(file, `${id}\n`, { mode: 0o644 });
  return id;
}

/** Parses every setting once; a wrong value throws with one readable line per problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const vars = Object.fromEntries(Object.keys(schema.shape).map((k) => [k, env[k] === '' ? undefined : env[k]]));
  const parsed = schema.safeParse(vars);
  if (!parsed.success) {
    throw new ConfigError(
      parsed.error.issues.map((i) => {
        const name = String(i.path[0]);
        const got = SECRETS.has(name) ? 'value hidden' : `got ${JSON.stringify(vars[name])}`;
        return `${name}: ${i.message} (${got})`;
      }),
    );
  }
  const e = parsed.data;
  if (e.KILN_SANDBOX_NODES === 'on') {
    const missing = (['KILN_NODE_CERT', 'KILN_NODE_KEY', 'KILN_NODE_CA'] as const).filter((k) => !e[k]);
    if (missing.length)
      throw new ConfigError(
        missing.map(
          (k) =>
            `${k}: required with KILN_SANDBOX_NODES=on (this replica's node-protocol certificate, key and CA: npm run sandbox-node:credentials, docs/scaling.md)`,
        ),
      );
  }
  const fairShare = e.KILN_SANDBOX_FAIR_SHARE !== 'off';
  return {
    port: e.KILN_PORT,
    host: e.KILN_HOST,
    dataDir: resolve(e.KILN_DATA_DIR),
    databaseUrl: e.DATABASE_URL,
    adminKey: e.KILN_ADMIN_KEY,
    logLevel: e.KILN_LOG_LEVEL,
    bodyLimitBytes: e.KILN_BODY_LIMIT_BYTES,
    rateLimit: { perMinute: e.KILN_RATE_LIMIT_PER_MINUTE, burst: e.KILN_RATE_LIMIT_BURST },
    sandboxImage: e.KILN_SANDBOX_IMAGE,
    dockerHost: e.DOCKER_HOST,
    nodes:
      e.KILN_SANDBOX_NODES === 'on'
        ? { local: e.KILN_SANDBOX_LOCAL === 'on', cert: e.KILN_NODE_CERT!, key: e.KILN_NODE_KEY!, ca: e.KILN_NODE_CA! }
        : undefined,
    shutdownGraceMs: e.KILN_SHUTDOWN_GRACE_MS,
    replicaUrl: e.KILN_REPLICA_URL,
    get instanceId() {
      // Asked for (by the server) rather than made while parsing: loading the configuration writes nothing.
      return e.KILN_INSTANCE_ID ?? installationInstanceId(resolve(e.KILN_DATA_DIR));
    },
    get secretsKey() {
      const key = e.KILN_SECRETS_KEY;
      return key ? parseKey(key)! : installationSecretsKey(resolve(e.KILN_DATA_DIR));
    },
    workspaces: {
      dir: resolve(e.KILN_WORKSPACES_DIR ?? join(e.KILN_DATA_DIR, 'workspaces')),
      template: resolve(
        e.KILN_WORKSPACE_TEMPLATE ?? fileURLToPath(new URL('../../../workspace-template', import.meta.url)),
      ),
      maxFileBytes: e.KILN_WORKSPACE_MAX_FILE_BYTES,
      maxQuota: {
        filesPerStep: e.KILN_SANDBOX_MAX_FILES_PER_STEP,
        bytesPerStep: e.KILN_SANDBOX_MAX_BYTES_PER_STEP,
        files: e.KILN_WORKSPACE_MAX_FILES,
        bytes: e.KILN_WORKSPACE_MAX_BYTES,
      },
      perTeam: { count: e.KILN_WORKSPACES_MAX_PER_TEAM, bytes: e.KILN_TEAM_WORKSPACE_BYTES_MAX },
    },
    jobs: { pollMs: e.KILN_JOBS_POLL_MS, leaseMs: e.KILN_JOBS_LEASE_S * 1000 },
    runLeaseMs: e.KILN_RUN_LEASE_S * 1000,
    evolutionTickMs: e.KILN_EVOLUTION_TICK_S * 1000,
    openai: {
      baseURL: e.OPENAI_BASE_URL,
      apiKey: e.OPENAI_API_KEY,
      embeddingsModel: e.KILN_EMBEDDINGS_MODEL === 'none' ? undefined : (e.KILN_EMBEDDINGS_MODEL ?? 'builtin'),
      model: e.KILN_MODEL,
      maxRetries: e.KILN_MODEL_MAX_RETRIES,
      timeoutMs: e.KILN_MODEL_TIMEOUT_S * 1000,
    },
    sandbox: {
      // With fair share a container's cgroup is fixed when it is created: warm ones are made for
      // a team (the pool keeps them for the teams that started sandboxes last, pool.ts).
      poolSize: e.KILN_SANDBOX_POOL_SIZE,
      preparedPoolSize: e.KILN_SANDBOX_PREPARED_POOL_SIZE,
      fairShare: fairShare
        ? {
            parent: e.KILN_SANDBOX_CGROUP,
            parentWeight: e.KILN_SANDBOX_CPU_WEIGHT,
            teamWeight: e.KILN_SANDBOX_TEAM_WEIGHT,
            teamCpus: e.KILN_SANDBOX_TEAM_MAX_CPUS,
            auto: e.KILN_SANDBOX_FAIR_SHARE === 'auto',
          }
        : undefined,
      idleS: e.KILN_SANDBOX_IDLE_S,
      maxIdleS: e.KILN_SANDBOX_MAX_IDLE_S,
      maxLifetimeS: e.KILN_SANDBOX_MAX_LIFETIME_S,
      pause: {
        enabled: e.KILN_SANDBOX_PAUSE === 'on',
        ttlS: e.KILN_SANDBOX_PAUSED_TTL_S,
        maxTtlS: e.KILN_SANDBOX_MAX_PAUSED_TTL_S,
        maxMbPerTeam: e.KILN_SANDBOX_PAUSED_MAX_MB_PER_TEAM,
        maxMb: e.KILN_SANDBOX_PAUSED_MAX_MB,
        atShutdown: e.KILN_SANDBOX_PAUSE_AT_SHUTDOWN === 'on',
      },
      perTeamMax: e.KILN_SANDBOX_MAX_PER_TEAM,
      reapIntervalS: e.KILN_SANDBOX_REAP_INTERVAL_S,
      maxOutputBytes: e.KILN_SANDBOX_MAX_OUTPUT_BYTES,
      runtimes: e.KILN_SANDBOX_RUNTIMES,
      max: {
        memoryMb: e.KILN_SANDBOX_MAX_MEMORY_MB,
        cpus: e.KILN_SANDBOX_MAX_CPUS,
        pids: e.KILN_SANDBOX_MAX_PIDS,
        timeoutS: e.KILN_SANDBOX_MAX_TIMEOUT_S,
        diskMb: e.KILN_SANDBOX_MAX_DISK_MB,
      },
      workspaceMount: {
        mode: e.KILN_SANDBOX_WORKSPACE_MOUNT,
        dir: resolve(e.KILN_SANDBOX_MOUNT_DIR ?? join(e.KILN_DATA_DIR, 'sandbox-workspaces')),
        maxMb: e.KILN_SANDBOX_MOUNT_MAX_MB ?? Math.floor(totalmem() / (2 * 1024 * 1024)),
      },
    },
    templates: {
      pipIndexUrl: e.KILN_PIP_INDEX_URL,
      debianMirror: /^https?:\/\//.test(e.KILN_DEBIAN_MIRROR ?? '') ? e.KILN_DEBIAN_MIRROR : undefined,
      buildTimeoutMs: e.KILN_TEMPLATE_BUILD_TIMEOUT_S * 1000,
      maxLogBytes: e.KILN_TEMPLATE_MAX_LOG_BYTES,
      poolSize: e.KILN_TEMPLATE_POOL_SIZE,
      buildConcurrency: e.KILN_TEMPLATE_BUILD_CONCURRENCY,
      buildTeamConcurrency: e.KILN_TEMPLATE_BUILD_TEAM_CONCURRENCY,
      maxPerTeam: e.KILN_TEMPLATES_MAX_PER_TEAM,
      maxQueuedPerTeam: e.KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM,
    },
    egress: {
      enabled: e.KILN_EGRESS === 'on',
      image: e.KILN_EGRESS_IMAGE,
      maxAllow: e.KILN_EGRESS_MAX_ALLOW,
      subnets: parseCidr(e.KILN_EGRESS_SUBNETS)!,
      upstreamNetwork: e.KILN_EGRESS_UPSTREAM_NETWORK,
      bridgeDir:
        e.KILN_EGRESS_GVISOR === 'on' && (!e.DOCKER_HOST || e.DOCKER_HOST.startsWith('unix://'))
          ? process.getuid?.() === 0
            ? '/run/kiln-egress-bridge'
            : join(tmpdir(), `kiln-egress-bridge-${process.getuid?.() ?? 0}`)
          : undefined,
    },
    outbound: {
      allow: e.KILN_OUTBOUND_ALLOW.split(',')
        .map((x) => x.trim())
        .filter(Boolean),
    },
    metrics: { token: e.KILN_METRICS_TOKEN },
    mcp: { timeoutMs: e.KILN_MCP_TIMEOUT_S * 1000 },
    webhooks: {
      maxAttempts: e.KILN_WEBHOOK_MAX_ATTEMPTS,
      retryBaseMs: e.KILN_WEBHOOK_RETRY_BASE_S * 1000,
      timeoutMs: e.KILN_WEBHOOK_TIMEOUT_S * 1000,
      maxPerTeam: e.KILN_WEBHOOK_MAX_PER_TEAM,
      concurrency: e.KILN_WEBHOOK_CONCURRENCY,
      teamConcurrency: e.KILN_WEBHOOK_TEAM_CONCURRENCY,
      pollMs: e.KILN_WEBHOOK_POLL_MS,
    },
    selfUpdate: {
      sourceDir: resolve(e.KILN_SOURCE_DIR ?? fileURLToPath(new URL('../../..', import.meta.url))),
      checkTimeoutMs: e.KILN_SELF_CHECK_TIMEOUT_S * 1000,
      checkTests: e.KILN_SELF_CHECK_TESTS,
      stopTimeoutMs: e.KILN_RESTART_STOP_TIMEOUT_S * 1000,
      readyTimeoutMs: e.KILN_RESTART_READY_TIMEOUT_S * 1000,
    },
  };
}
