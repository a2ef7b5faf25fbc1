import type { CacheNews } from '../db/cache-news.ts';
import type { Db } from '../db/client.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { getActiveSessionWithWorkspace, type SessionRow } from './sessions.ts';

const MAX_ENTRIES = 10_000;

/**
 * The hot path of every execution asks "is this session active, and what may its workspace's
 * sandbox use?". Answers are kept for `ttlMs`, less when news (`CacheNews`) of the session's end
 * or of its workspace's settings arrives from this or another replica: then at once.
 */
export class SessionCache {
  private entries = new Map<string, { value: { session: SessionRow; workspace: WorkspaceRow }; at: number }>();

  constructor(
    private readonly db: Db,
    news: CacheNews,
    private readonly ttlMs = 2_000,
  ) {
    news.on('session', (sessionId) => this.forget((key) => key.endsWith(`/${sessionId}`)));
    news.on('workspace', (workspaceId) => this.forget((_, e) => e.value.workspace.id === workspaceId));
  }

  async activeWithWorkspace(teamId: string, sessionId: string) {
    const key = `${teamId}/${sessionId}`;
    const hit = this.entries.get(key);
    if (hit && Date.now() - hit.at < this.ttlMs) return hit.value;
    const value = await getActiveSessionWithWorkspace(this.db, teamId, sessionId);
    if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(key, { value, at: Date.now() });
    return value;
  }

  private forget(stale: (key: string, entry: { value: { workspace: WorkspaceRow } }) => boolean): void {
    for (const [key, entry] of this.entries) if (stale(key, entry)) this.entries.delete(key);
  }
}
