import { sql } from 'drizzle-orm';
import type { Db } from './client.ts';

/** Resolves once the database answers a statement; rejects with the driver's error otherwise. */
export async function pingDatabase(db: Db): Promise<void> {
  await db.execute(sql`select 1`);
}
