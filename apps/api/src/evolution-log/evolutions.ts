import { and, desc, eq, inArray } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { evolutions } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { webhookEventWrite } from '../webhooks/events.ts';
import { readHead } from '../workspace/git.ts';

export type EvolutionRow = typeof evolutions.$inferSelect;
export type EvolutionKind = 'review' | 'dream';

/**
 * Where a review or dream stands. `committed` changed the workspace (one commit); `no_change`
 * looked and decided nothing was worth keeping; `skipped` had nothing new to look at;
 * `reverted` was undone afterwards.
 */
export type EvolutionStatus = 'queued' | 'running' | 'committed' | 'no_change' | 'skipped' | 'failed' | 'reverted';

export async function getEvolution(db: Db, teamId: string, id: string): Promise<EvolutionRow> {
  const [row] = await db
    .select()
    .from(evolutions)
    .where(and(eq(evolutions.id, id), eq(evolutions.teamId, teamId)));
  if (!row) throw ApiError.notFound('evolution');
  return row;
}

/** Marks a queued (or re-claimed) evolution running; false when it already ended. */
export async function startEvolution(db: Db, id: string): Promise<EvolutionRow | null> {
  const [row] = await db
    .update(evolutions)
    .set({ status: 'running' })
    .where(and(eq(evolutions.id, id), inArray(evolutions.status, ['queued', 'running'])))
    .returning();
  return row ?? null;
}

export async function endEvolution(
  db: Db,
  id: string,
  v: {
    status: Exclude<EvolutionStatus, 'queued' | 'running'>;
    summary?: string | null;
    commitSha?: string | null;
    changedPaths?: string[];
    diary?: string | null;
    error?: string | null;
    checks?: unknown;
  },
): Promise<void> {
  const end = (tx: Db) =>
    tx
      .update(evolutions)
      .set({
        status: v.status,
        summary: v.summary ?? null,
        commitSha: v.commitSha ?? null,
        changedPaths: v.changedPaths ?? [],
        diary: v.diary ?? null,
        error: v.error ?? null,
        checks: v.checks ?? null,
        finishedAt: new Date(),
      })
      .where(eq(evolutions.id, id))
      .returning({ workspaceId: evolutions.workspaceId, teamId: evolutions.teamId, kind: evolutions.kind });
  // A commit owes the webhooks subscribed to evolution.committed a delivery, in the same transaction as its record.
  const [row] =
    v.status !== 'committed'
      ? await end(db)
      : await db.transaction(async (tx) => {
          const rows = await end(tx as unknown as Db);
          const r = rows[0];
          if (r?.workspaceId) {
            const data = {
              evolution_id: id,
              workspace_id: r.workspaceId,
              kind: r.kind,
              status: 'committed',
              commit_sha: v.commitSha ?? null,
              // The first 100: a body stays small whatever the commit.
              changed_paths: (v.changedPaths ?? []).slice(0, 100),
              links: {
                evolution: `/v1/workspaces/${r.workspaceId}/evolutions/${id}`,
                ...(v.commitSha ? { commit: `/v1/workspaces/${r.workspaceId}/commits/${v.commitSha}` } : {}),
              },
            };
            await tx.execute(webhookEventWrite('evolution.committed', r.teamId, data));
          }
          return rows;
        });
  if (row?.workspaceId) forgetRecent(row.workspaceId);
}

export async function listEvolutions(db: Db, workspaceId: string, p: ListParams & { kind?: EvolutionKind }) {
  const c = cursorOn(evolutions.id, p);
  return db
    .select()
    .from(evolutions)
    .where(and(eq(evolutions.workspaceId, workspaceId), p.kind ? eq(evolutions.kind, p.kind) : undefined, c.where))
    .orderBy(c.orderBy)
    .limit(c.limit);
}

export const evolutionView = (e: EvolutionRow) => ({
  id: e.id,
  kind: e.kind,
  status: e.status,
  session_id: e.sessionId,
  commit_sha: e.commitSha,
  changed_paths: e.changedPaths,
  summary: e.summary,
  diary: e.diary,
  error: e.error,
  created_at: e.createdAt.toISOString(),
  finished_at: e.finishedAt?.toISOString() ?? null,
});

type Recent = { id: string; kind: string; status: string; summary: string | null; paths: string[]; at: Date | null }[];
const recentCache = new Map<string, { head: string; rows: Recent }>();

/** After an evolution's status changed (its commit came first, so HEAD alone does not tell). */
export function forgetRecent(workspaceId: string): void {
  recentCache.delete(workspaceId);
}

/**
 * The last few changes self-evolution made in a workspace, for the agent's prompt (so "undo
 * that" has a name). Every such change, and every undo, is a commit, so the answer is kept
 * until the workspace's HEAD moves, or until this process records a new status (which follows
 * its commit). Another replica's status change shows here with the next commit.
 */
export async function recentEvolutions(db: Db, workspace: { id: string; dir: string }, limit = 5): Promise<Recent> {
  const head = readHead(workspace.dir);
  const hit = recentCache.get(workspace.id);
  if (head && hit?.head === head) return hit.rows;
  const rows = await db
    .select({
      id: evolutions.id,
      kind: evolutions.kind,
      status: evolutions.status,
      summary: evolutions.summary,
      paths: evolutions.changedPaths,
      at: evolutions.finishedAt,
    })
    .from(evolutions)
    .where(and(eq(evolutions.workspaceId, workspace.id), inArray(evolutions.status, ['committed', 'reverted'])))
    .orderBy(desc(evolutions.id))
    .limit(limit);
  if (head) recentCache.set(workspace.id, { head, rows });
  return rows;
}
