import { and, desc, eq, gt, inArray, isNull, max, ne, type SQL } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { combine } from '../db/batch.ts';
import { sandboxes, workspaces } from '../db/schema/index.ts';
import { ApiError, ConfigError } from '../lib/errors.ts';
import { SecretMask, workspaceMask } from '../secrets/masking.ts';
import { type SecretSource, SecretUnreadable } from '../secrets/store.ts';
import type { KilnMetrics } from '../metrics/metrics.ts';
import { DEFAULT_SETTINGS, type SandboxRuntime, type WorkspaceSettings } from '../workspace/settings.ts';
import type { ContainerNetwork, EgressEvent, RuntimeOffer, SandboxBackend } from './backend.ts';
import { Containers } from './containers.ts';
import { webhookEventWrite } from '../webhooks/events.ts';
import { executionWrite, type ExecAudit } from './executions.ts';
import { reclaimAt } from './lifetime.ts';
import type { SandboxLimits } from './limits.ts';
import { noEgressIn, SandboxSettings } from './settings.ts';
import { LiveSandboxes, type ExecContext, type Live, type TemplateImages } from './live.ts';
import { WarmPool } from './pool.ts';
import { type WorkspaceMountOptions, WorkspaceMounts } from './workspace-mounts.ts';
import { Reaper } from './reaper.ts';
import { ACTIVE, markRemoved } from './rows.ts';
import {
  cancelledBeforeStart,
  notRun,
  RunnerGoneError,
  type OutputListener,
  type RunnerResult,
  type WorkspaceChanges,
} from './runner-client.ts';

/** How long a stopping server starts pausing its live sandboxes (stop); those not started by then are removed. */
const SHUTDOWN_PAUSE_MS = 20_000;

export type { ExecContext } from './live.ts';

export interface EngineOptions {
  image: string;
  /** This API instance; containers carry it so replicas never reap each other's live sandboxes. */
  instance: string;
  /**
   * Whether another API instance is known to be gone (not heard from lately, http/replicas.ts):
   * a running sandbox of its that this one can reach is taken over at its session's next request.
   */
  instanceGone?: (instance: string) => boolean;
  poolSize: number;
  /** Warm containers kept filled with a recently claimed workspace's tree (host mounts only). */
  preparedPoolSize?: number;
  /** The least time between two fills of a prepared container for one workspace (default 10 s). */
  prepareIntervalMs?: number;
  /** The most prepared containers being filled at once, for all workspaces together (default 2). */
  prepareConcurrency?: number;
  /** Warm containers kept of each template image workspaces use (see WarmPool.setTemplateImages). */
  templatePoolSize?: number;
  /** A session's sandbox idle this long is reclaimed, unless its workspace sets `sandbox.idle_s`. */
  idleMs: number;
  /** The largest `sandbox.idle_s` a workspace may set, in ms. */
  maxIdleMs: number;
  maxLifetimeMs: number;
  /** How long an idle sandbox stays paused when its workspace sets no `sandbox.paused_ttl_s`, and the most one may set. */
  pausedTtlMs?: number;
  maxPausedTtlMs?: number;
  /**
   * Idle sandboxes of the runtimes whose containers the backend can checkpoint are paused rather
   * than removed, their checkpoints within these bytes (a team's, and a host's together);
   * with `atShutdown`, so are the live ones that can be when the server stops (its next life, with
   * the same instance id, resumes them). Unset: never paused.
   */
  pause?: { maxBytes: { team: number; all: number }; atShutdown?: boolean };
  perTeamMax: number;
  /** Server-wide maxima that cap every workspace's settings. */
  maxLimits: SandboxLimits;
  maxOutputBytes: number;
  reapIntervalMs: number;
  /** KILN_SANDBOX_RUNTIMES; unset, runc plus gvisor when the backend has it (asked at start-up). */
  runtimes?: SandboxRuntime[];
  /**
   * The runtime of new workspaces that set none; unset, gvisor whenever it is offered. (The test
   * apps pin runc so that only the suites written for both runtimes pay for gVisor.)
   */
  defaultRuntime?: SandboxRuntime;
  /**
   * Whether `sandbox.network: allowlist` is permitted here (KILN_EGRESS) and the most patterns a
   * workspace may list.
   */
  egress?: { enabled: boolean; maxAllow: number };
  /** Clock for idle and lifetime decisions (injectable for tests). */
  now?: () => number;
  /** How a new sandbox gets the workspace (workspace-mounts.ts); unset, always the tar path. */
  workspaceMount?: WorkspaceMountOptions;
}

export interface ExecOptions {
  timeoutS?: number;
  /** Audit the execution in the same commit as its record. */
  audit?: ExecAudit;
  /** Do not write the record: return it as `record` for the caller to batch with its own writes. */
  deferRecord?: boolean;
  onOutput?: OutputListener;
  signal?: AbortSignal;
  /** What one step may sync back: the runner stops collecting changes one file past the cap. */
  sync?: { maxFiles: number; maxBytes: number };
}

/** A session's sandbox as its row says: running (or starting), paused to disk, or being resumed. */
export interface SessionSandbox {
  id: string;
  state: 'running' | 'paused' | 'resuming';
  runtime: SandboxRuntime;
  pausedAt: Date | null;
  checkpointBytes: number | null;
  /** Running: its idle deadline; paused: when its checkpoint is deleted. */
  expiresAt: Date;
}

export interface ExecOutcome extends Omit<RunnerResult, 'ok' | 'changes'> {
  sandbox_id: string;
  execution_id: string;
  /** Every request the code made through the egress proxy, allowed or refused (empty without a network). */
  egress: EgressEvent[];
}

/**
 * Owns every sandbox container of this API instance, in whatever runtime the backend is: the
 * warm pool (pool.ts), one live sandbox per session, claimed from the pool or created cold
 * (live.ts), the reaper that reconciles the runtime with the `sandboxes` table (reaper.ts),
 * and, here, executions and their record.
 */
export class SandboxEngine {
  private readonly containers: Containers;
  private readonly pool: WarmPool;
  private readonly live: LiveSandboxes;
  private readonly reaper: Reaper;
  /** What workspaces' sandbox settings may be here and what they mean (runtimes known once `start` has asked the backend). */
  readonly settings: SandboxSettings;
  /** The backend's sandboxes can mount a directory of this host (known once `start` has asked it). */
  private hostWorkspaceMounts = false;

  constructor(
    private readonly db: Db,
    private readonly backend: SandboxBackend,
    private readonly opts: EngineOptions,
    private readonly log: Logger,
    /** The workspace secrets each execution gets as environment variables (and masks in what comes back). */
    private readonly secrets: SecretSource,
    /** Where each execution that reached a runner is counted: its duration, timeouts, OOM kills. */
    private readonly metrics?: Pick<KilnMetrics, 'sandboxExecution' | 'paused' | 'resumed' | 'tookOver'>,
    /** Templates: a workspace's `sandbox.template` picks the image of its new sandboxes; without, only the base image. */
    templates?: TemplateImages,
  ) {
    const { image, instance, maxLifetimeMs, idleMs, perTeamMax } = opts;
    const now = () => this.now();
    this.containers = new Containers(backend, { image, instance, maxLifetimeMs, now }, log);
    this.settings = new SandboxSettings(opts);
    // Warm containers are created with the default settings, capped.
    const poolLimits = this.settings.limitsFor(DEFAULT_SETTINGS.sandbox);
    this.pool = new WarmPool(
      this.containers,
      {
        size: opts.poolSize,
        limits: poolLimits,
        key: { runtime: 'runc' },
        image,
        templateSize: opts.templatePoolSize ?? 0,
        preparedSize: opts.preparedPoolSize ?? 0,
        prepareIntervalMs: opts.prepareIntervalMs ?? 10_000,
        prepareConcurrency: opts.prepareConcurrency ?? 2,
      },
      log,
    );
    const deps = { db, backend, containers: this.containers, pool: this.pool, log };
    const pausedMaxBytes = opts.pause?.maxBytes;
    this.live = new LiveSandboxes(
      { ...deps, pauses: metrics },
      { image, instance, idleMs, perTeamMax, now, pausedMaxBytes, instanceGone: opts.instanceGone },
      templates,
    );
    this.reaper = new Reaper({ ...deps, live: this.live }, { instance, intervalMs: opts.reapIntervalMs, now });
  }

  /** The template images workspaces use now: the warm pool keeps a few containers of each, and drops the rest. */
  setTemplateImages(images: string[]): void {
    this.pool.setTemplateImages(images);
  }

  /** The warm containers ready now, by image. */
  warmImages(): string[] {
    return this.pool.warm.map((c) => c.image);
  }

  /** The names of the secrets a workspace's code gets as environment variables (never their values). */
  secretNames(workspaceId: string): Promise<string[]> {
    return this.secrets.names(workspaceId);
  }

  private async secretsFor(workspaceId: string) {
    try {
      return await this.secrets.openAll(workspaceId);
    } catch (err) {
      if (err instanceof SecretUnreadable) return err;
      throw err;
    }
  }

  private now(): number {
    return this.opts.now ? this.opts.now() : Date.now();
  }

  /** The context with its workspace's network as its row says now, when that may matter (see exec). */
  private async withNetworkNow(ctx: ExecContext): Promise<ExecContext> {
    if (!ctx.network && !this.live.get(ctx.sessionId)?.container.proxyUrl) return ctx;
    return { ...ctx, network: await this.networkNow(ctx.workspaceId) };
  }

  /** The network a workspace's sandboxes get now, read from its row (none once it is deleted). */
  private async networkNow(workspaceId: string): Promise<ContainerNetwork | undefined> {
    const [row] = await this.db
      .select({ settings: workspaces.settings })
      .from(workspaces)
      .where(and(eq(workspaces.id, workspaceId), isNull(workspaces.deletedAt)));
    const sandbox = (row?.settings as WorkspaceSettings | undefined)?.sandbox;
    return sandbox && this.settings.networkFor(sandbox);
  }

  /** A workspace's idle time changed: its running sandboxes, on every replica, count from their last use with it. */
  idleChanged(workspaceId: string, settings: Pick<WorkspaceSettings['sandbox'], 'idle_s'>): Promise<void> {
    return this.live.setIdle(workspaceId, this.settings.idleMsFor(settings));
  }

  /**
   * Moves the session's sandbox's idle deadline to now plus its workspace's idle time, whichever
   * replica holds it; null when the session has no sandbox running.
   */
  async keepAlive(
    sessionId: string,
    settings: Pick<WorkspaceSettings['sandbox'], 'idle_s'>,
  ): Promise<{ sandboxId: string; reclaimAt: Date } | null> {
    const idleMs = this.settings.idleMsFor(settings);
    const live = this.live.get(sessionId);
    if (live?.client.alive) {
      live.idleMs = idleMs;
      await this.live.touch(live);
      return { sandboxId: live.id, reclaimAt: reclaimAt(this.now() + idleMs, live.expiresAt) };
    }
    // Another replica's sandbox: its hard lifetime is known only from its container.
    const [kept] = await this.live.touchElsewhere(sessionId, idleMs);
    if (!kept) return null;
    const hard = kept.lifetimeEndsAt?.getTime() ?? (await this.hardExpiries()).get(kept.containerId);
    return { sandboxId: kept.id, reclaimAt: reclaimAt(this.now() + idleMs, hard) };
  }

  /** Each sandbox container's hard lifetime (epoch ms), by container id. */
  private async hardExpiries(): Promise<Map<string, number | undefined>> {
    return new Map((await this.backend.list()).map((c) => [c.id, c.expiresAt]));
  }

  /**
   * Decides the runtimes: those KILN_SANDBOX_RUNTIMES lists, each of which the container runtime
   * must have (else start-up fails, naming it), or, unset, every one it has.
   */
  private async resolveRuntimes(): Promise<void> {
    const caps = await this.backend.capabilities();
    this.hostWorkspaceMounts = caps.hostWorkspaceMounts;
    const available = caps.runtimes.map((o) => o.runtime);
    const withEgress = new Set(caps.runtimes.filter((o) => o.egress).map((o) => o.runtime));
    const wanted = this.opts.runtimes;
    const missing = (wanted ?? []).filter((r) => !available.includes(r));
    if (missing.length)
      throw new ConfigError([
        `KILN_SANDBOX_RUNTIMES: the container runtime has no ${missing.join(', ')} ` +
          '(for gvisor, dockerd needs the kiln-gvisor-nonet runtime: run infra/docker.sh as root)',
      ]);
    const offered = wanted ?? available;
    const defaultRt = this.opts.defaultRuntime ?? (offered.includes('gvisor') ? 'gvisor' : 'runc');
    if (!offered.includes(defaultRt))
      throw new ConfigError([`the default sandbox runtime ${defaultRt} is not among ${offered.join(', ')}`]);
    this.settings.useRuntimes(offered, defaultRt, withEgress);
    this.decidePause(caps.runtimes, offered);
    // Warm containers are for the runtime new workspaces get; a workspace with the other one starts cold.
    this.pool.use({ runtime: defaultRt }, caps);
  }

  /** Which runtimes' new sandboxes are made pausable: those the backend can checkpoint, unless KILN_SANDBOX_PAUSE=off. */
  private decidePause(offers: readonly RuntimeOffer[], offered: readonly SandboxRuntime[]): void {
    const can = offers.filter((o) => o.pause && offered.includes(o.runtime)).map((o) => o.runtime);
    const pausable = this.opts.pause ? can : [];
    this.containers.usePause(pausable);
    const wanted = offered.includes('gvisor') && this.opts.pause;
    if (wanted && !pausable.includes('gvisor') && !this.pauseOffLogged) {
      this.pauseOffLogged = true;
      const why = offers.find((o) => o.runtime === 'gvisor')?.pauseOff ?? 'the sandbox backend cannot checkpoint them';
      this.log.warn({ reason: why }, `idle gVisor sandboxes are removed, not paused: ${why}`);
    }
  }
  private pauseOffLogged = false;

  /**
   * Decides the runtimes and how sandboxes get the workspace (a host mount or the tar path, once,
   * logged), reaps what a previous life of this instance left behind, fills the pool, starts the reaper.
   */
  async start(): Promise<void> {
    await this.resolveRuntimes();
    // A fleet's runtimes follow its nodes: a node with gVisor (or egress) that joins is offered at once.
    this.backend.onCapabilities?.(() => {
      this.resolveRuntimes().catch((err) =>
        this.log.error({ err }, 'the sandbox backend changed what it offers and it cannot be used'),
      );
    });
    const m = this.opts.workspaceMount;
    this.containers.useMounts(
      m
        ? await WorkspaceMounts.open(
            { ...m, hostMounts: this.hostWorkspaceMounts && m.hostMounts !== false },
            this.opts.instance,
            this.log,
          )
        : null,
    );
    this.log.info({ runtimes: this.settings.runtimes, default: this.settings.defaultRuntime }, 'sandbox runtimes');
    await this.reap({ startup: true });
    // A previous life's proxy and sandbox networks: none of its sandboxes survived the reap.
    await this.backend.sweepEgress?.(this.opts.instance, { all: true });
    // With team-bound containers, warm ones for the teams that started sandboxes last, before a restart too.
    for (const { teamId, image } of (await this.recentClaims()).reverse()) this.pool.claimedBy(teamId, image);
    this.pool.fill();
    this.reaper.start();
  }

  /**
   * The teams that started sandboxes most recently (this week), with the image of each, most
   * recent first: more than the pool keeps, which takes the last of each kind (pool.ts).
   */
  private async recentClaims(): Promise<{ teamId: string; image: string }[]> {
    if (!this.opts.poolSize && !this.opts.templatePoolSize) return [];
    return this.db
      .select({ teamId: sandboxes.teamId, image: sandboxes.image })
      .from(sandboxes)
      .where(gt(sandboxes.createdAt, new Date(this.now() - 7 * 86_400_000)))
      .groupBy(sandboxes.teamId, sandboxes.image)
      .orderBy(desc(max(sandboxes.createdAt)))
      .limit(this.opts.poolSize + 16);
  }

  /**
   * Removes every container of this instance (the runner streams die with the process anyway),
   * except, with `pause.atShutdown`, the live sandboxes that can be paused: those are paused, so
   * that the instance's next life resumes them with their variables (a restart or an upgrade costs
   * a session nothing). Pauses start within SHUTDOWN_PAUSE_MS, two at a time; what is left after it
   * is removed as before.
   */
  async stop(): Promise<void> {
    this.pool.stop();
    this.reaper.stop();
    await this.live.stop();
    // A warm container still being started removes itself once it is up (the pool is stopped):
    // wait for it, or the process may exit and leave it running.
    await this.poolSettled();
    const warm = this.pool.drain();
    const [, paused] = await Promise.all([
      Promise.allSettled(warm.map((w) => this.containers.destroy(w))),
      this.opts.pause?.atShutdown ? this.pauseLive() : Promise.resolve(0),
    ]);
    if (paused)
      this.log.info({ paused }, 'paused live sandboxes at shutdown: their sessions resume them after the restart');
    await Promise.allSettled([...this.live.values()].map((l) => this.release(l.sessionId, 'shutdown')));
    await this.backend.sweepEgress?.(this.opts.instance, { all: true }).catch((err) => {
      this.log.warn({ err }, 'could not remove the egress proxy');
    });
  }

  /** Pauses the live sandboxes that can be (two at a time, each started within SHUTDOWN_PAUSE_MS); resolves with how many were. */
  private async pauseLive(): Promise<number> {
    const queue = [...this.live.values()].filter((l) => l.client.alive && !l.busy && this.live.canPause(l));
    const until = performance.now() + SHUTDOWN_PAUSE_MS;
    let paused = 0;
    const worker = async () => {
      for (let l = queue.shift(); l && performance.now() < until; l = queue.shift()) {
        const outcome = await this.live.pause(l.sessionId, 'shutdown').catch(() => undefined);
        if (outcome?.paused) paused++;
      }
    };
    await Promise.all([worker(), worker()]);
    return paused;
  }

  /**
   * A deleted workspace: the warm containers filled with its tree go, and so do its paused
   * sandboxes on this instance (their checkpoints hold what its code was given; another
   * replica's go at its next reaper pass).
   */
  async forgetWorkspace(workspaceId: string): Promise<void> {
    this.pool.forgetWorkspace(workspaceId);
    const paused = await this.db
      .select({ id: sandboxes.id, containerId: sandboxes.containerId })
      .from(sandboxes)
      .where(
        and(
          eq(sandboxes.workspaceId, workspaceId),
          eq(sandboxes.instance, this.opts.instance),
          eq(sandboxes.state, 'paused'),
        ),
      );
    for (const row of paused) await this.live.removePaused(row, 'workspace_deleted');
  }

  /** A commit changed the workspace's tree: a container the pool holds filled with it is refilled, in the background. */
  workspaceChanged(workspaceId: string): void {
    this.pool.changed(workspaceId);
  }

  get poolReady(): number {
    return this.pool.warm.length;
  }

  /** Resolves once the warm containers being started right now are ready (or failed). */
  poolSettled(): Promise<void> {
    return this.pool.settled();
  }

  /** Resolves when the container runtime answers, rejects with the reason otherwise. */
  ping(): Promise<void> {
    return this.backend.ping();
  }

  /**
   * The session's sandbox. A workspace whose runtime the server no longer offers (KILN_SANDBOX_RUNTIMES
   * changed since it was set) gets none: it never silently runs in another runtime than it asked for.
   */
  private acquire(ctx: ExecContext, limits: SandboxLimits): Promise<Live> {
    if (ctx.network?.mode === 'allowlist' && !this.settings.hasEgress(ctx.runtime))
      throw new ApiError('conflict', `this workspace has sandbox.network allowlist, but ${noEgressIn(ctx.runtime)}`);
    if (!this.settings.offers(ctx.runtime))
      throw new ApiError(
        'conflict',
        `this workspace's sandbox.runtime is ${ctx.runtime}, which this server does not offer ` +
          `(it offers ${this.settings.runtimes.join(', ')}): change the workspace's setting`,
      );
    return this.live.acquire(ctx, limits);
  }

  /** Runs code in the session's sandbox, creating or claiming one first when it has none. */
  async exec(
    ctx: ExecContext,
    limits: SandboxLimits,
    code: string,
    opts: ExecOptions = {},
  ): Promise<ExecOutcome & { changes?: WorkspaceChanges; record?: SQL[] }> {
    // A sandbox with a network (or about to get one) follows the workspace's row, not the copy
    // of the settings a request cache or a run holds: narrowing or ending its egress takes
    // effect at this execution, on every replica. (A change to a workspace without a network
    // reaches it with the caller's settings: within the session cache's 2 s, or at the next run.)
    const live = await this.acquire(await this.withNetworkNow(ctx), limits);
    // The signal is checked at every hand-off (claimed and synced, dequeued, sent): an abort
    // while waiting has no listener to tell, and the code must then not run at all.
    const run = live.queue.then(() => this.execOn(live, ctx, code, opts));
    live.queue = run.catch(() => undefined);
    return run;
  }

  private async execOn(
    live: Live,
    ctx: ExecContext,
    code: string,
    opts: ExecOptions,
  ): Promise<ExecOutcome & { changes?: WorkspaceChanges; record?: SQL[] }> {
    const timeoutS = Math.min(opts.timeoutS ?? live.limits.timeoutS, live.limits.timeoutS);
    // Read at each execution, so a secret set or deleted between two takes effect at the next.
    const secrets = await this.secretsFor(live.workspaceId);
    const mask = new SecretMask(secrets instanceof SecretUnreadable ? [] : secrets);
    const output = mask.listener(opts.onOutput);
    // The patterns exec() read for this execution: a change reaches the proxy here at the latest.
    const proxyUrl = live.container.proxyUrl;
    if (proxyUrl)
      await this.backend.setAllow?.(live.container, live.network.mode === 'allowlist' ? live.network.allow : []);
    const env = proxyUrl ? { ...mask.env(), ...proxyEnv(proxyUrl) } : mask.env();
    live.busy = true;
    let result: RunnerResult;
    // Set when the code was sent to the runner: only those executions are measured.
    let sent: number | undefined;
    try {
      if (opts.signal?.aborted) result = cancelledBeforeStart();
      else if (secrets instanceof SecretUnreadable)
        result = notRun(1, { type: 'SecretUnreadable', message: secrets.message }, false);
      else {
        sent = performance.now();
        result = await live.client.exec(code, {
          timeoutMs: timeoutS * 1000,
          maxOutputBytes: this.opts.maxOutputBytes,
          onOutput: output.onOutput,
          signal: opts.signal,
          sync: live.synced,
          syncCaps: opts.sync,
          env,
        });
      }
    } catch (err) {
      if (!(err instanceof RunnerGoneError)) throw err;
      this.log.warn({ sandbox: live.id, reason: mask.text(err.message) }, 'sandbox runner lost');
      await this.live.release(live.sessionId, live.client.lostAs);
      result = lostResult(err.message);
    } finally {
      if (sent !== undefined) {
        const errorType = (result! as RunnerResult | undefined)?.error?.type;
        this.metrics?.sandboxExecution(ctx.runtime, performance.now() - sent, errorType);
      }
      output.flush();
      live.busy = false;
      live.lastUsed = this.now();
    }
    // Nothing of what the sandbox sent is stored, streamed or returned before it is masked.
    result = await mask.result(result);
    // Every request that ended before the code did (the proxy logs a request when it ends).
    const egress = proxyUrl
      ? ((await this.backend.takeEgress?.(live.container)) ?? []).map((e) => ({ ...e, host: mask.text(e.host) }))
      : [];
    if (live.replacesLost) {
      result.restarted = true;
      result.restart_reason = live.lostReason;
      live.replacesLost = false;
    }
    if (live.resumedMs !== undefined) {
      result.resumed_ms = Math.round(live.resumedMs);
      live.resumedMs = undefined;
    }
    const rec = executionWrite(
      { teamId: ctx.teamId, sessionId: ctx.sessionId, sandboxId: live.id, runId: ctx.runId, code, result, egress },
      opts.audit,
    );
    // The sandbox's new idle deadline is written with the execution's record, in the same statement.
    const writes = [this.live.deadlineWrite(live), ...rec.writes];
    // Code killed for memory owes the webhooks subscribed to sandbox.oom a delivery, written with the execution's record.
    if (result.error?.type === 'OutOfMemory') {
      const data = {
        execution_id: rec.id,
        sandbox_id: live.id,
        session_id: ctx.sessionId,
        workspace_id: ctx.workspaceId,
        run_id: ctx.runId ?? null,
        status: 'oom',
        memory_mb: live.limits.memoryMb,
        links: { session: `/v1/sessions/${ctx.sessionId}`, ...(ctx.runId ? { run: `/v1/runs/${ctx.runId}` } : {}) },
      };
      writes.push(webhookEventWrite('sandbox.oom', ctx.teamId, data));
    }
    if (!opts.deferRecord) await this.db.execute(combine(writes));
    const executionId = rec.id;
    const { ok: _ok, changes, ...rest } = result as RunnerResult & { ev?: string; id?: string };
    delete (rest as { ev?: string }).ev;
    delete (rest as { id?: string }).id;
    delete (rest as { code_sha256?: string }).code_sha256;
    return {
      ...rest,
      sandbox_id: live.id,
      execution_id: executionId,
      egress,
      changes,
      record: opts.deferRecord ? writes : undefined,
    };
  }

  /** Writes (or, with null, deletes) files in the live sandboxes of a workspace, except one session's. */
  pushToWorkspace(
    workspaceId: string,
    files: { path: string; data: Buffer | null }[],
    exceptSession?: string,
  ): Promise<void> {
    return this.live.pushToWorkspace(workspaceId, files, exceptSession);
  }

  /** Writes (or deletes) files in one session's sandbox, e.g. what the host undid or redacted. */
  pushToSession(sessionId: string, files: { path: string; data: Buffer | null }[]): Promise<void> {
    return this.live.pushToSession(sessionId, files);
  }

  async putFile(ctx: ExecContext, limits: SandboxLimits, path: string, data: Buffer): Promise<number> {
    const live = await this.acquire(await this.withNetworkNow(ctx), limits);
    return live.client.putFile(path, data);
  }

  /** Whether this instance holds the session's live sandbox (its runner answers here). */
  holds(sessionId: string): boolean {
    return this.live.get(sessionId)?.client.alive === true;
  }

  /**
   * Reads a file in the session's running sandbox, resuming its paused one (with `paused`, its
   * context); null when it has neither (a read never starts a sandbox).
   */
  async readLiveFile(
    sessionId: string,
    path: string,
    paused?: { ctx: ExecContext; limits: SandboxLimits },
  ): Promise<Buffer | null> {
    let live = this.live.get(sessionId);
    if (!live?.client.alive && paused && (await this.sessionSandbox(sessionId))?.state === 'paused') {
      live = await this.acquire(await this.withNetworkNow(paused.ctx), paused.limits);
      live.resumedMs = undefined;
    }
    if (!live?.client.alive) return null;
    return this.maskFile(live.workspaceId, await live.client.getFile(path));
  }

  /**
   * A file's bytes on their way to a person or the model, with the workspace's secret values
   * masked: a file code wrote may hold what the code was given, as its output may.
   */
  async maskFile(workspaceId: string, data: Buffer): Promise<Buffer> {
    return (await workspaceMask(this.secrets, workspaceId)).bytes(data);
  }

  /** The session's sandbox as its row says (whichever replica holds it); null without one. */
  async sessionSandbox(sessionId: string): Promise<SessionSandbox | null> {
    const [row] = await this.db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, sessionId), ne(sandboxes.state, 'removed')))
      .orderBy(desc(sandboxes.createdAt))
      .limit(1);
    if (!row) return null;
    const state = row.state === 'paused' || row.state === 'resuming' ? row.state : 'running';
    return {
      id: row.id,
      state,
      runtime: row.runtime,
      pausedAt: row.pausedAt,
      checkpointBytes: row.checkpointBytes,
      expiresAt: row.expiresAt,
    };
  }

  /**
   * POST /v1/sessions/{session}/pause: the session's running sandbox, paused now (once what is
   * queued on it is done). Throws a 409 that says why when it cannot be.
   */
  async pause(sessionId: string): Promise<{ sandboxId: string; bytes: number | null; ms: number }> {
    const live = this.live.get(sessionId);
    const outcome = await this.live.pause(sessionId, 'requested');
    if (outcome.paused) return { sandboxId: live!.id, bytes: outcome.bytes, ms: outcome.ms };
    const why: Record<typeof outcome.reason, string> = {
      no_sandbox: 'the session has no running sandbox here (a paused one stays paused; the next execution starts one)',
      busy: "an execution is running in the session's sandbox: pause it once it is done",
      unpausable:
        'this sandbox cannot be paused: only gVisor sandboxes without a network, on a host whose container runtime can checkpoint them ' +
        '(KILN_SANDBOX_PAUSE=on), of a workspace whose sandbox.paused_ttl_s is not 0',
      used: 'the sandbox was used while it was being paused',
      failed: 'checkpointing the sandbox failed: it was removed (the next execution starts a new one and says so)',
    };
    throw new ApiError('conflict', why[outcome.reason]);
  }

  /**
   * Resumes the session's paused sandbox ahead of its next execution (an agent run's, while the
   * model thinks); nothing when it has none paused. Not a use of it: the execution that follows
   * finds it running, or joins the resume in flight, and its result says it was resumed.
   */
  async wake(ctx: ExecContext, limits: SandboxLimits): Promise<void> {
    if (this.live.get(ctx.sessionId)?.client.alive) return;
    if ((await this.sessionSandbox(ctx.sessionId))?.state !== 'paused') return;
    await this.acquire(await this.withNetworkNow(ctx), limits);
  }

  /**
   * POST /v1/sessions/{session}/resume: the session's paused sandbox, running again with every
   * variable; one already running is left as it is (ms null). One that cannot be resumed is
   * replaced by a new sandbox (`lost` says why). Throws a 409 when the session has none paused.
   */
  async resume(
    ctx: ExecContext,
    limits: SandboxLimits,
  ): Promise<{ sandboxId: string; ms: number | null; lost?: string }> {
    const running = this.live.get(ctx.sessionId);
    if (running?.client.alive) return { sandboxId: running.id, ms: null };
    const current = await this.sessionSandbox(ctx.sessionId);
    if (current?.state !== 'paused')
      throw new ApiError('conflict', 'the session has no paused sandbox: its next execution starts a new one');
    const live = await this.acquire(ctx, limits);
    const ms = live.resumedMs;
    // It could not be resumed: the session has a new sandbox, and its next result says so too.
    if (ms === undefined) return { sandboxId: live.id, ms: null, lost: live.lostReason ?? 'resume_failed' };
    live.resumedMs = undefined;
    return { sandboxId: live.id, ms: Math.round(ms) };
  }

  /** Ends the session's sandbox: closes the runner, removes the container, marks the row. */
  release(sessionId: string, reason: string): Promise<void> {
    return this.live.release(sessionId, reason);
  }

  /** DELETE /v1/sandboxes/{id}: the session keeps going and gets a fresh sandbox on its next exec. */
  async removeForTeam(teamId: string, id: string): Promise<void> {
    const [row] = await this.db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.id, id), eq(sandboxes.teamId, teamId), ne(sandboxes.state, 'removed')));
    if (!row) throw ApiError.notFound('sandbox');
    if (row.sessionId && this.live.get(row.sessionId)?.id === id) {
      await this.release(row.sessionId, 'deleted');
      return;
    }
    if (row.state === 'paused') return this.live.removePaused(row, 'deleted');
    if (row.containerId) await this.backend.remove(row.containerId).catch(() => undefined);
    await markRemoved(this.db, [id], 'deleted');
  }

  /** The team's live and paused sandboxes, with memory and CPU use sampled from the container runtime. */
  async listForTeam(teamId: string) {
    const rows = await this.db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.teamId, teamId), inArray(sandboxes.state, [...ACTIVE, 'paused'])))
      .orderBy(sandboxes.id);
    const mineOf = (r: (typeof rows)[number]) => {
      const live = r.sessionId ? this.live.get(r.sessionId) : undefined;
      return live?.id === r.id ? live : undefined;
    };
    // Only another replica's sandboxes need the runtime's list for their hard lifetime.
    const [usage, hard] = await Promise.all([
      // A paused one's container is stopped: it uses no memory or CPU.
      Promise.all(
        rows.map((r) =>
          r.containerId && r.state !== 'paused' ? this.backend.stats(r.containerId) : Promise.resolve(null),
        ),
      ),
      rows.some((r) => !mineOf(r)) ? this.hardExpiries() : new Map<string, number | undefined>(),
    ]);
    return rows.map((r, i) => {
      const mine = mineOf(r);
      const state =
        r.state === 'starting' || r.state === 'paused' || r.state === 'resuming'
          ? r.state
          : mine?.busy
            ? ('busy' as const)
            : ('idle' as const);
      // This instance's own sandboxes by what it knows now; another replica's by their row.
      const idleUntil = mine ? mine.lastUsed + mine.idleMs : r.expiresAt.getTime();
      return {
        row: r,
        state,
        memoryBytes: usage[i]?.memoryBytes ?? null,
        cpuPercent: usage[i]?.cpuPercent ?? null,
        reclaimAt: reclaimAt(
          idleUntil,
          mine ? mine.expiresAt : (r.lifetimeEndsAt?.getTime() ?? hard.get(r.containerId)),
        ),
        runtime: r.runtime,
      };
    });
  }

  /** One pass of the reaper (see reaper.ts); at start-up, every container of this instance goes. */
  reap(opts: { startup?: boolean } = {}): Promise<{ removed: number }> {
    return this.reaper.reap(opts);
  }
}

/** The interpreter's proxy variables (both spellings: curl reads the lowercase ones, others the uppercase). */
function proxyEnv(url: string): Record<string, string> {
  return { HTTP_PROXY: url, HTTPS_PROXY: url, http_proxy: url, https_proxy: url };
}

function lostResult(reason: string): RunnerResult {
  return notRun(
    137,
    { type: 'SandboxLost', message: `the sandbox stopped responding and was replaced; variables are lost (${reason})` },
    true,
  );
}
