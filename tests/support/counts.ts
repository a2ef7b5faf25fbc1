import { sql } from 'drizzle-orm';
import type { Db } from '../../apps/api/src/db/client.ts';
import { rowsOf } from './db.ts';

/** Row count of every table, to prove a request wrote nothing. */
export async function tableCounts(db: Db): Promise<Record<string, number>> {
  const tables = rowsOf<{ table_name: string }>(
    await db.execute(sql`select table_name from information_schema.tables where table_schema = 'public' order by 1`),
  );
  const out: Record<string, number> = {};
  for (const { table_name } of tables) {
    out[table_name] = rowsOf<{ n: number }>(
      await db.execute(sql`select count(*)::int as n from ${sql.identifier(table_name)}`),
    )[0]!.n;
  }
  return out;
}
