import { sql } from 'drizzle-orm';
import type { Database, Db } from './client.ts';

const CHANNEL = 'kiln_cache';

/** What a replica may hold in a cache that another replica's write changes. */
export type CacheTopic = 'key' | 'session' | 'workspace';
const TOPICS = new Set<string>(['key', 'session', 'workspace']);

/**
 * News of writes that make cached answers stale (a revoked key, an ended session, a workspace's
 * settings changed or the workspace deleted), for every replica on the database: `announce`
 * tells this process at once and, once connected to the database's LISTEN/NOTIFY, every other
 * replica through a `NOTIFY` (delivered when the announcing statement's transaction ends, in
 * milliseconds). Caches keep their short time-to-live too, for the one window left: a replica
 * whose listening connection is down meanwhile.
 */
export class CacheNews {
  private readonly handlers = new Map<CacheTopic, ((id: string) => void)[]>();
  private unlisten: (() => Promise<void>) | undefined;

  constructor(private readonly db: Db) {}

  on(topic: CacheTopic, handler: (id: string) => void): void {
    this.handlers.set(topic, [...(this.handlers.get(topic) ?? []), handler]);
  }

  async connect(listen: NonNullable<Database['listen']>): Promise<void> {
    this.unlisten = await listen(CHANNEL, (payload) => {
      const at = payload.indexOf(':');
      const topic = payload.slice(0, at);
      if (at > 0 && TOPICS.has(topic)) this.tell(topic as CacheTopic, payload.slice(at + 1));
    });
  }

  async disconnect(): Promise<void> {
    await this.unlisten?.();
    this.unlisten = undefined;
  }

  async announce(topic: CacheTopic, id: string): Promise<void> {
    this.tell(topic, id);
    if (this.unlisten) await this.db.execute(sql`select pg_notify(${CHANNEL}, ${`${topic}:${id}`})`);
  }

  private tell(topic: CacheTopic, id: string): void {
    for (const handler of this.handlers.get(topic) ?? []) handler(id);
  }
}
