import { eq, like, ne } from 'drizzle-orm';
import type { Db } from '../../db/client.ts';
import { sandboxes, sandboxNodes } from '../../db/schema/index.ts';
import { ApiError } from '../../lib/errors.ts';
import type { SandboxLimits } from '../limits.ts';

/** The API host's own engine, when it runs sandboxes too (a name no node may have). Its containers' ids carry no node name. */
export const LOCAL = 'local';

/** The member a container id names (`<node>/<id on the node>`; one without a node is the local engine's), and its id there. */
export function containerNode(containerId: string): { node: string; id: string } {
  const at = containerId.indexOf('/');
  return at < 0 ? { node: LOCAL, id: containerId } : { node: containerId.slice(0, at), id: containerId.slice(at + 1) };
}

/** The same test in SQL, for a sandbox row: its container is on a sandbox node (any replica reaches it there). */
export const onANode = () => like(sandboxes.containerId, '%/%');

/** What is placed on one member: the limits of its sandboxes not removed, their count, and how many are one team's. */
export interface Placed {
  memoryMb: number;
  cpus: number;
  sandboxes: number;
  team: number;
}

/**
 * The sandboxes not removed on every member, by every replica (read from `sandboxes`, one
 * statement): a container id `<node>/<id>` names its node; one without a node is the local
 * engine's; one still being created has no container (and no member) yet.
 */
export async function placedOn(db: Db, team = ''): Promise<Map<string, Placed>> {
  const rows = await db
    .select({ containerId: sandboxes.containerId, limits: sandboxes.limits, teamId: sandboxes.teamId })
    .from(sandboxes)
    .where(ne(sandboxes.state, 'removed'));
  const out = new Map<string, Placed>();
  for (const r of rows) {
    if (!r.containerId) continue;
    const name = containerNode(r.containerId).node;
    const l = r.limits as Partial<SandboxLimits>;
    const c = out.get(name) ?? { memoryMb: 0, cpus: 0, sandboxes: 0, team: 0 };
    c.memoryMb += l.memoryMb ?? 0;
    c.cpus += l.cpus ?? 0;
    c.sandboxes++;
    if (team && r.teamId === team) c.team++;
    out.set(name, c);
  }
  return out;
}

type NodeRow = typeof sandboxNodes.$inferSelect;

/** A registered node as org admins see it: the row, what is placed on it, and whether it is heard. */
export interface NodeView {
  name: string;
  url: string;
  state: 'active' | 'draining';
  /** heard: some replica had an answer within `silentMs`; silent: none has. */
  health: 'heard' | 'silent';
  capacity: { memory_mb: number; cpus: number };
  committed: { memory_mb: number; cpus: number };
  sandboxes: number;
  runtimes: { runtime: 'runc' | 'gvisor'; egress: boolean }[];
  /** The template images it has, as it last said. */
  images: string[];
  last_heard_at: string | null;
  last_error: string | null;
  created_at: string;
}

function view(r: NodeRow, placed: Map<string, Placed>, silentMs: number): NodeView {
  const p = placed.get(r.name) ?? { memoryMb: 0, cpus: 0, sandboxes: 0, team: 0 };
  return {
    name: r.name,
    url: r.url,
    state: r.state,
    health: r.lastHeardAt && Date.now() - r.lastHeardAt.getTime() <= silentMs ? 'heard' : 'silent',
    capacity: { memory_mb: r.memoryMb, cpus: r.cpus },
    committed: { memory_mb: p.memoryMb, cpus: p.cpus },
    sandboxes: p.sandboxes,
    runtimes: r.runtimes,
    images: r.images,
    last_heard_at: r.lastHeardAt?.toISOString() ?? null,
    last_error: r.lastError,
    created_at: r.createdAt.toISOString(),
  };
}

/** The sandbox nodes of the installation (docs/scaling.md), managed by org admins. */
export class NodeRegistry {
  constructor(
    private readonly db: Db,
    private readonly silentMs = 30_000,
  ) {}

  async list(): Promise<NodeView[]> {
    const [rows, placed] = await Promise.all([
      this.db.select().from(sandboxNodes).orderBy(sandboxNodes.name),
      placedOn(this.db),
    ]);
    return rows.map((r) => view(r, placed, this.silentMs));
  }

  async get(name: string): Promise<NodeView> {
    const [r] = await this.db.select().from(sandboxNodes).where(eq(sandboxNodes.name, name));
    if (!r) throw new ApiError('not_found', `no sandbox node named ${name}`);
    return view(r, await placedOn(this.db), this.silentMs);
  }

  async add(name: string, url: string): Promise<NodeView> {
    if (name === LOCAL)
      throw new ApiError('invalid_request', `"${LOCAL}" names this server's own engine; choose another name`);
    const [r] = await this.db.insert(sandboxNodes).values({ name, url }).onConflictDoNothing().returning();
    if (!r) throw new ApiError('conflict', `a sandbox node named ${name} is registered already`);
    return view(r, new Map(), this.silentMs);
  }

  /** No new sandboxes on it; the ones it has end as usual (idle, session end, lifetime). */
  async drain(name: string): Promise<{ before: NodeView; after: NodeView }> {
    const before = await this.get(name);
    await this.db.update(sandboxNodes).set({ state: 'draining' }).where(eq(sandboxNodes.name, name));
    return { before, after: await this.get(name) };
  }

  /** Forgets a drained node once no sandbox of the installation is on it. */
  async remove(name: string): Promise<NodeView> {
    const before = await this.get(name);
    if (before.state !== 'draining')
      throw new ApiError('conflict', `drain sandbox node ${name} first (POST /v1/system/nodes/${name}/drain)`);
    if (before.sandboxes)
      throw new ApiError(
        'conflict',
        `sandbox node ${name} still has ${before.sandboxes} sandbox(es); they end at their idle time or lifetime`,
      );
    await this.db.delete(sandboxNodes).where(eq(sandboxNodes.name, name));
    return before;
  }
}
