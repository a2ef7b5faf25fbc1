import { and, eq, isNull } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { sessions, workspaces } from '../db/schema/index.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';

export type SessionRow = typeof sessions.$inferSelect;

export async function createSession(db: Db, teamId: string, workspaceId: string, title?: string): Promise<SessionRow> {
  const [row] = await db
    .insert(sessions)
    .values({ id: newId('ses'), teamId, workspaceId, title: title ?? null })
    .returning();
  return row!;
}

/** A session of this team; anyone else's is 404. */
export async function getSession(db: Db, teamId: string, id: string): Promise<SessionRow> {
  const [row] = await db
    .select()
    .from(sessions)
    .where(and(eq(sessions.id, id), eq(sessions.teamId, teamId)));
  if (!row) throw ApiError.notFound('session');
  return row;
}

/** An active session of this team together with its (live) workspace, in one query. */
export async function getActiveSessionWithWorkspace(
  db: Db,
  teamId: string,
  id: string,
): Promise<{ session: SessionRow; workspace: WorkspaceRow }> {
  const [row] = await db
    .select({ session: sessions, workspace: workspaces })
    .from(sessions)
    .innerJoin(workspaces, and(eq(workspaces.id, sessions.workspaceId), isNull(workspaces.deletedAt)))
    .where(and(eq(sessions.id, id), eq(sessions.teamId, teamId)));
  if (!row) throw ApiError.notFound('session');
  if (row.session.status !== 'active') throw new ApiError('conflict', 'this session has ended');
  return row as { session: SessionRow; workspace: WorkspaceRow };
}

export async function listSessions(db: Db, teamId: string, workspaceId: string, p: ListParams) {
  const c = cursorOn(sessions.id, p);
  return db
    .select()
    .from(sessions)
    .where(and(eq(sessions.teamId, teamId), eq(sessions.workspaceId, workspaceId), c.where))
    .orderBy(c.orderBy)
    .limit(c.limit);
}

export async function endSession(db: Db, teamId: string, id: string) {
  const before = await getSession(db, teamId, id);
  if (before.status === 'ended') return { before, after: before };
  const [after] = await db
    .update(sessions)
    .set({ status: 'ended', endedAt: new Date() })
    .where(and(eq(sessions.id, id), eq(sessions.teamId, teamId)))
    .returning();
  return { before, after: after! };
}
