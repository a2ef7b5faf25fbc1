import type { Logger } from 'pino';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Db } from '../db/client.ts';
import { RUN_STATUSES } from '../db/schema/runs.ts';
import type { StatementKind } from '../db/statements.ts';
import { CountsReader, type DatabaseCounts, JOB_STATES, SANDBOX_STATES, WORKSPACE_SCOPES } from './database-counts.ts';
import { BoundedLabel } from './labels.ts';

export interface MetricsOptions {
  db: Db;
  log: Logger;
  /** Model names that always get a label value of their own (the server's default model). */
  models?: (string | undefined)[];
  /** How many distinct model names get their own label value; later ones are "other" (default 20). */
  maxModels?: number;
  /** prom-client's process and Node.js metrics on this registry (default on). */
  processMetrics?: boolean;
  /** How long a scrape waits for the database's counts (default 2000 ms). */
  databaseTimeoutMs?: number;
  /** The sandbox runtimes whose timeout and OOM counters start at zero (default runc, gvisor). */
  runtimes?: readonly string[];
}

const seconds = (ms: number) => ms / 1000;

/** What the metrics say of one sandbox node (the registry's view, as plain figures). */
export interface NodeFigures {
  name: string;
  heard: boolean;
  draining: boolean;
  memoryMb: number;
  committedMemoryMb: number;
  cpus: number;
  committedCpus: number;
  sandboxes: number;
}

const FORWARD_OUTCOMES = ['sent', 'unreachable', 'received'] as const;
export type ForwardOutcome = (typeof FORWARD_OUTCOMES)[number];

/**
 * Every metric of one Kiln app, on a registry of its own (never prom-client's global one: several
 * apps, test apps and replicas, share a process). Built by compose.ts and handed to the parts that
 * do the work; each records through a method here, so none of them imports prom-client. Gauges of
 * what the database holds (runs, sandboxes, jobs) are read at scrape time, so every replica tells
 * the same; the rest count what this process did since it started.
 */
export class KilnMetrics {
  readonly registry = new Registry();
  private readonly http: Histogram<'method' | 'route' | 'status'>;
  private readonly steps: Counter;
  private readonly tokens: Counter<'model' | 'kind'>;
  private readonly modelLatency: Histogram<'model'>;
  private readonly modelErrors: Counter<'model' | 'code'>;
  private readonly execDuration: Histogram<'runtime'>;
  private readonly execTimeouts: Counter<'runtime'>;
  private readonly oomKills: Counter<'runtime'>;
  private readonly pauseDuration: Histogram;
  private readonly resumeDuration: Histogram;
  private readonly takeovers: Counter;
  private readonly statements: Histogram<'driver' | 'kind'>;
  private readonly forwards: Counter<'outcome'>;
  private readonly statementChildren = new Map<string, { observe(v: number): void }>();
  private readonly scrapeErrors: Counter<'source'>;
  private readonly models: BoundedLabel;
  private readonly counts: CountsReader;
  private poolReady: () => number = () => 0;

  constructor(opts: MetricsOptions) {
    const registers = [this.registry];
    if (opts.processMetrics !== false) collectDefaultMetrics({ register: this.registry });
    this.models = new BoundedLabel(opts.maxModels ?? 20, opts.models);
    this.counts = new CountsReader(opts.db, opts.databaseTimeoutMs ?? 2000, (err) => {
      this.scrapeErrors.inc({ source: 'database' });
      opts.log.warn({ err: err.message }, 'metrics: the database counts could not be read');
    });

    this.http = new Histogram({
      name: 'kiln_http_request_duration_seconds',
      help: 'HTTP requests by method, route pattern ("unmatched": no route) and status, until the response started',
      labelNames: ['method', 'route', 'status'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers,
    });

    this.steps = new Counter({ name: 'kiln_run_steps_total', help: 'Agent run steps started', registers });
    this.tokens = new Counter({
      name: 'kiln_model_tokens_total',
      help: 'Tokens the model endpoint reported, by model and kind (prompt, completion)',
      labelNames: ['model', 'kind'],
      registers,
    });
    this.modelLatency = new Histogram({
      name: 'kiln_model_request_duration_seconds',
      help: 'Model calls (streamed, to the last chunk, failed ones too) by model',
      labelNames: ['model'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300],
      registers,
    });
    this.modelErrors = new Counter({
      name: 'kiln_model_request_errors_total',
      help: 'Model calls that failed, by model and code (model_unavailable, context_overflow, cancelled, …)',
      labelNames: ['model', 'code'],
      registers,
    });

    this.execDuration = new Histogram({
      name: 'kiln_sandbox_execution_duration_seconds',
      help: 'Code executions in a sandbox, as this server waited for them, by runtime',
      labelNames: ['runtime'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
      registers,
    });
    this.execTimeouts = new Counter({
      name: 'kiln_sandbox_execution_timeouts_total',
      help: 'Executions stopped at their time limit, by runtime',
      labelNames: ['runtime'],
      registers,
    });
    this.oomKills = new Counter({
      name: 'kiln_sandbox_oom_kills_total',
      help: 'Executions killed for running out of memory, by runtime',
      labelNames: ['runtime'],
      registers,
    });
    this.pauseDuration = new Histogram({
      name: 'kiln_sandbox_pause_duration_seconds',
      help: 'Sandboxes paused (checkpointed to disk): from letting go of the runner to the checkpoint on disk',
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.resumeDuration = new Histogram({
      name: 'kiln_sandbox_resume_duration_seconds',
      help: 'Paused sandboxes resumed: from the request to a runner answering with every variable kept',
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    for (const runtime of opts.runtimes ?? ['runc', 'gvisor']) {
      this.execTimeouts.inc({ runtime }, 0);
      this.oomKills.inc({ runtime }, 0);
    }
    const pool: Gauge = new Gauge({
      name: 'kiln_sandbox_pool_warm',
      help: 'Warm sandbox containers ready in this server’s pool',
      registers,
      collect: () => pool.set(this.poolReady()),
    });

    this.forwards = new Counter({
      name: 'kiln_replica_forwards_total',
      help:
        'Requests about a session whose sandbox another replica holds, by outcome: sent (on to the holder), ' +
        'unreachable (the holder could not be reached: served here with a new sandbox), received (sent on by another replica, served here)',
      labelNames: ['outcome'],
      registers,
    });
    for (const outcome of FORWARD_OUTCOMES) this.forwards.inc({ outcome }, 0);
    this.takeovers = new Counter({
      name: 'kiln_sandbox_takeovers_total',
      help:
        'Sandboxes of a replica that is gone (not heard from) met by a request here, by outcome: taken (taken over ' +
        'with every variable), lost (could not be: removed, the session got a new sandbox)',
      labelNames: ['outcome'],
      registers,
    });
    for (const outcome of ['taken', 'lost']) this.takeovers.inc({ outcome }, 0);

    this.statements = new Histogram({
      name: 'kiln_db_statement_duration_seconds',
      help: 'Database statements by driver and kind (select, insert, update, delete, other), queueing included',
      labelNames: ['driver', 'kind'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers,
    });

    this.scrapeErrors = new Counter({
      name: 'kiln_scrape_errors_total',
      help: 'Scrapes that answered without some gauges, by what failed (database: its counts were not read)',
      labelNames: ['source'],
      registers,
      // Read after this scrape's database read has settled, so a failure shows in the scrape it failed.
      collect: async () => {
        await this.counts.read();
      },
    });
    this.scrapeErrors.inc({ source: 'database' }, 0);

    this.databaseGauge(
      'kiln_runs',
      'Runs by status (all replicas: read from the database)',
      'status',
      RUN_STATUSES,
      (c) => c.runs,
    );
    this.databaseGauge(
      'kiln_sandboxes',
      'Sandboxes by state, removed ones left out (all replicas: read from the database)',
      'state',
      SANDBOX_STATES,
      (c) => c.sandboxes,
    );
    this.databaseGauge(
      'kiln_sandbox_checkpoint_bytes',
      'Bytes on disk of paused sandboxes’ checkpoints, of every team (all) and of the team with the most (largest_team, against KILN_SANDBOX_PAUSED_MAX_MB_PER_TEAM)',
      'of',
      WORKSPACE_SCOPES,
      (c) => c.checkpoint_bytes,
    );
    this.databaseGauge(
      'kiln_workspaces',
      'Live workspaces, of every team (all) and of the team with the most (largest_team, against KILN_WORKSPACES_MAX_PER_TEAM)',
      'of',
      WORKSPACE_SCOPES,
      (c) => c.workspaces,
    );
    this.databaseGauge(
      'kiln_workspace_bytes',
      'Working-tree bytes of live workspaces as of their last checked write, of every team (all) and of the largest (largest_team, against KILN_TEAM_WORKSPACE_BYTES_MAX)',
      'of',
      WORKSPACE_SCOPES,
      (c) => c.workspace_bytes,
    );
    this.databaseGauge(
      'kiln_jobs',
      'Durable jobs (reviews, dreams, template builds, …) queued, running and failed (all replicas: read from the database)',
      'status',
      JOB_STATES,
      (c) => c.jobs,
    );
  }

  /** A gauge read from the database at scrape time; when the read fails, the scrape has none of its values. */
  private databaseGauge(
    name: string,
    help: string,
    label: string,
    values: readonly string[],
    pick: (c: DatabaseCounts) => Record<string, number>,
  ): void {
    const counts = this.counts;
    new Gauge({
      name,
      help,
      labelNames: [label],
      registers: [this.registry],
      async collect() {
        const read = await counts.read();
        this.reset();
        if (!read) return;
        const by = pick(read);
        for (const v of values) this.set({ [label]: v }, by[v] ?? 0);
      },
    });
  }

  /**
   * The registered sandbox nodes, read from the database at each scrape (every replica reports the
   * same fleet): whether each was heard lately, whether it drains, its memory and CPUs against what
   * is placed on it, and its sandboxes. A failed read leaves them out of that scrape.
   */
  watchNodes(read: () => Promise<NodeFigures[]>): void {
    const registers = [this.registry];
    let last: { at: number; read: Promise<NodeFigures[] | null> } | undefined;
    // One read per scrape, shared by the five gauges (collected together): a read is reused for a second.
    const figures = () => {
      if (!last || Date.now() - last.at > 1000) last = { at: Date.now(), read: read().catch(() => null) };
      return last.read;
    };
    const gauge = (name: string, help: string, labels: string[], set: (g: Gauge, n: NodeFigures) => void) =>
      new Gauge({
        name,
        help,
        labelNames: labels,
        registers,
        async collect() {
          const nodes = await figures();
          this.reset();
          for (const n of nodes ?? []) set(this, n);
        },
      });
    gauge(
      'kiln_sandbox_node_up',
      'Sandbox nodes: 1 when a replica heard from it within 30 s, else 0',
      ['node'],
      (g, n) => g.set({ node: n.name }, n.heard ? 1 : 0),
    );
    gauge('kiln_sandbox_node_draining', 'Sandbox nodes: 1 while draining (no new sandboxes)', ['node'], (g, n) =>
      g.set({ node: n.name }, n.draining ? 1 : 0),
    );
    gauge(
      'kiln_sandbox_node_memory_mb',
      'Sandbox nodes: memory sandboxes may be given (of=capacity) and the limits of those placed (of=committed)',
      ['node', 'of'],
      (g, n) => {
        g.set({ node: n.name, of: 'capacity' }, n.memoryMb);
        g.set({ node: n.name, of: 'committed' }, n.committedMemoryMb);
      },
    );
    gauge(
      'kiln_sandbox_node_cpus',
      'Sandbox nodes: CPUs (of=capacity) and the CPU limits of the sandboxes placed (of=committed)',
      ['node', 'of'],
      (g, n) => {
        g.set({ node: n.name, of: 'capacity' }, n.cpus);
        g.set({ node: n.name, of: 'committed' }, n.committedCpus);
      },
    );
    gauge('kiln_sandbox_node_sandboxes', 'Sandbox nodes: sandboxes placed on each (all replicas)', ['node'], (g, n) =>
      g.set({ node: n.name }, n.sandboxes),
    );
  }

  /** The warm containers ready now (the sandbox engine's pool). */
  watchPool(ready: () => number): void {
    this.poolReady = ready;
  }

  httpRequest(method: string, route: string, status: number, ms: number): void {
    this.http.observe({ method, route, status: String(status) }, seconds(ms));
  }

  /** A request about a session, sent on to the replica holding its sandbox, or received from one (http/replicas.ts). */
  replicaForward(outcome: ForwardOutcome): void {
    this.forwards.inc({ outcome });
  }

  runStep(): void {
    this.steps.inc();
  }

  /** One model call: its duration, and the tokens the endpoint reported (none when it failed, with the code). */
  modelCall(
    model: string,
    ms: number,
    outcome: { usage: { promptTokens: number; completionTokens: number } } | { error: string },
  ): void {
    const label = this.models.of(model);
    this.modelLatency.observe({ model: label }, seconds(ms));
    if ('error' in outcome) {
      this.modelErrors.inc({ model: label, code: outcome.error });
      return;
    }
    const { promptTokens, completionTokens } = outcome.usage;
    // What the endpoint reported is counted only when it is a sane count.
    if (Number.isSafeInteger(promptTokens) && promptTokens > 0)
      this.tokens.inc({ model: label, kind: 'prompt' }, promptTokens);
    if (Number.isSafeInteger(completionTokens) && completionTokens > 0)
      this.tokens.inc({ model: label, kind: 'completion' }, completionTokens);
  }

  /** One execution that reached a sandbox's runner: its duration, and whether it timed out or ran out of memory. */
  sandboxExecution(runtime: string, ms: number, errorType: string | undefined): void {
    this.execDuration.observe({ runtime }, seconds(ms));
    if (errorType === 'Timeout') this.execTimeouts.inc({ runtime });
    else if (errorType === 'OutOfMemory') this.oomKills.inc({ runtime });
  }

  /** A sandbox paused, in `ms` (its checkpoint's bytes are read from the database at each scrape). */
  paused(ms: number): void {
    this.pauseDuration.observe(seconds(ms));
  }

  /** A gone replica's sandbox met by a request here: taken over, or lost. */
  tookOver(outcome: 'taken' | 'lost'): void {
    this.takeovers.inc({ outcome });
  }

  /** A paused sandbox resumed, in `ms`. */
  resumed(ms: number): void {
    this.resumeDuration.observe(seconds(ms));
  }

  /** A database statement answered (db/statements.ts): called for every one, so it does as little as it can. */
  statement(driver: string, kind: StatementKind, s: number): void {
    const key = `${driver}:${kind}`;
    let child = this.statementChildren.get(key);
    if (!child) {
      child = this.statements.labels(driver, kind);
      this.statementChildren.set(key, child);
    }
    child.observe(s);
  }

  /** The text exposition of every metric (the database's counts read once). */
  async scrape(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
