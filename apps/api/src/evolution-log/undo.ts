import { and, eq } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { evolutions } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import type { Provenance } from '../workspace/git-repos.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { forgetRecent, getEvolution, type EvolutionRow } from './evolutions.ts';

/**
 * Undoes what an evolution committed with a revert commit (history is never rewritten) and
 * marks it `reverted`. Used by the API and by the agent when a user asks it to undo a change.
 */
export async function undoEvolution(
  db: Db,
  workspaces: WorkspaceService,
  ws: WorkspaceRow,
  evolutionId: string,
  prov: Provenance,
): Promise<{ evolution: EvolutionRow; sha: string; paths: string[] }> {
  const evo = await getEvolution(db, ws.teamId, evolutionId);
  if (evo.workspaceId !== ws.id) throw ApiError.notFound('evolution');
  if (evo.status === 'reverted') throw new ApiError('conflict', `evolution ${evo.id} was already undone`);
  if (evo.status !== 'committed' || !evo.commitSha)
    throw new ApiError('conflict', `evolution ${evo.id} changed nothing (${evo.status}); there is nothing to undo`);
  const outcome = await workspaces.revert(ws, evo.commitSha, prov);
  const [row] = await db
    .update(evolutions)
    .set({ status: 'reverted' })
    .where(and(eq(evolutions.id, evo.id), eq(evolutions.status, 'committed')))
    .returning();
  if (!row) throw new ApiError('conflict', `evolution ${evo.id} was undone at the same moment by someone else`);
  forgetRecent(ws.id);
  return { evolution: row, sha: outcome.commit!.sha, paths: outcome.commit!.paths };
}
