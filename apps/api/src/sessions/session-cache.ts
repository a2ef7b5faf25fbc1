import type { Db } from '../db/client.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { getActiveSessionWithWorkspace, type SessionRow } from './sessions.ts';

const MAX_ENTRIES = 10_000;

/**
 * The hot path of every execution asks "is this session active, and what may its workspace's
 * sandbox use?". Answers are kept for `ttlMs`: ending a session through this process is seen at
 * once (`forget`), a workspace settings change or an end on another replica within `ttlMs`.
 */
export class SessionCache {
  private entries = new Map<string, { value: { session: SessionRow; workspace: WorkspaceRow }; at: number }>();

  constructor(
    private readonly db: Db,
    private readonly ttlMs = 2_000,
  ) {}

  async activeWithWorkspace(teamId: string, sessionId: string) {
    const key = `${teamId}/${sessionId}`;
    const hit = this.entries.get(key);
    if (hit && Date.now() - hit.at < this.ttlMs) return hit.value;
    const value = await getActiveSessionWithWorkspace(this.db, teamId, sessionId);
    if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(key, { value, at: Date.now() });
    return value;
  }

  forget(sessionId: string): void {
    for (const key of this.entries.keys()) if (key.endsWith(`/${sessionId}`)) this.entries.delete(key);
  }
}
