import { and, inArray, ne } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { sandboxes } from '../db/schema/index.ts';

/** Row states of a sandbox that counts against its team's cap and is listed (a paused one counts against neither cap but disk). */
export const ACTIVE = ['starting', 'ready', 'resuming'] as const;

/** Marks sandbox rows removed, with why; a row already removed keeps its first reason. */
export async function markRemoved(db: Db, ids: string[], reason: string): Promise<void> {
  if (ids.length === 0) return;
  await db
    .update(sandboxes)
    // What reaching its runner took (its key) goes with it.
    .set({ state: 'removed', removedAt: new Date(), removedReason: reason, runner: null })
    .where(and(inArray(sandboxes.id, ids), ne(sandboxes.state, 'removed')));
}
