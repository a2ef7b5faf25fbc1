import { and, eq, isNull, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { apiKeys, teams } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';
import { generateKey, insertKey, type TeamRole } from './keys.ts';

/**
 * Runs `fn` in a transaction that holds the team's row lock: what it counts of the team (its
 * workspaces, their bytes, its templates) and writes is checked against the team's caps one
 * request after another, on every replica, so two requests at once cannot both take the last place.
 */
export function withTeamLocked<T>(db: Db, teamId: string, fn: (tx: Db) => Promise<T>): Promise<T> {
  return db.transaction(async (t) => {
    const tx = t as unknown as Db;
    await tx.execute(sql`select id from ${teams} where id = ${teamId} for update`);
    return fn(tx);
  });
}

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
