import { eq, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../../db/client.ts';
import { rowsOf } from '../../db/rows.ts';
import { sandboxNodes } from '../../db/schema/index.ts';
import { ApiError } from '../../lib/errors.ts';
import type {
  BackendCapabilities,
  ContainerRequest,
  EgressEvent,
  ImageBuilder,
  ImageRecipe,
  ListedContainer,
  RunnerChannel,
  RuntimeOffer,
  SandboxBackend,
  SandboxContainer,
  Usage,
} from '../backend.ts';
import { sameShape } from '../docker/container-spec.ts';
import type { SandboxLimits } from '../limits.ts';
import type { PeerCredentials } from './pki.ts';
import { containerNode, LOCAL, placedOn } from './registry.ts';
import { RemoteBackend } from './remote.ts';

interface Member {
  name: string;
  backend: SandboxBackend;
  url?: string;
  state: 'active' | 'draining';
  capacity: { memoryMb: number; cpus: number };
  runtimes: RuntimeOffer[];
  /** Its containers are bound to the team they are made for (BackendCapabilities.teamBound), as it last said. */
  teamBound: boolean;
  /** When this replica last had an answer from it (epoch ms); 0: never. */
  heardAt: number;
  /** The template images it has, as it last said. */
  images: Set<string>;
  /** Its hearing under way, if one is: a round starts none while it lasts. */
  hearing?: Promise<void>;
}

export interface FleetOptions {
  db: Db;
  /** This replica's certificate for the node protocol (pki.ts). */
  credentials: PeerCredentials;
  /** The API host's own Docker backend, a member named `local`; unset, sandboxes run on nodes only. */
  local?: SandboxBackend;
  /** How often the registry is read and every node is pinged. */
  heartbeatMs?: number;
  /** A node this replica has not heard from for this long takes no new sandboxes from it. */
  silentMs?: number;
  /**
   * A node no replica has heard from for this long (its registry row's `last_heard_at`) is lost
   * to the whole installation: every replica marks the sandboxes on it removed (`node_lost`), those
   * of replicas that died with it included, so they no longer count against a team's cap or the
   * fleet's capacity. Default 60 s.
   */
  lostGraceMs?: number;
  /**
   * A node this replica has not heard from for this long is lost to it: its connection is dropped,
   * so every runner on it fails now (each session's next execution gets a new sandbox elsewhere)
   * rather than waiting on a node that may never answer.
   */
  lostMs?: number;
  log?: Logger;
  now?: () => number;
}

/**
 * Sandboxes on a fleet: the nodes an org admin registered (`sandbox_nodes`), each reached as a
 * `RemoteBackend`, and optionally the API host's own engine. It is one more `SandboxBackend`, so
 * the engine, the pool and the reaper work as on one machine. A container's id is
 * `<node>/<id on the node>` (the local engine's have no prefix, as on one machine), which routes
 * every later call to the node that holds it.
 *
 * Placement (`create`): among active members that run the runtime (with egress when the
 * sandbox needs it), were heard from lately and have the memory left for it after the limits of
 * the sandboxes every replica has placed there (from `sandboxes`, so the count is fleet-wide):
 * the one with the fewest of the same team's sandboxes (spread), then the most memory left (CPU
 * left a tenth as much). A sandbox that fits nowhere is `sandbox_unavailable` (429) saying so.
 */
export class FleetBackend implements SandboxBackend {
  private readonly members = new Map<string, Member>();
  private readonly listeners: (() => void)[] = [];
  private readonly imageListeners: (() => void)[] = [];
  /** What the members offered at the last round, to tell the engine when it changes. */
  private offered = '';
  /** Which members take sandboxes and the images each has, at the last round (for `images.onChange`). */
  private held = '';
  private timer: NodeJS.Timeout | undefined;
  /** Closed: a hearing still under way records nothing more. */
  private closed = false;
  /** The registry's read under way, and the hearings it started. */
  private syncing: Promise<Promise<void>[]> | undefined;
  private readonly now: () => number;
  readonly images: ImageBuilder;

  constructor(private readonly o: FleetOptions) {
    this.now = o.now ?? Date.now;
    if (o.local)
      this.members.set(LOCAL, {
        name: LOCAL,
        backend: o.local,
        state: 'active',
        capacity: { memoryMb: 0, cpus: 0 },
        runtimes: [],
        teamBound: false,
        heardAt: 0,
        images: new Set(),
      });
    this.images = {
      // A template's image is usable when every member that takes sandboxes has it.
      idOf: async (ref) => {
        const ids = await Promise.all(this.placing().map((m) => m.backend.images?.idOf(ref) ?? null));
        return ids.length && ids.every((id) => id) ? ids[0]! : null;
      },
      basePerHost: true,
      // Built on every member that takes sandboxes and lacks it, all at once (each host's engine
      // builds its own), each line led by the member's name when there are several. A member's
      // failure does not end the others' builds: when some member has the image at the end, the
      // build resolves with where it is missing (sandboxes of it go where it is; the caller tries
      // those again); when none has it (or the build was aborted), it fails with the first error.
      build: async (recipe, opts) => {
        const builders = this.placing().filter((m) => m.backend.images);
        const has = await Promise.all(builders.map((m) => m.backend.images!.idOf(recipe.tag)));
        const lacking = builders.filter((_, i) => !has[i]);
        const results = await Promise.allSettled(
          lacking.map(async (m) => {
            const images = m.backend.images!;
            const onLine = lacking.length > 1 ? (line: string) => opts.onLine(`[${m.name}] ${line}`) : opts.onLine;
            if (lacking.length === 1) opts.onLine(`[${m.name}]`);
            await images.build({ ...recipe, base: await baseOn(images, recipe) }, { ...opts, onLine });
            m.images.add(recipe.tag);
          }),
        );
        const failed = results.flatMap((r, i) =>
          r.status === 'rejected' ? [{ host: lacking[i]!.name, err: r.reason as Error }] : [],
        );
        if (!failed.length) return;
        if (opts.signal.aborted || failed.length === builders.length) {
          for (const f of failed.slice(1)) opts.onLine(`[${f.host}] failed too: ${f.err.message}`);
          throw failed[0]!.err;
        }
        for (const f of failed) opts.onLine(`[${f.host}] failed: ${f.err.message}`);
        return { missingOn: failed.map((f) => ({ host: f.host, error: f.err.message })) };
      },
      remove: async (ref) => {
        await Promise.all([...this.members.values()].map((m) => m.backend.images?.remove(ref).catch(() => undefined)));
      },
      // What every member that takes sandboxes said it has at its last heartbeat (no call now).
      held: async () => {
        const [first, ...rest] = this.placing().map((m) => m.images);
        return first ? [...first].filter((t) => rest.every((images) => images.has(t))).sort() : [];
      },
      onChange: (listener) => this.imageListeners.push(listener),
    };
  }

  /** Reads the registry and hears from every member now, then again every `heartbeatMs`. */
  async open(): Promise<void> {
    // A beat waits for no answer: each member's is noticed when it comes (`hearOut`), so one slow
    // to answer (a ping waits up to 5 s) holds up no other's heartbeat, from the first beat on.
    this.timer = setInterval(
      () =>
        void this.sync()
          .then(() => this.notice())
          .catch((err) => this.o.log?.error({ err }, 'could not read the sandbox node registry')),
      this.o.heartbeatMs ?? 5000,
    );
    this.timer.unref();
    await this.refresh();
  }

  close(): void {
    this.closed = true;
    clearInterval(this.timer);
    for (const m of this.members.values()) if (m.backend instanceof RemoteBackend) m.backend.close();
  }

  /**
   * The registry read now and every member heard (each for as long as its ping waits, at most):
   * the nodes that joined or left, and what each says, recorded for every replica.
   */
  async refresh(): Promise<void> {
    await Promise.all(await this.sync());
    this.notice();
  }

  /** Reads the registry and starts hearing each member that is not being heard already. */
  private sync(): Promise<Promise<void>[]> {
    this.syncing ??= this.readRegistry()
      .then(() =>
        [...this.members.values()].map((m) => (m.hearing ??= this.hearOut(m).finally(() => (m.hearing = undefined)))),
      )
      .finally(() => (this.syncing = undefined));
    return this.syncing;
  }

  /** The registry's nodes that joined or left, and each one's state. */
  private async readRegistry(): Promise<void> {
    const rows = await this.o.db.select().from(sandboxNodes);
    const named = new Set(rows.map((r) => r.name));
    for (const [name, m] of this.members) {
      if (name === LOCAL || named.has(name)) continue;
      if (m.backend instanceof RemoteBackend) m.backend.close();
      this.members.delete(name);
    }
    for (const r of rows) {
      let m = this.members.get(r.name);
      if (!m || m.url !== r.url) {
        if (m?.backend instanceof RemoteBackend) m.backend.close();
        m = {
          name: r.name,
          url: r.url,
          backend: new RemoteBackend({ url: r.url, name: r.name, credentials: this.o.credentials }),
          state: r.state,
          capacity: { memoryMb: r.memoryMb, cpus: r.cpus },
          runtimes: r.runtimes,
          teamBound: false,
          heardAt: 0,
          images: new Set(r.images),
        };
        this.members.set(r.name, m);
      }
      m.state = r.state;
    }
  }

  /** Hears a member; one that did not answer may be lost to the installation (`declareLost`). */
  private async hearOut(m: Member): Promise<void> {
    const ok = await this.hear(m);
    if (this.closed) return;
    if (!ok && m.name !== LOCAL)
      await this.declareLost(m.name).catch((err) =>
        this.o.log?.error({ err, node: m.name }, 'could not mark the sandboxes of a silent node'),
      );
    this.notice();
  }

  /** Tells the listeners when what the members offer, or the images they hold, changed. */
  private notice(): void {
    const offered = JSON.stringify([this.offers(), this.teamBound()]);
    if (offered !== this.offered) {
      this.offered = offered;
      for (const l of this.listeners) l();
    }
    const held = JSON.stringify(this.placing().map((m) => [m.name, [...m.images].sort()]));
    if (held !== this.held) {
      this.held = held;
      for (const l of this.imageListeners) l();
    }
  }

  /**
   * Marks removed the sandboxes on a node that did not answer this replica just now and that no
   * replica has heard from for the grace period, by the database's clock, which every replica
   * shares. A node this replica did hear is never declared lost, however long it took to answer.
   * Any replica may do it; it is idempotent.
   */
  private async declareLost(node: string): Promise<void> {
    const graceS = (this.o.lostGraceMs ?? 60_000) / 1000;
    const lost = rowsOf<{ id: string }>(
      await this.o.db.execute(sql`
        update sandboxes s set state = 'removed', removed_reason = 'node_lost', removed_at = now()
        from sandbox_nodes n
        where s.state <> 'removed' and n.name = ${node} and s.container_id like n.name || '/%'
          and coalesce(n.last_heard_at, n.created_at) < now() - make_interval(secs => ${graceS})
        returning s.id`),
    );
    if (lost.length)
      this.o.log?.warn(
        { sandboxes: lost.map((l) => l.id), nodes: [node] },
        'sandbox node lost: its sandboxes are marked removed',
      );
  }

  onCapabilities(listener: () => void): void {
    this.listeners.push(listener);
  }

  /**
   * What the members heard so far offer together (a member keeps what it last said while it is
   * silent, so a node's blip does not take its runtime away): each sandbox then goes to a member
   * that has what it needs, and none having it now is a 429 saying so. With none heard yet: runc.
   */
  private offers(): RuntimeOffer[] {
    const runtimes: RuntimeOffer[] = [];
    for (const runtime of ['runc', 'gvisor'] as const) {
      const offers = [...this.members.values()].flatMap((m) => m.runtimes.filter((r) => r.runtime === runtime));
      if (offers.length)
        runtimes.push({
          runtime,
          egress: offers.some((r) => r.egress),
          // Made pausable wherever it lands: a node that cannot pause makes it an unpausable one.
          ...(offers.some((r) => r.pause) ? { pause: true } : {}),
        });
    }
    if (!runtimes.length) runtimes.push({ runtime: 'runc', egress: false });
    return runtimes;
  }

  /**
   * Whether warm containers must be made for a team: when any member binds a container to its
   * team (fair share on its host), since a warm one may be placed there.
   */
  private teamBound(): boolean {
    return [...this.members.values()].some((m) => m.teamBound);
  }

  /** Asks the member what it has now and records it; false when it did not answer. */
  private async hear(m: Member): Promise<boolean> {
    try {
      const [capacity, caps, , held] = await Promise.all([
        m.backend.capacity ? m.backend.capacity() : Promise.resolve(m.capacity),
        m.backend.capabilities(),
        m.backend.ping(5000),
        // A node of an older version does not say: it keeps what it said before.
        m.backend.images?.held?.().catch((err) => {
          this.o.log?.warn({ err, node: m.name }, 'sandbox node did not say which template images it has');
          return null;
        }),
      ]);
      m.capacity = capacity;
      m.runtimes = caps.runtimes;
      m.teamBound = caps.teamBound;
      m.heardAt = this.now();
      if (held) m.images = new Set(held);
      if (m.name === LOCAL || this.closed) return true;
      await this.o.db
        .update(sandboxNodes)
        .set({
          memoryMb: capacity.memoryMb,
          cpus: capacity.cpus,
          runtimes: caps.runtimes,
          images: [...m.images].sort(),
          lastHeardAt: sql`greatest(${sandboxNodes.lastHeardAt}, now())`,
          lastError: null,
        })
        .where(eq(sandboxNodes.name, m.name));
      return true;
    } catch (err) {
      this.o.log?.warn({ err, node: m.name }, 'sandbox node did not answer');
      const lost = this.o.lostMs ?? 15_000;
      if (m.backend instanceof RemoteBackend && m.heardAt > 0 && this.now() - m.heardAt > lost) {
        this.o.log?.warn(
          { node: m.name, silentMs: this.now() - m.heardAt },
          'sandbox node lost: dropping its connection',
        );
        m.backend.close(true);
        // Declared once: the next answer makes it heard again.
        m.heardAt = 0;
      }
      if (m.name !== LOCAL && !this.closed)
        await this.o.db
          .update(sandboxNodes)
          .set({ lastError: (err as Error).message.slice(0, 500) })
          .where(eq(sandboxNodes.name, m.name))
          .catch(() => undefined);
      return false;
    }
  }

  /** Members that take new sandboxes: active and heard from lately. */
  private placing(): Member[] {
    const silent = this.o.silentMs ?? 30_000;
    return [...this.members.values()].filter((m) => m.state === 'active' && this.now() - m.heardAt <= silent);
  }

  private split(id: string): { member: Member; id: string } {
    const { node, id: inner } = containerNode(id);
    const member = this.members.get(node);
    if (!member) throw new FleetGone(`sandbox node ${node} is not in the registry`);
    return { member, id: inner };
  }

  private join(member: Member, id: string): string {
    return member.name === LOCAL ? id : `${member.name}/${id}`;
  }

  private on(container: SandboxContainer): { member: Member; container: SandboxContainer } {
    const { member, id } = this.split(container.id);
    return { member, container: { ...container, id } };
  }

  async create(req: ContainerRequest): Promise<SandboxContainer> {
    if (!this.members.size || !this.placing().length) await this.refresh();
    const needsEgress = req.network?.mode === 'allowlist';
    const able = this.placing().filter((m) =>
      m.runtimes.some((r) => r.runtime === req.runtime && (!needsEgress || r.egress)),
    );
    const scored = rankPlacement(able, await placedOn(this.o.db, req.teamId), req);
    if (!scored.length)
      throw new ApiError(
        'sandbox_unavailable',
        able.length
          ? `every sandbox node that runs ${req.runtime} is full (${req.limits.memoryMb} MB asked); try again when sandboxes end, or add a node`
          : `no sandbox node is taking ${req.runtime} sandboxes${needsEgress ? ' with egress' : ''} now (${this.members.size} registered)`,
      );
    const failed: string[] = [];
    // A node that fails the create (unreachable, or its engine refused) is passed over for the
    // next best, up to three; a refusal of the request itself (an ApiError) is final.
    for (const m of scored.slice(0, 3)) {
      try {
        const made = await m.backend.create(req);
        return { ...made, id: this.join(m, made.id) };
      } catch (err) {
        if (err instanceof ApiError) throw err;
        this.o.log?.warn({ err, node: m.name }, 'sandbox node could not create a sandbox; trying the next');
        failed.push(`${m.name}: ${(err as Error).message.slice(0, 200)}`);
      }
    }
    throw new ApiError(
      'sandbox_unavailable',
      `no sandbox node could create the sandbox now (${failed.join('; ')}); try again`,
      {},
      { 'Retry-After': '5' },
    );
  }

  async start(container: SandboxContainer): Promise<void> {
    const on = this.on(container);
    await on.member.backend.start(on.container);
  }
  attachRunner(container: SandboxContainer): Promise<RunnerChannel> {
    const on = this.on(container);
    return on.member.backend.attachRunner(on.container);
  }
  async update(container: SandboxContainer, limits: SandboxLimits): Promise<void> {
    const on = this.on(container);
    await on.member.backend.update(on.container, limits);
  }
  async remove(containerId: string): Promise<void> {
    const { member, id } = this.split(containerId);
    await member.backend.remove(id);
  }
  async list(): Promise<ListedContainer[]> {
    const lists = await Promise.all(
      [...this.members.values()].map(async (m) => {
        try {
          return (await m.backend.list()).map((c) => ({ ...c, id: this.join(m, c.id) }));
        } catch (err) {
          // A member that cannot be listed now is left out: nothing is decided from its absence.
          this.o.log?.warn({ err, node: m.name }, 'could not list a sandbox node');
          return [];
        }
      }),
    );
    return lists.flat();
  }
  stats(containerId: string): Promise<Usage | null> {
    const { member, id } = this.split(containerId);
    return member.backend.stats(id).catch(() => null);
  }
  /** On the node that holds it: its checkpoint stays on that host, and it resumes there. */
  async pause(container: SandboxContainer): Promise<{ bytes: number | null }> {
    const on = this.on(container);
    if (!on.member.backend.pause) throw new Error(`sandbox node ${on.member.name} cannot pause sandboxes`);
    return on.member.backend.pause(on.container);
  }
  resume(container: SandboxContainer, lifetimeEndsAt: number): Promise<RunnerChannel> {
    const on = this.on(container);
    if (!on.member.backend.resume) throw new Error(`sandbox node ${on.member.name} cannot resume sandboxes`);
    return on.member.backend.resume(on.container, lifetimeEndsAt);
  }
  /** On the node that runs it: any replica reaches a node's sandboxes. */
  reattach(container: SandboxContainer): Promise<RunnerChannel> {
    const on = this.on(container);
    if (!on.member.backend.reattach) throw new Error(`sandbox node ${on.member.name} cannot reattach to runners`);
    return on.member.backend.reattach(on.container);
  }
  /** On the node that holds it, from that node's copy of the workspace. */
  async fillTree(container: SandboxContainer, workspaceId: string, dir: string): Promise<void> {
    const on = this.on(container);
    if (!on.member.backend.fillTree) throw new Error(`sandbox node ${on.member.name} keeps no workspace trees`);
    await on.member.backend.fillTree(on.container, workspaceId, dir);
  }
  async capabilities(): Promise<BackendCapabilities> {
    if (!this.offered) await this.refresh();
    // Nodes mount nothing of the API's host: a node that keeps workspace trees fills a mount of its
    // own (fillTree); other members, the local one too, get the tree as a tar.
    return { runtimes: this.offers(), hostWorkspaceMounts: false, resizable: sameShape, teamBound: this.teamBound() };
  }
  async ping(timeoutMs?: number): Promise<void> {
    if (this.o.local) return this.o.local.ping(timeoutMs);
    if (!this.placing().length) throw new Error('no sandbox node has answered lately');
  }
  isGone(err: unknown): boolean {
    return err instanceof FleetGone || [...this.members.values()].some((m) => m.backend.isGone(err));
  }
  async setAllow(container: SandboxContainer, allow: readonly string[]): Promise<void> {
    const on = this.on(container);
    await on.member.backend.setAllow?.(on.container, allow);
  }
  async takeEgress(container: SandboxContainer): Promise<EgressEvent[]> {
    const on = this.on(container);
    return (await on.member.backend.takeEgress?.(on.container)) ?? [];
  }
  async sweepEgress(instance: string, opts?: { all?: boolean }): Promise<void> {
    await Promise.all(
      [...this.members.values()].map((m) => m.backend.sweepEgress?.(instance, opts).catch(() => undefined)),
    );
  }
}

/** A container on a node the registry no longer has: gone, as far as this installation can tell. */
class FleetGone extends Error {}

/** What `rankPlacement` needs of a member. */
type Placeable = Pick<Member, 'name' | 'capacity' | 'images'>;

/**
 * The members a sandbox may go to, best first: those with the memory left for it (after what is
 * `committed` there), those that have its image before those that said they lack it (a template's
 * image on a host that joined after its build, until it is built there), then the fewest of the
 * team's own sandboxes (one host lost costs a team as little as can be), then the most room.
 */
export function rankPlacement<M extends Placeable>(
  able: M[],
  committed: Map<string, { memoryMb: number; cpus: number; team: number }>,
  req: Pick<ContainerRequest, 'image' | 'limits'>,
): M[] {
  // Only template images are listed: an image no member lists (the base image) is on every one.
  const listed = able.some((m) => m.images.has(req.image));
  return able
    .map((m) => {
      const c = committed.get(m.name) ?? { memoryMb: 0, cpus: 0, team: 0 };
      const freeMb = m.capacity.memoryMb - c.memoryMb;
      const free =
        (freeMb - req.limits.memoryMb) / Math.max(1, m.capacity.memoryMb) +
        (0.1 * (m.capacity.cpus - c.cpus)) / Math.max(1, m.capacity.cpus);
      const lacks = listed && !m.images.has(req.image) ? 1 : 0;
      return { m, fits: freeMb >= req.limits.memoryMb, lacks, team: c.team, free };
    })
    .filter((s) => s.fits)
    .sort((a, b) => a.lacks - b.lacks || a.team - b.team || b.free - a.free)
    .map((s) => s.m);
}

/**
 * The base a member builds a template on: the image its sandboxes start from, i.e. what the base's
 * name is there now (a host whose base was built there has an id of its own); the recipe's id only
 * where the member has no image of that name. Never the recorded id over the name: a host whose
 * base was replaced may still hold the old id (kept by an earlier build's cached layers, or by a
 * sandbox that runs it), and would build every template on what it no longer runs.
 */
async function baseOn(images: ImageBuilder, recipe: ImageRecipe): Promise<string> {
  return (recipe.baseRef && (await images.idOf(recipe.baseRef))) || recipe.base;
}
