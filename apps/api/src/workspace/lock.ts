/**
 * One writer at a time per key (a workspace): callers queue and run in arrival order, and a
 * failing writer never blocks the next one.
 */
class KeyedMutex {
  private tails = new Map<string, Promise<unknown>>();

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}

/** A lock every replica on the database respects (`Database.lock`); resolves with its release. */
export type SharedLock = (key: string) => Promise<() => Promise<void>>;

/**
 * The workspace write lock: one writer at a time per workspace across every replica. Writers of
 * this process queue in memory first, so a process holds at most one database lock per workspace;
 * the one at the head of the queue then takes the shared lock (when the database has one: PGlite,
 * which only one process opens, needs none) for its write and commit.
 */
export class WorkspaceLock {
  private readonly local = new KeyedMutex();

  constructor(private readonly shared?: SharedLock) {}

  run<T>(workspaceId: string, fn: () => Promise<T>): Promise<T> {
    const shared = this.shared;
    if (!shared) return this.local.run(workspaceId, fn);
    return this.local.run(workspaceId, async () => {
      const release = await shared(`workspace:${workspaceId}`);
      try {
        return await fn();
      } finally {
        await release();
      }
    });
  }
}
