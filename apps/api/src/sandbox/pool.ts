import type { Logger } from 'pino';
import { newId } from '../lib/ids.ts';
import type { Containers, Sandbox } from './containers.ts';
import type { SandboxRuntime } from '../workspace/settings.ts';
import { sameShape, type SandboxLimits } from './limits.ts';

/**
 * What a warm container is made for beyond its limits, and a claim must match: its runtime
 * (a container cannot change runtime once created).
 */
export interface PoolKey {
  runtime: SandboxRuntime;
}

const sameKey = (a: PoolKey, b: PoolKey) => a.runtime === b.runtime;

export interface PoolOptions {
  /** How many warm containers to keep ready. */
  size: number;
  /** What warm containers are created with: the default settings, capped. */
  limits: SandboxLimits;
  /** What warm containers are made for: the server's default runtime (set at start-up, see `use`). */
  key: PoolKey;
}

/**
 * The warm pool: started containers with a ready runner, for no team or session yet, so that a
 * session whose workspace has the pool's shape skips the cold start. Refilled after every claim
 * and reaper pass; never after `stop`.
 */
export class WarmPool {
  private ready: Sandbox[] = [];
  private readonly fills = new Set<Promise<void>>();
  private stopped = false;

  constructor(
    private readonly containers: Containers,
    private readonly opts: PoolOptions,
    private readonly log: Logger,
  ) {}

  /** The warm containers ready now, oldest first. */
  get warm(): readonly Sandbox[] {
    return this.ready;
  }

  /** What warm containers are made for from now on (before the first fill). */
  use(key: PoolKey): void {
    this.opts.key = key;
  }

  /**
   * A warm container for these limits and key when they are the pool's (else the claim starts
   * one cold); those whose runner is gone are thrown away.
   */
  take(limits: SandboxLimits, key: PoolKey): Sandbox | undefined {
    if (!sameKey(key, this.opts.key) || !sameShape(limits, this.opts.limits, key.runtime)) return undefined;
    for (let warm = this.ready.shift(); warm; warm = this.ready.shift()) {
      if (warm.client.alive) return warm;
      void this.containers.destroy(warm);
    }
    return undefined;
  }

  /** Puts back a warm container taken for a claim that did not happen, first in line. */
  giveBack(warm: Sandbox): void {
    this.ready.unshift(warm);
  }

  has(containerId: string): boolean {
    return this.ready.some((c) => c.container.id === containerId);
  }

  /** Forgets a warm container that was removed. */
  drop(containerId: string): void {
    this.ready = this.ready.filter((c) => c.container.id !== containerId);
  }

  /** Starts as many warm containers as the pool lacks (counting those being started). */
  fill(): void {
    while (!this.stopped && this.ready.length + this.fills.size < this.opts.size) {
      const fill: Promise<void> = this.containers
        .create(newId('sbx'), this.opts.limits, this.opts.key.runtime)
        .then(
          async (c) => {
            if (this.stopped) await this.containers.destroy(c);
            else this.ready.push(c);
          },
          (err) => this.log.error({ err }, 'could not start a warm sandbox'),
        )
        .finally(() => this.fills.delete(fill));
      this.fills.add(fill);
    }
  }

  /** Resolves once the warm containers being started right now are ready (or failed). */
  async settled(): Promise<void> {
    while (this.fills.size) await Promise.allSettled([...this.fills]);
  }

  /** No more fills; a warm container still being started removes itself once it is up. */
  stop(): void {
    this.stopped = true;
  }

  /** Empties the pool, handing its containers to the caller to destroy. */
  drain(): Sandbox[] {
    return this.ready.splice(0);
  }
}
