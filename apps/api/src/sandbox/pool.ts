import type { Logger } from 'pino';
import { newId } from '../lib/ids.ts';
import type { BackendCapabilities } from './backend.ts';
import type { Containers, Sandbox } from './containers.ts';
import { copyTree } from './copy-tree.ts';
import { readHead } from '../workspace/git.ts';
import type { SandboxRuntime } from '../workspace/settings.ts';
import type { SandboxLimits } from './limits.ts';

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
  /** Warm containers kept filled with a workspace's tree, one per workspace, the most recently claimed. */
  preparedSize: number;
  /** Warm containers kept of each template image in use (`setTemplateImages`), at most MAX_TEMPLATE_IMAGES images. */
  templateSize: number;
  /** The least time between two fills for one workspace: the requests meanwhile make one fill at its end. */
  prepareIntervalMs: number;
  /** The most fills (for any workspaces) under way at once; the others wait their turn. */
  prepareConcurrency: number;
}

/** The most template images the pool keeps warm containers of, whatever number of templates is in use. */
const MAX_TEMPLATE_IMAGES = 4;

/** A warm container that already holds a copy of a workspace's working tree at a commit. */
interface Prepared {
  sandbox: Sandbox;
  workspaceId: string;
  /** The workspace's HEAD when it was copied: a claim after another commit does not take it. */
  head: string | null;
  /** The working tree it was copied from: what a refill after a commit copies again. */
  dir: string;
  /** The workspace's team: with team-bound containers, the one it is made for. */
  teamId: string;
}

/** Where the fills of one workspace stand (see `prepare`). */
interface FillState {
  /** A fill is wanted: of this directory, in this image, for the workspace's team. */
  wanted?: { dir: string; image: string; teamId: string };
  /** When the last fill for the workspace started (performance.now()). */
  lastStart: number;
  /** Until when a fill waits for the workspace's commits to stop (the last commit plus the interval). */
  quietFrom: number;
  /** Waiting for the interval since `lastStart`, and `quietFrom`, to pass. */
  timer?: NodeJS.Timeout;
  /** In the queue for a fill slot. */
  queued: boolean;
  /** A fill is under way. */
  running: boolean;
}

/**
 * The warm pool: started containers with a ready runner, for no session yet, so that a session
 * whose workspace has the pool's shape skips the cold start. Refilled after every claim and
 * reaper pass; never after `stop`.
 *
 * A container is for no team either, unless the backend binds containers to the team they are
 * made for (fair share: its cgroup is fixed at creation). Then the pool's `size` warm containers
 * are made for the teams that claimed sandboxes last, at most `size` of them: one each, the most
 * recent the rest; a team's first sandbox starts cold. Of a template image in use, the pool keeps
 * `templateSize` for each of the last MAX_TEMPLATE_IMAGES teams that claimed one of it. A
 * workspace's filled container is made for its team.
 */
export class WarmPool {
  private ready: Sandbox[] = [];
  /** Containers being started, with their image. */
  private readonly fills = new Map<Promise<void>, string>();
  private templateImages: string[] = [];
  /** Whether a warm container's limits can become a claim's (the backend's answer; none until `use`). */
  private resizable: BackendCapabilities['resizable'] = () => false;
  /** Containers are bound to the team they are made for (the backend's answer, see `use`). */
  private teamBound = false;
  /** With team-bound containers: the teams that claimed sandboxes last, most recent first, at most `size`. */
  private teams: string[] = [];
  /** With team-bound containers: the teams that claimed a template image's sandbox last, most recent first. */
  private templateTeams: { team: string; image: string }[] = [];
  /** Filled for a workspace, most recent last; claimed only by a session of that workspace. */
  private prepared: Prepared[] = [];
  /** Containers being filled for a workspace (created, copy under way), by container id. */
  private readonly preparing = new Map<string, { sandboxId: string; workspaceId: string }>();
  /** Per workspace: the fill wanted, under way or waiting for its interval. */
  private readonly fillStates = new Map<string, FillState>();
  /** Workspaces waiting for one of the `prepareConcurrency` fill slots, first come first served. */
  private readonly fillQueue: string[] = [];
  private fillsRunning = 0;
  /** Containers it threw away that are being removed. */
  private readonly removals = new Set<Promise<void>>();
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

  /** What warm containers are made for from now on (before the first fill; again when the backend changes). */
  use(key: PoolKey, caps: Pick<BackendCapabilities, 'resizable' | 'teamBound'>): void {
    this.opts.key = key;
    this.resizable = caps.resizable;
    this.teamBound = caps.teamBound;
  }

  /**
   * A team claimed a sandbox (or did lately, at start-up): with team-bound containers, the warm
   * ones are made for it from now on, and those of a team that is no longer among the last
   * `size` go.
   */
  claimedBy(teamId: string, image = this.opts.image): void {
    if (!this.teamBound) return;
    if (image !== this.opts.image) {
      if (!this.opts.templateSize) return;
      const rest = this.templateTeams.filter((t) => t.team !== teamId || t.image !== image);
      this.templateTeams = [{ team: teamId, image }, ...rest].slice(0, MAX_TEMPLATE_IMAGES);
      return;
    }
    if (!this.opts.size || this.teams[0] === teamId) return;
    this.teams = [teamId, ...this.teams.filter((t) => t !== teamId)].slice(0, this.opts.size);
  }

  /**
   * A warm container of the image for these limits and key when they are the pool's (else the
   * claim starts one cold); those whose runner is gone are thrown away.
   */
  take(limits: SandboxLimits, key: PoolKey, image: string, teamId: string): Sandbox | undefined {
    if (!this.serves(limits, key)) return undefined;
    const fits = (c: Sandbox) => c.image === image && c.forTeam === (this.teamBound ? teamId : undefined);
    for (let i = this.ready.findIndex(fits); i >= 0; i = this.ready.findIndex(fits)) {
      const [warm] = this.ready.splice(i, 1);
      if (warm!.client.alive) return warm;
      this.discard(warm!);
    }
    return undefined;
  }

  /** Whether the pool's containers are made for these limits (their shape) and this runtime. */
  serves(limits: SandboxLimits, key: PoolKey): boolean {
    return key.runtime === this.opts.key.runtime && this.resizable(this.opts.limits, limits, key.runtime);
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
    for (const c of dropped) this.discard(c);
    this.fill();
  }

  /**
   * What the pool should hold: how many warm containers of each image, for which team (none:
   * any). With team-bound containers, for the last teams only (see the class).
   */
  private targets(): { image: string; team?: string; count: number }[] {
    if (this.teamBound)
      return [
        ...this.teams.map((team, i) => ({
          image: this.opts.image,
          team,
          count: i === 0 ? this.opts.size - (this.teams.length - 1) : 1,
        })),
        // Of the template images still in use only.
        ...this.templateTeams
          .filter((t) => this.templateImages.includes(t.image))
          .map((t) => ({ ...t, count: this.opts.templateSize })),
      ];
    return [
      { image: this.opts.image, count: this.opts.size },
      ...this.templateImages.map((image) => ({ image, count: this.opts.templateSize })),
    ];
  }

  /**
   * The container filled for this workspace at its current HEAD, if the pool holds one for the
   * claim's shape, runtime and image: its copy is done, so the claim costs nothing per megabyte.
   * One filled at another HEAD (a commit since) is thrown away.
   */
  takePrepared(
    limits: SandboxLimits,
    key: PoolKey,
    image: string,
    workspace: { id: string; head: string | null },
  ): Sandbox | undefined {
    const i = this.prepared.findIndex((p) => p.workspaceId === workspace.id);
    if (i < 0) return undefined;
    const [p] = this.prepared.splice(i, 1);
    const fits = p!.head === workspace.head && p!.sandbox.image === image && this.serves(limits, key);
    if (fits && p!.sandbox.client.alive) return p!.sandbox;
    this.discard(p!.sandbox);
    return undefined;
  }

  /**
   * Asks for a warm container filled with the workspace's working tree (its own host mount), for
   * the next session of the workspace: after a session claims a sandbox, and after a commit to a
   * workspace the pool holds one for (`changed`). Only with host mounts (the tar path copies
   * through the runner). Never on the path of a request: this only books the fill, which runs
   * in the background when
   *  - no container filled at the workspace's current HEAD is held or being filled (else nothing);
   *  - at least `prepareIntervalMs` passed since the workspace's last fill started (the requests
   *    meanwhile make one fill at the end of the interval);
   *  - one of the `prepareConcurrency` slots is free (one tenant's churn waits for its turn).
   * The least recently filled goes when `preparedSize` are held; one filled for the workspace
   * before (at an older HEAD) goes once the new one is ready.
   */
  prepare(workspaceId: string, teamId: string, dir: string, image = this.opts.image): void {
    if (this.stopped || !this.opts.preparedSize || !this.containers.mountsWorkspaces || image !== this.opts.image)
      return;
    const s = this.fillStateOf(workspaceId);
    s.wanted = { dir, image, teamId };
    this.schedule(workspaceId, s);
  }

  /** The workspace's fill state, made when it has none (and the idle ones of others forgotten). */
  private fillStateOf(workspaceId: string): FillState {
    this.pruneFillStates();
    let s = this.fillStates.get(workspaceId);
    if (!s) {
      s = { lastStart: Number.NEGATIVE_INFINITY, quietFrom: Number.NEGATIVE_INFINITY, queued: false, running: false };
      this.fillStates.set(workspaceId, s);
    }
    return s;
  }

  /**
   * A commit to the workspace: the container the pool holds filled with it is refilled (see
   * `prepare`) once the workspace has had no commit for the interval, so that an agent
   * committing at every step makes one fill when it pauses, not one per interval.
   */
  changed(workspaceId: string): void {
    const held = this.prepared.find((p) => p.workspaceId === workspaceId);
    if (!held || this.stopped) return;
    const s = this.fillStateOf(workspaceId);
    s.quietFrom = performance.now() + this.opts.prepareIntervalMs;
    // A timer set for an earlier time is set again for the later one.
    clearTimeout(s.timer);
    s.timer = undefined;
    this.prepare(workspaceId, held.teamId, held.dir, held.sandbox.image);
  }

  /** Whether the pool holds a container filled with the workspace at the HEAD its directory has now. */
  private freshFor(workspaceId: string, dir: string): boolean {
    const head = readHead(dir);
    return this.prepared.some((p) => p.workspaceId === workspaceId && p.head === head);
  }

  /** Queues the workspace's wanted fill once its interval and quiet time have passed (a timer until then). */
  private schedule(workspaceId: string, s: FillState): void {
    if (this.stopped || !s.wanted || s.running || s.queued || s.timer) return;
    const wait = Math.max(s.lastStart + this.opts.prepareIntervalMs, s.quietFrom) - performance.now();
    if (wait > 0) {
      s.timer = setTimeout(() => {
        s.timer = undefined;
        this.schedule(workspaceId, s);
      }, wait);
      s.timer.unref();
      return;
    }
    s.queued = true;
    this.fillQueue.push(workspaceId);
    this.pump();
  }

  /** Starts queued fills while slots are free; a fill no longer needed (a fresh one is held) is dropped. */
  private pump(): void {
    while (!this.stopped && this.fillsRunning < this.opts.prepareConcurrency && this.fillQueue.length) {
      const workspaceId = this.fillQueue.shift()!;
      const s = this.fillStates.get(workspaceId);
      if (!s) continue;
      s.queued = false;
      const wanted = s.wanted;
      s.wanted = undefined;
      if (!wanted || this.freshFor(workspaceId, wanted.dir)) continue;
      s.running = true;
      s.lastStart = performance.now();
      this.fillsRunning++;
      const fill: Promise<void> = this.fillFor(workspaceId, wanted)
        .catch((err) => this.log.warn({ err, workspace: workspaceId }, 'could not prepare a sandbox for a workspace'))
        .finally(() => {
          this.fills.delete(fill);
          this.fillsRunning--;
          s.running = false;
          // A commit during the fill (the copy was then thrown away, or is already stale): once more.
          if (this.fillStates.get(workspaceId) === s) this.schedule(workspaceId, s);
          this.pump();
        });
      this.fills.set(fill, `prepared:${workspaceId}`);
    }
  }

  /** Forgets the workspaces whose last fill is older than the interval and that want none. */
  private pruneFillStates(): void {
    const before = performance.now() - this.opts.prepareIntervalMs;
    for (const [id, s] of this.fillStates)
      if (!s.wanted && !s.running && !s.queued && !s.timer && s.lastStart < before && s.quietFrom < before)
        this.fillStates.delete(id);
  }

  /**
   * One fill: a new container, the working tree copied into its mount, kept only when the copy
   * saw one HEAD from start to end (a commit meanwhile asks for another fill through `changed`).
   */
  private async fillFor(
    workspaceId: string,
    { dir, image, teamId }: { dir: string; image: string; teamId: string },
  ): Promise<void> {
    const c = await this.containers.create(newId('sbx'), this.opts.limits, this.opts.key.runtime, {
      image,
      session: this.teamBound ? { teamId, sessionId: '' } : undefined,
    });
    this.preparing.set(c.container.id, { sandboxId: c.id, workspaceId });
    try {
      const head = readHead(dir);
      if (!c.workspaceDir) throw new Error('no workspace mount');
      const t0 = performance.now();
      const copied = await copyTree(dir, c.workspaceDir, c.container.uid);
      // Stopped, or the workspace deleted meanwhile (its state forgotten), or a commit since: not kept.
      if (this.stopped || !this.fillStates.has(workspaceId) || readHead(dir) !== head) {
        await this.containers.destroy(c);
        if (!this.stopped && this.fillStates.has(workspaceId)) this.prepare(workspaceId, teamId, dir, image);
        return;
      }
      c.filled = true;
      // The one filled before, at an older HEAD, is replaced.
      const older = this.prepared.filter((p) => p.workspaceId === workspaceId);
      this.prepared = this.prepared.filter((p) => p.workspaceId !== workspaceId);
      for (const p of older) this.discard(p.sandbox);
      this.prepared.push({ sandbox: c, workspaceId, head, dir, teamId });
      this.log.info(
        { workspace: workspaceId, sandbox: c.id, ...copied, copy_ms: Math.round(performance.now() - t0) },
        "sandbox filled for the workspace's next session",
      );
      while (this.prepared.length > this.opts.preparedSize) this.discard(this.prepared.shift()!.sandbox);
    } catch (err) {
      await this.containers.destroy(c);
      throw err;
    } finally {
      this.preparing.delete(c.container.id);
    }
  }

  /** A deleted workspace's filled containers go with it. */
  forgetWorkspace(workspaceId: string): void {
    const s = this.fillStates.get(workspaceId);
    if (s?.timer) clearTimeout(s.timer);
    this.fillStates.delete(workspaceId);
    const gone = this.prepared.filter((p) => p.workspaceId === workspaceId);
    this.prepared = this.prepared.filter((p) => p.workspaceId !== workspaceId);
    for (const p of gone) this.discard(p.sandbox);
  }

  /** Puts back a warm container taken for a claim that did not happen, first in line. */
  giveBack(warm: Sandbox): void {
    this.ready.unshift(warm);
  }

  /** Whether the pool holds the container: warm, filled for a workspace, or being filled. */
  has(containerId: string): boolean {
    return (
      this.ready.some((c) => c.container.id === containerId) ||
      this.prepared.some((p) => p.sandbox.container.id === containerId) ||
      this.preparing.has(containerId)
    );
  }

  /** Whether the pool holds the sandbox (by sandbox id), as `has` does by container. */
  holds(sandboxId: string): boolean {
    return (
      this.ready.some((c) => c.id === sandboxId) ||
      this.prepared.some((p) => p.sandbox.id === sandboxId) ||
      [...this.preparing.values()].some((p) => p.sandboxId === sandboxId)
    );
  }

  /** Forgets a warm container that was removed. */
  drop(containerId: string): void {
    this.ready = this.ready.filter((c) => c.container.id !== containerId);
    this.prepared = this.prepared.filter((p) => p.sandbox.container.id !== containerId);
  }

  /**
   * Starts as many warm containers of each image (and team) as the pool lacks, counting those
   * being started; removes those it no longer wants, oldest first (a template dropped, a team no
   * longer among the last, or one that now gets fewer).
   */
  fill(): void {
    const targets = this.targets();
    const slot = (image: string, team?: string) => `${image}\n${team ?? ''}`;
    const room = new Map(targets.map((t) => [slot(t.image, t.team), t.count]));
    const kept: Sandbox[] = [];
    for (const c of [...this.ready].reverse()) {
      const key = slot(c.image, c.forTeam);
      const left = room.get(key) ?? 0;
      if (left > 0) {
        room.set(key, left - 1);
        kept.unshift(c);
      } else this.discard(c);
    }
    this.ready = kept;
    for (const { image, team, count } of targets) {
      const key = slot(image, team);
      const held = () =>
        this.ready.filter((c) => slot(c.image, c.forTeam) === key).length +
        [...this.fills.values()].filter((k) => k === key).length;
      while (!this.stopped && held() < count) {
        const fill: Promise<void> = this.containers
          .create(newId('sbx'), this.opts.limits, this.opts.key.runtime, {
            image,
            session: team === undefined ? undefined : { teamId: team, sessionId: '' },
          })
          .then(
            async (c) => {
              c.forTeam = team;
              // A template (or team) dropped while its container was starting: not kept.
              if (this.stopped || !this.targets().some((t) => slot(t.image, t.team) === key))
                await this.containers.destroy(c);
              else this.ready.push(c);
            },
            (err) => this.log.error({ err, image }, 'could not start a warm sandbox'),
          )
          .finally(() => this.fills.delete(fill));
        this.fills.set(fill, key);
      }
    }
  }

  /** Removes a container the pool no longer holds, in the background (`settled` waits for it). */
  private discard(c: Sandbox): void {
    const removal: Promise<void> = this.containers.destroy(c).finally(() => this.removals.delete(removal));
    this.removals.add(removal);
  }

  /** Resolves once the warm containers being started right now are ready (or failed), and those it threw away are gone. */
  async settled(): Promise<void> {
    while (this.fills.size || this.removals.size) await Promise.allSettled([...this.fills.keys(), ...this.removals]);
  }

  /** No more fills; a warm container still being started removes itself once it is up. */
  stop(): void {
    this.stopped = true;
    for (const s of this.fillStates.values()) if (s.timer) clearTimeout(s.timer);
    this.fillStates.clear();
    this.fillQueue.length = 0;
  }

  /** Empties the pool, handing its containers to the caller to destroy. */
  drain(): Sandbox[] {
    return [...this.ready.splice(0), ...this.prepared.splice(0).map((p) => p.sandbox)];
  }
}
