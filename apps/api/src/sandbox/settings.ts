import { ApiError } from '../lib/errors.ts';
import type { SandboxRuntime, WorkspaceSettings } from '../workspace/settings.ts';
import type { ContainerNetwork } from './backend.ts';
import { effectiveLimits, type SandboxLimits } from './limits.ts';
import type { ExecContext } from './live.ts';

type Sandbox = WorkspaceSettings['sandbox'];

/** What the server allows every workspace's sandboxes (its KILN_SANDBOX_* and KILN_EGRESS* settings). */
export interface SandboxPolicy {
  /** Server-wide maxima that cap every workspace's settings. */
  maxLimits: SandboxLimits;
  /** The idle time of a workspace that sets none, and the most one may set. */
  idleMs: number;
  maxIdleMs: number;
  /** How long an idle sandbox stays paused when its workspace sets no `sandbox.paused_ttl_s`, and the most one may set. */
  pausedTtlMs?: number;
  maxPausedTtlMs?: number;
  /** Whether `sandbox.network: allowlist` is permitted here (KILN_EGRESS) and the most patterns a workspace may list. */
  egress?: { enabled: boolean; maxAllow: number };
}

const refuse = (field: string, message: string): never => {
  const path = `body.settings.sandbox.${field}`;
  throw new ApiError('invalid_request', `${path}: ${message}`, { details: [{ path, message }] });
};

/**
 * The one home of a workspace's sandbox settings on this server: whether a change may be made
 * (a 400 that names the field), and what the settings mean for a sandbox (its limits, idle time,
 * network, runtime, and the exec context built from them). The routes, a session's executions
 * and the agent's prompt all ask it. Adding a sandbox setting touches this file, the schema in
 * workspace/settings.ts and the docs.
 */
export class SandboxSettings {
  private offered: SandboxRuntime[] = ['runc'];
  private defaultRt: SandboxRuntime = 'runc';
  /** The offered runtimes whose sandboxes can have network allowlist. */
  private withEgress = new Set<SandboxRuntime>(['runc']);

  constructor(private readonly policy: SandboxPolicy) {}

  /** The runtimes the server offers and which of them can have egress (the engine's start-up decides). */
  useRuntimes(offered: SandboxRuntime[], defaultRuntime: SandboxRuntime, withEgress: Set<SandboxRuntime>): void {
    this.offered = offered;
    this.defaultRt = defaultRuntime;
    this.withEgress = withEgress;
  }

  /** The runtimes this server offers (KILN_SANDBOX_RUNTIMES, or what the backend has). */
  get runtimes(): readonly SandboxRuntime[] {
    return this.offered;
  }

  /** The runtime a new workspace gets when it sets none: gvisor whenever the server offers it. */
  get defaultRuntime(): SandboxRuntime {
    return this.defaultRt;
  }

  offers(runtime: SandboxRuntime): boolean {
    return this.offered.includes(runtime);
  }

  /** Whether sandboxes of this runtime can have network allowlist here. */
  hasEgress(runtime: SandboxRuntime): boolean {
    return this.withEgress.has(runtime);
  }

  /** A workspace's sandbox settings capped by the server-wide maxima. */
  limitsFor(settings: Sandbox): SandboxLimits {
    return effectiveLimits(settings, this.policy.maxLimits);
  }

  /** How long a workspace's sandboxes may sit idle: its `sandbox.idle_s` capped by the server's maximum, else the server's. */
  idleMsFor(settings: Pick<Sandbox, 'idle_s'>): number {
    // Workspaces stored before the setting existed lack it: the server default.
    const idleS = settings.idle_s ?? null;
    return idleS === null ? this.policy.idleMs : Math.min(idleS * 1000, this.policy.maxIdleMs);
  }

  /** How long a workspace's idle sandboxes stay paused: its `sandbox.paused_ttl_s` capped, else the server's (0: never paused). */
  pausedTtlMsFor(settings: Pick<Sandbox, 'paused_ttl_s'>): number {
    const ttlS = settings.paused_ttl_s ?? null;
    const max = this.policy.maxPausedTtlMs ?? 0;
    return ttlS === null ? Math.min(this.policy.pausedTtlMs ?? 0, max) : Math.min(ttlS * 1000, max);
  }

  /** The network a workspace's sandboxes get: its `sandbox.network` and `allow`, unless this server forbids egress. */
  networkFor(settings: Pick<Sandbox, 'network' | 'allow'>): ContainerNetwork | undefined {
    if (settings.network !== 'allowlist' || !this.policy.egress?.enabled) return undefined;
    return { mode: 'allowlist', allow: settings.allow ?? [] };
  }

  /** Where a session's code runs and what it may use, from its workspace's settings as they are now. */
  execContext(
    ws: { id: string; settings: WorkspaceSettings },
    at: { teamId: string; sessionId: string; runId?: string; workspaceDir: string },
  ): { ctx: ExecContext; limits: SandboxLimits } {
    const s = ws.settings.sandbox;
    return {
      ctx: {
        ...at,
        workspaceId: ws.id,
        idleMs: this.idleMsFor(s),
        pausedTtlMs: this.pausedTtlMsFor(s),
        runtime: s.runtime,
        template: s.template,
        network: this.networkFor(s),
      },
      limits: this.limitsFor(s),
    };
  }

  /**
   * Validates a new workspace's sandbox settings and decides its runtime when it names none (the
   * server's default, written into the workspace so it never changes under it later, unless it
   * asks for a network the default's sandboxes cannot have here). Throws a 400 naming the field.
   */
  forCreate<T extends Partial<Sandbox>>(input: T | undefined): T & { runtime: SandboxRuntime } {
    this.checkFields(input);
    const runtime = input?.runtime ?? this.defaultRuntimeFor(input?.network);
    this.checkRuntimeNetwork(runtime, input?.network ?? 'none');
    return { ...(input as T), runtime };
  }

  /** Validates a change to a workspace's sandbox settings, against what they are now when that matters. */
  async checkPatch(patch: Partial<Sandbox> | undefined, current: () => Promise<Sandbox>): Promise<void> {
    this.checkFields(patch);
    if (!patch?.runtime && !patch?.network) return;
    const now = await current();
    this.checkRuntimeNetwork(patch.runtime ?? now.runtime, patch.network ?? now.network);
  }

  private checkFields(s: Partial<Sandbox> | undefined): void {
    const idleS = s?.idle_s;
    if (idleS !== undefined && idleS !== null && idleS * 1000 > this.policy.maxIdleMs)
      refuse('idle_s', `must be at most ${this.policy.maxIdleMs / 1000} (this server's KILN_SANDBOX_MAX_IDLE_S)`);
    const ttlS = s?.paused_ttl_s;
    const maxTtl = this.policy.maxPausedTtlMs ?? 0;
    if (ttlS !== undefined && ttlS !== null && ttlS * 1000 > maxTtl)
      refuse('paused_ttl_s', `must be at most ${maxTtl / 1000} (this server's KILN_SANDBOX_MAX_PAUSED_TTL_S)`);
    if (s?.runtime !== undefined && !this.offers(s.runtime))
      refuse('runtime', `this server offers ${this.offered.join(', ')} (KILN_SANDBOX_RUNTIMES), not ${s.runtime}`);
    const egress = this.policy.egress ?? { enabled: false, maxAllow: 0 };
    if (s?.network === 'allowlist' && !egress.enabled)
      refuse('network', 'this server forbids sandbox network access (KILN_EGRESS=off)');
    if (s?.allow && s.allow.length > egress.maxAllow)
      refuse('allow', `at most ${egress.maxAllow} patterns (this server's KILN_EGRESS_MAX_ALLOW)`);
  }

  /** The runtime of a new workspace that names none: the default, or an offered one that can have the network it asks for. */
  private defaultRuntimeFor(network: Sandbox['network'] | undefined): SandboxRuntime {
    if (network !== 'allowlist' || !this.policy.egress?.enabled || this.withEgress.has(this.defaultRt))
      return this.defaultRt;
    return this.offered.find((r) => this.withEgress.has(r)) ?? this.defaultRt;
  }

  /**
   * Refuses (400) network allowlist in a runtime whose sandboxes cannot reach the egress proxy
   * here (the backend says which). With egress off (no runtime has it), checkFields says so.
   */
  private checkRuntimeNetwork(runtime: SandboxRuntime, network: Sandbox['network']): void {
    if (network !== 'allowlist' || !this.policy.egress?.enabled || this.withEgress.has(runtime)) return;
    refuse('network', noEgressIn(runtime));
  }
}

/** Why a runtime's sandboxes cannot have network allowlist on this server. */
export function noEgressIn(runtime: SandboxRuntime): string {
  return runtime === 'gvisor'
    ? 'gVisor sandboxes cannot reach the egress proxy on this server (it needs the kiln-gvisor-egress runtime, ' +
        'which infra/docker.sh registers, and a Docker Engine on the API host): set sandbox.runtime to runc, or network to none'
    : `${runtime} sandboxes cannot reach the egress proxy on this server: set sandbox.network to none`;
}
