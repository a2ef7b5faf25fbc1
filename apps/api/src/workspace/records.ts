import { and, eq, isNull } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { isUniqueViolation } from '../db/errors.ts';
import { workspaces } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';
import { applySettingsPatch, DEFAULT_SETTINGS, type SettingsPatch, type WorkspaceSettings } from './settings.ts';

export type WorkspaceRow = typeof workspaces.$inferSelect & { settings: WorkspaceSettings };

const live = (teamId: string) => and(eq(workspaces.teamId, teamId), isNull(workspaces.deletedAt));

const nameTaken = (name: string) =>
  new ApiError('conflict', `a workspace named ${JSON.stringify(name)} already exists in this team`);

export async function createWorkspace(db: Db, teamId: string, input: { name: string; settings?: SettingsPatch }) {
  const settings = applySettingsPatch(DEFAULT_SETTINGS, input.settings ?? {});
  const [row] = await db
    .insert(workspaces)
    .values({ id: newId('ws'), teamId, name: input.name, settings })
    .onConflictDoNothing()
    .returning();
  if (!row) throw nameTaken(input.name);
  return row as WorkspaceRow;
}

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
