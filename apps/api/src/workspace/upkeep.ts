import { eq, isNull } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { commits, workspaces } from '../db/schema/index.ts';
import type { VectorFill } from '../memory/vectors.ts';
import { reindexAll, staleIndexes } from '../memory/indexer.ts';
import type { CommitInfo, WorkspaceRepos } from './git-repos.ts';
import type { WorkspaceLock } from './lock.ts';
import type { WorkspaceRow } from './records.ts';

/** What upkeep reaches: the repositories, the database, the per-workspace lock, and the service's commit mirror. */
interface UpkeepDeps {
  db: Db;
  repos: WorkspaceRepos;
  lock: WorkspaceLock;
  log: Logger;
  vectors?: VectorFill;
  /** Mirrors a commit into the table and moves the workspace head (service.ts). */
  record(ws: { id: string; teamId: string }, c: CommitInfo): Promise<void>;
  /** What the memory index of a workspace is built from (service.ts). */
  indexTarget(ws: { id: string; teamId: string }): Promise<Parameters<typeof reindexAll>[1]>;
}

/**
 * The work on workspaces that no request asks for: the start-up repair of every repository, and
 * the background re-index of memory indexes an older version (or another embeddings model)
 * built. Each holds the workspace's lock while it touches one, as a commit would.
 */
export class WorkspaceUpkeep {
  private reindexing: Promise<void> | undefined;
  private stopReindex = false;

  constructor(private readonly deps: UpkeepDeps) {}

  /**
   * Re-indexes every workspace whose index an older chunking or ranking built (after an
   * upgrade) or another embeddings model embedded (KILN_EMBEDDINGS_MODEL changed). Searches keep
   * answering from the old index meanwhile: each workspace's index is replaced in one
   * transaction. Replicas share the work: a workspace another server is re-indexing is skipped.
   * The promise ends with the job; start-up does not wait for it, `stopReindexing` ends it early.
   */
  reindexStale(): Promise<void> {
    this.stopReindex = false;
    this.reindexing ??= (async () => {
      try {
        // Chunks a stopped process wrote without their vectors get them now.
        await this.deps.vectors?.sweep();
        const ids = await staleIndexes(this.deps.db, this.deps.vectors?.embedder.model);
        if (!ids.length) return;
        this.deps.log.info(
          { workspaces: ids.length },
          'memory index: re-indexing workspaces built by an older version or another embeddings model',
        );
        let done = 0;
        for (const id of ids) {
          if (this.stopReindex) break;
          const [ws] = await this.deps.db.select().from(workspaces).where(eq(workspaces.id, id));
          if (!ws || ws.deletedAt || !this.deps.repos.exists(id)) continue;
          try {
            const n = await this.deps.lock.run(id, async () =>
              reindexAll(this.deps.db, await this.deps.indexTarget(ws), this.deps.vectors, { onlyIfStale: true }),
            );
            if (n !== null) done++;
          } catch (err) {
            this.deps.log.error(
              { err, workspace: id },
              'memory index: could not re-index a workspace; it is tried again at the next start',
            );
          }
        }
        this.deps.log.info({ reindexed: done, of: ids.length }, 'memory index: re-indexing done');
      } catch (err) {
        this.deps.log.error({ err }, 'memory index: the re-index job failed');
      } finally {
        this.reindexing = undefined;
      }
    })();
    return this.reindexing;
  }

  /** Stops the background re-index after the workspace it is on. */
  async stopReindexing(): Promise<void> {
    this.stopReindex = true;
    await this.reindexing;
  }

  /**
   * Start-up repair of every live workspace: stale git locks removed, uncommitted changes
   * committed by the system, and commits the table missed (a crash between git and the
   * database) mirrored again. A workspace that cannot be repaired is logged, marked
   * (`repair_error`, shown by its GET) and skipped: one workspace never stops the server.
   * The mark is cleared by the next repair that succeeds.
   */
  async repairAll(): Promise<{ repaired: number; failed: number }> {
    const rows = (await this.deps.db.select().from(workspaces).where(isNull(workspaces.deletedAt))) as WorkspaceRow[];
    let repaired = 0;
    let failed = 0;
    for (const ws of rows) {
      try {
        if (await this.repairOne(ws)) repaired++;
        if (ws.repairError !== null)
          await this.deps.db
            .update(workspaces)
            .set({ repairError: null, repairFailedAt: null })
            .where(eq(workspaces.id, ws.id));
      } catch (err) {
        failed++;
        this.deps.log.error({ err, workspace: ws.id }, 'could not repair a workspace; it is marked and skipped');
        const message = (err as Error).message.slice(0, 2000);
        await this.deps.db
          .update(workspaces)
          .set({ repairError: message, repairFailedAt: new Date() })
          .where(eq(workspaces.id, ws.id));
      }
    }
    return { repaired, failed };
  }

  /** Repairs one workspace; true when there was something to repair. */
  private async repairOne(ws: WorkspaceRow): Promise<boolean> {
    if (!this.deps.repos.exists(ws.id)) throw new Error('workspace repository is missing');
    const { removedLocks, recovered, missing } = await this.deps.lock.run(ws.id, async () => {
      const fixed = await this.deps.repos.repair(ws.id);
      const known = new Set(
        (await this.deps.db.select({ sha: commits.sha }).from(commits).where(eq(commits.workspaceId, ws.id))).map(
          (r) => r.sha,
        ),
      );
      const absent = (await this.deps.repos.shas(ws.id)).filter((s) => !known.has(s)).reverse();
      for (const sha of absent) await this.deps.record(ws, await this.deps.repos.commitInfo(ws.id, sha));
      return { ...fixed, missing: absent };
    });
    const head = await this.deps.repos.head(ws.id);
    if (head && head !== ws.head) await this.deps.db.update(workspaces).set({ head }).where(eq(workspaces.id, ws.id));
    if (missing.length || recovered?.commit)
      await reindexAll(this.deps.db, await this.deps.indexTarget(ws), this.deps.vectors);
    const changed = Boolean(removedLocks.length || recovered || missing.length);
    if (changed) {
      const refused = recovered?.refused.map((r) => r.path);
      this.deps.log.warn(
        { workspace: ws.id, removedLocks, recovered: recovered?.commit?.sha, refused, mirrored: missing.length },
        'repaired workspace',
      );
    }
    return changed;
  }
}
