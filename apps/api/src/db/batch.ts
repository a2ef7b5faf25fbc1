import { sql, type SQL } from 'drizzle-orm';

/**
 * Several writes as one statement (data-modifying CTEs): one round trip and one commit, all or
 * nothing. `last` is the statement at the top (default: the last write).
 */
export function combine(writes: SQL[], last?: SQL): SQL {
  const all = last ? [...writes, last] : writes;
  if (all.length === 0) return sql`select 1`;
  if (all.length === 1) return all[0]!;
  const head = all.slice(0, -1).map((w, i) => sql`${sql.raw(`w${i}`)} as (${w})`);
  return sql`with ${sql.join(head, sql`, `)} ${all.at(-1)!}`;
}
