import { createHash, randomBytes } from 'node:crypto';
import { and, eq, isNull, lt, or } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { apiKeys } from '../db/schema/index.ts';
import type { Principal } from './principal.ts';
import { newId } from '../lib/ids.ts';

export type TeamRole = 'owner' | 'admin' | 'member' | 'viewer';

export const hashKey = (key: string) => createHash('sha256').update(key).digest('hex');

/** A new secret: `kiln_admin_…` for org admins, `kiln_…` for team keys; 192 bits of randomness. */
export function generateKey(kind: 'admin' | 'team'): string {
  return `${kind === 'admin' ? 'kiln_admin_' : 'kiln_'}${randomBytes(24).toString('base64url')}`;
}

/** Enough of the key to recognise it in a list, never enough to use it. */
const prefixOf = (key: string) => `${key.slice(0, key.startsWith('kiln_admin_') ? 15 : 9)}…`;

export async function insertKey(
  db: Db,
  input: { teamId: string | null; name: string; role: Principal['role']; canApprove: boolean; key: string },
) {
  const [row] = await db
    .insert(apiKeys)
    .values({
      id: newId('key'),
      teamId: input.teamId,
      name: input.name,
      role: input.role,
      canApprove: input.canApprove,
      keyHash: hashKey(input.key),
      keyPrefix: prefixOf(input.key),
    })
    .returning();
  return row!;
}

const LAST_USED_RESOLUTION_MS = 60_000;

/** The principal behind a bearer key, or null when it is unknown or revoked. */
export async function authenticate(db: Db, key: string): Promise<Principal | null> {
  const [row] = await db
    .select()
    .from(apiKeys)
    .where(and(eq(apiKeys.keyHash, hashKey(key)), isNull(apiKeys.revokedAt)))
    .limit(1);
  if (!row) return null;
  const now = new Date();
  if (!row.lastUsedAt || now.getTime() - row.lastUsedAt.getTime() > LAST_USED_RESOLUTION_MS) {
    const stale = new Date(now.getTime() - LAST_USED_RESOLUTION_MS);
    await db
      .update(apiKeys)
      .set({ lastUsedAt: now })
      .where(and(eq(apiKeys.id, row.id), or(isNull(apiKeys.lastUsedAt), lt(apiKeys.lastUsedAt, stale))));
  }
  return {
    keyId: row.id,
    role: row.role,
    teamId: row.teamId,
    canApprove: row.canApprove || row.role === 'owner' || row.role === 'admin',
  };
}
