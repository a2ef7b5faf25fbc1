import { and, eq, isNull, ne, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { isUniqueViolation } from '../db/errors.ts';
import { workspaces } from '../db/schema/index.ts';
import { withTeamLocked } from '../auth/teams.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';
import { QuotaError } from './quota.ts';
import { applySettingsPatch, DEFAULT_SETTINGS, type SettingsPatch, type WorkspaceSettings } from './settings.ts';

export type WorkspaceRow = typeof workspaces.$inferSelect & { settings: WorkspaceSettings };

const live = (teamId: string) => and(eq(workspaces.teamId, teamId), isNull(workspaces.deletedAt));

const nameTaken = (name: string) =>
  new ApiError('conflict', `a workspace named ${JSON.stringify(name)} already exists in this team`);

/**
 * A new workspace row. With `maxPerTeam`, the team's row is locked while its live workspaces are
 * counted, so two creates at once (on any replica) cannot both take the last place.
 */
export async function createWorkspace(
  db: Db,
  teamId: string,
  input: { name: string; settings?: SettingsPatch },
  maxPerTeam = Number.POSITIVE_INFINITY,
) {
  const settings = applySettingsPatch(DEFAULT_SETTINGS, input.settings ?? {});
  return withTeamLocked(db, teamId, async (tx) => {
    const [held] = await tx.select({ n: sql<number>`count(*)::int` }).from(workspaces).where(live(teamId));
    if (Number(held!.n) >= maxPerTeam)
      throw new ApiError(
        'conflict',
        `this team has ${held!.n} workspaces, the most this server allows a team (KILN_WORKSPACES_MAX_PER_TEAM=${maxPerTeam}): ` +
          'delete one (DELETE /v1/workspaces/{workspace}) to make another',
      );
    const [row] = await tx
      .insert(workspaces)
      .values({ id: newId('ws'), teamId, name: input.name, settings })
      .onConflictDoNothing()
      .returning();
    if (!row) throw nameTaken(input.name);
    return row as WorkspaceRow;
  });
}

/**
 * Records a workspace's new size before a write that makes it so, refusing the write when the
 * team's live workspaces would then hold more than `maxTeamBytes` together. The team's row is
 * locked meanwhile, so writes to two of its workspaces at once are checked one after the other.
 */
export async function reserveWorkspaceBytes(
  db: Db,
  ws: { id: string; teamId: string },
  bytes: number,
  maxTeamBytes: number,
): Promise<void> {
  await withTeamLocked(db, ws.teamId, async (tx) => {
    const [others] = await tx
      .select({ n: sql<string>`coalesce(sum(${workspaces.sizeBytes}), 0)` })
      .from(workspaces)
      .where(and(live(ws.teamId), ne(workspaces.id, ws.id)));
    const total = Number(others!.n) + bytes;
    if (total > maxTeamBytes)
      throw new TeamBytesExceeded(
        `the team's workspaces would hold ${total} bytes together; a team may hold ${maxTeamBytes} ` +
          '(KILN_TEAM_WORKSPACE_BYTES_MAX): delete files or workspaces first',
      );
    await tx.update(workspaces).set({ sizeBytes: bytes }).where(eq(workspaces.id, ws.id));
  });
}

/** A write refused because its team's workspaces would hold too many bytes together. */
export class TeamBytesExceeded extends QuotaError {}

/** A live workspace of this team; anyone else's (or a deleted one) is 404. */
export async function getWorkspace(db: Db, teamId: string, id: string) {
  const [row] = await db
    .select()
    .from(workspaces)
    .where(and(eq(workspaces.id, id), live(teamId)));
  if (!row) throw ApiError.notFound('workspace');
  return row as WorkspaceRow;
}

export async function listWorkspaces(db: Db, teamId: string, p: ListParams) {
  const c = cursorOn(workspaces.id, p);
  const rows = await db
    .select()
    .from(workspaces)
    .where(and(live(teamId), c.where))
    .orderBy(c.orderBy)
    .limit(c.limit);
  return rows as WorkspaceRow[];
}

export async function updateWorkspace(
  db: Db,
  teamId: string,
  id: string,
  input: { name?: string; settings?: SettingsPatch },
) {
  const before = await getWorkspace(db, teamId, id);
  const settings = input.settings ? applySettingsPatch(before.settings, input.settings) : before.settings;
  const [after] = await db
    .update(workspaces)
    .set({ name: input.name ?? before.name, settings, updatedAt: new Date() })
    .where(and(eq(workspaces.id, id), live(teamId)))
    .returning()
    .catch((err: unknown) => {
      if (isUniqueViolation(err)) throw nameTaken(input.name!);
      throw err;
    });
  if (!after) throw ApiError.notFound('workspace');
  return { before, after: after as WorkspaceRow };
}

/** Soft delete: the row stays for the audit trail, every read treats it as gone. */
export async function deleteWorkspace(db: Db, teamId: string, id: string) {
  const before = await getWorkspace(db, teamId, id);
  await db
    .update(workspaces)
    .set({ deletedAt: new Date() })
    .where(and(eq(workspaces.id, id), live(teamId)));
  return before;
}
