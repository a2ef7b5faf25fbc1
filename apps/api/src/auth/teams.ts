import { and, eq, isNull } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { apiKeys, teams } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';
import { generateKey, insertKey, type TeamRole } from './keys.ts';

export async function createTeam(db: Db, name: string) {
  const [row] = await db
    .insert(teams)
    .values({ id: newId('team'), name })
    .onConflictDoNothing()
    .returning();
  if (!row) throw new ApiError('conflict', `a team named ${JSON.stringify(name)} already exists`);
  return row;
}

export async function listTeams(db: Db, p: ListParams, only?: string) {
  const c = cursorOn(teams.id, p);
  return db
    .select()
    .from(teams)
    .where(and(only ? eq(teams.id, only) : undefined, c.where))
    .orderBy(c.orderBy)
    .limit(c.limit);
}

export async function getTeam(db: Db, id: string) {
  const [row] = await db.select().from(teams).where(eq(teams.id, id));
  if (!row) throw ApiError.notFound('team');
  return row;
}

/** Creates a team key; the secret is returned here and never again. */
export async function createTeamKey(
  db: Db,
  teamId: string,
  input: { name: string; role: TeamRole; canApprove: boolean },
) {
  const key = generateKey('team');
  const row = await insertKey(db, { teamId, ...input, key });
  return { row, key };
}

export async function listTeamKeys(db: Db, teamId: string, p: ListParams) {
  const c = cursorOn(apiKeys.id, p);
  return db
    .select()
    .from(apiKeys)
    .where(and(eq(apiKeys.teamId, teamId), c.where))
    .orderBy(c.orderBy)
    .limit(c.limit);
}

export async function revokeTeamKey(db: Db, teamId: string, keyId: string) {
  const where = and(eq(apiKeys.id, keyId), eq(apiKeys.teamId, teamId));
  const [before] = await db.select().from(apiKeys).where(where);
  if (!before) throw ApiError.notFound('key');
  if (before.revokedAt) return { before, after: before };
  const [after] = await db
    .update(apiKeys)
    .set({ revokedAt: new Date() })
    .where(and(where, isNull(apiKeys.revokedAt)))
    .returning();
  return { before, after: after ?? before };
}
