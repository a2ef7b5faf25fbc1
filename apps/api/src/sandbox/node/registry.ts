import { and, eq, like, ne } from 'drizzle-orm';
import type { Db } from '../../db/client.ts';
import { sandboxes, sandboxNodes } from '../../db/schema/index.ts';
import { ApiError } from '../../lib/errors.ts';
import type { SandboxLimits } from '../limits.ts';
import { LOCAL } from './fleet.ts';

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
  last_heard_at: string | null;
  last_error: string | null;
  created_at: string;
}

const onNode = (name: string) => and(like(sandboxes.containerId, `${name}/%`), ne(sandboxes.state, 'removed'));

async function view(db: Db, r: NodeRow, silentMs: number): Promise<NodeView> {
  const placed = await db.select({ limits: sandboxes.limits }).from(sandboxes).where(onNode(r.name));
  const committed = placed.reduce(
    (acc, p) => {
      const l = p.limits as Partial<SandboxLimits>;
      return { memory_mb: acc.memory_mb + (l.memoryMb ?? 0), cpus: acc.cpus + (l.cpus ?? 0) };
    },
    { memory_mb: 0, cpus: 0 },
  );
  return {
    name: r.name,
    url: r.url,
    state: r.state,
    health: r.lastHeardAt && Date.now() - r.lastHeardAt.getTime() <= silentMs ? 'heard' : 'silent',
    capacity: { memory_mb: r.memoryMb, cpus: r.cpus },
    committed,
    sandboxes: placed.length,
    runtimes: r.runtimes,
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
    const rows = await this.db.select().from(sandboxNodes).orderBy(sandboxNodes.name);
    return Promise.all(rows.map((r) => view(this.db, r, this.silentMs)));
  }

  async get(name: string): Promise<NodeView> {
    const [r] = await this.db.select().from(sandboxNodes).where(eq(sandboxNodes.name, name));
    if (!r) throw new ApiError('not_found', `no sandbox node named ${name}`);
    return view(this.db, r, this.silentMs);
  }

  async add(name: string, url: string): Promise<NodeView> {
    if (name === LOCAL)
      throw new ApiError('invalid_request', `"${LOCAL}" names this server's own engine; choose another name`);
    const [r] = await this.db.insert(sandboxNodes).values({ name, url }).onConflictDoNothing().returning();
    if (!r) throw new ApiError('conflict', `a sandbox node named ${name} is registered already`);
    return view(this.db, r, this.silentMs);
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
