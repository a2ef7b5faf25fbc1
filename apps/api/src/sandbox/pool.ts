import type { Logger } from 'pino';
import { newId } from '../lib/ids.ts';
import type { Containers, Sandbox } from './containers.ts';
import type { SandboxRuntime } from '../workspace/settings.ts';
import { sameShape, type SandboxLimits } from './limits.ts';

/**
 * What a warm container is made for beyond its limits and image, and a claim must match: its
 * runtime (a container cannot change runtime once created).
 */
export interface PoolKey {
  runtime: SandboxRuntime;
}

export interface PoolOptions {
  /** How many warm containers to keep ready. */
  size: number;
  /** What warm containers are created with: the default settings, capped. */
  limits: SandboxLimits;
  /** What warm containers are made for: the server's default runtime (set at start-up, see `use`). */
  key: PoolKey;
  /** The base sandbox image, of which the pool keeps `size`. */
  image: string;
  /** Warm containers kept of each template image in use (`setTemplateImages`), at most MAX_TEMPLATE_IMAGES images. */
  templateSize: number;
}

/** The most template images the pool keeps warm containers of, whatever number of templates is in use. */
const MAX_TEMPLATE_IMAGES = 4;

/**
 * The warm pool: started containers with a ready runner, for no team or session yet, so that a
 * session whose workspace has the pool's shape skips the cold start. Refilled after every claim
 * and reaper pass; never after `stop`.
 */
export class WarmPool {
  private ready: Sandbox[] = [];
  /** Containers being started, with their image. */
  private readonly fills = new Map<Promise<void>, string>();
  private templateImages: string[] = [];
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
   * A warm container of the image for these limits and key when they are the pool's (else the
   * claim starts one cold); those whose runner is gone are thrown away.
   */
  take(limits: SandboxLimits, key: PoolKey, image = this.opts.image): Sandbox | undefined {
    if (key.runtime !== this.opts.key.runtime || !sameShape(limits, this.opts.limits, key.runtime)) return undefined;
    for (
      let i = this.ready.findIndex((c) => c.image === image);
      i >= 0;
      i = this.ready.findIndex((c) => c.image === image)
    ) {
      const [warm] = this.ready.splice(i, 1);
      if (warm!.client.alive) return warm;
      void this.containers.destroy(warm!);
    }
    return undefined;
  }

  /**
   * The template images workspaces use now: the pool keeps `templateSize` warm containers of
   * each (of the first MAX_TEMPLATE_IMAGES), and drops those of images no longer in use.
   */
  setTemplateImages(images: string[]): void {
    this.templateImages = this.opts.templateSize
      ? images.filter((i) => i !== this.opts.image).slice(0, MAX_TEMPLATE_IMAGES)
      : [];
    const kept = new Set([this.opts.image, ...this.templateImages]);
    const dropped = this.ready.filter((c) => !kept.has(c.image));
    this.ready = this.ready.filter((c) => kept.has(c.image));
    for (const c of dropped) void this.containers.destroy(c);
    this.fill();
  }

  /** How many warm containers of the image the pool should hold. */
  private sizeOf(image: string): number {
    return image === this.opts.image ? this.opts.size : this.opts.templateSize;
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

  /** Starts as many warm containers of each image as the pool lacks (counting those being started). */
  fill(): void {
    for (const image of [this.opts.image, ...this.templateImages]) {
      const count = () =>
        this.ready.filter((c) => c.image === image).length + [...this.fills.values()].filter((i) => i === image).length;
      while (!this.stopped && count() < this.sizeOf(image)) {
        const fill: Promise<void> = this.containers
          .create(newId('sbx'), this.opts.limits, this.opts.key.runtime, { image })
          .then(
            async (c) => {
              // A template dropped while its container was starting: not kept.
              if (this.stopped || (image !== this.opts.image && !this.templateImages.includes(image)))
                await this.containers.destroy(c);
              else this.ready.push(c);
            },
            (err) => this.log.error({ err, image }, 'could not start a warm sandbox'),
          )
          .finally(() => this.fills.delete(fill));
        this.fills.set(fill, image);
      }
    }
  }

  /** Resolves once the warm containers being started right now are ready (or failed). */
  async settled(): Promise<void> {
    while (this.fills.size) await Promise.allSettled([...this.fills.keys()]);
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
