import { and, desc, eq, inArray } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { evolutions } from '../db/schema/index.ts';
import { ApiError } from '../http/errors.ts';
import type { Provenance } from '../workspace/repo.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { WorkspaceRow } from '../workspace/workspaces.ts';
import { getEvolution, type EvolutionRow } from './evolutions.ts';

/**
 * Undoes what an evolution committed with a revert commit (history is never rewritten) and
 * marks it `reverted`. Used by the API and by the agent when a user asks it to undo a change.
 */
export async function undoEvolution(db: Db, workspaces: WorkspaceService, ws: WorkspaceRow, evolutionId: string, prov: Provenance): Promise<{ evolution: EvolutionRow; sha: string; paths: string[] }> {
  const evo = await getEvolution(db, ws.teamId, evolutionId);
  if (evo.workspaceId !== ws.id) throw ApiError.notFound('evolution');
  if (evo.status === 'reverted') throw new ApiError('conflict', `evolution ${evo.id} was already undone`);
  if (evo.status !== 'committed' || !evo.commitSha) throw new ApiError('conflict', `evolution ${evo.id} changed nothing (${evo.status}); there is nothing to undo`);
  const outcome = await workspaces.revert(ws, evo.commitSha, prov);
  const [row] = await db
    .update(evolutions)
    .set({ status: 'reverted' })
    .where(and(eq(evolutions.id, evo.id), eq(evolutions.status, 'committed')))
    .returning();
  if (!row) throw new ApiError('conflict', `evolution ${evo.id} was undone at the same moment by someone else`);
  return { evolution: row, sha: outcome.commit!.sha, paths: outcome.commit!.paths };
}

/** The last few changes self-evolution made in a workspace, for the agent's prompt (so "undo that" has a name). */
export async function recentEvolutions(db: Db, workspaceId: string, limit = 5) {
  return db
    .select({ id: evolutions.id, kind: evolutions.kind, status: evolutions.status, summary: evolutions.summary, paths: evolutions.changedPaths, at: evolutions.finishedAt })
    .from(evolutions)
    .where(and(eq(evolutions.workspaceId, workspaceId), inArray(evolutions.status, ['committed', 'reverted'])))
    .orderBy(desc(evolutions.id))
    .limit(limit);
}
