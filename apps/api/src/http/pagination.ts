import { z } from '@hono/zod-openapi';
import { asc, desc, gt, lt, type AnyColumn, type SQL } from 'drizzle-orm';

export const ListQuery = z.object({
  limit: z.coerce.number().int().min(1).max(100).default(20).openapi({ description: '1–100, default 20' }),
  after: z.string().min(1).max(64).optional().openapi({ description: 'last_id of the previous page' }),
  order: z.enum(['asc', 'desc']).default('desc'),
});
export type ListParams = z.infer<typeof ListQuery>;

export const listOf = <T extends z.ZodType>(item: T) =>
  z.object({ data: z.array(item), has_more: z.boolean(), last_id: z.string().nullable() });

/** The cursor condition and ordering for id-ordered lists (ids sort by creation time). */
export function cursorOn(id: AnyColumn, p: ListParams): { where: SQL | undefined; orderBy: SQL; limit: number } {
  const where = p.after === undefined ? undefined : p.order === 'desc' ? lt(id, p.after) : gt(id, p.after);
  return { where, orderBy: p.order === 'desc' ? desc(id) : asc(id), limit: p.limit + 1 };
}

/** Turns `limit + 1` fetched rows into the API's list envelope (`data`, `has_more`, `last_id`). */
export function toPage<R extends { id: string }, O>(rows: R[], p: { limit: number }, map: (r: R) => O) {
  const has_more = rows.length > p.limit;
  const kept = has_more ? rows.slice(0, p.limit) : rows;
  return { data: kept.map(map), has_more, last_id: kept.at(-1)?.id ?? null };
}
