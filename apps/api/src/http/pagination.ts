import { z } from '@hono/zod-openapi';

export const ListQuery = z.object({
  limit: z.coerce.number().int().min(1).max(100).default(20).openapi({ description: '1–100, default 20' }),
  after: z.string().min(1).max(64).optional().openapi({ description: 'last_id of the previous page' }),
  order: z.enum(['asc', 'desc']).default('desc'),
});

export const listOf = <T extends z.ZodType>(item: T) =>
  z.object({ data: z.array(item), has_more: z.boolean(), last_id: z.string().nullable() });

/** Turns `limit + 1` fetched rows into the API's list envelope (`data`, `has_more`, `last_id`). */
export function toPage<R extends { id: string }, O>(rows: R[], p: { limit: number }, map: (r: R) => O) {
  const has_more = rows.length > p.limit;
  const kept = has_more ? rows.slice(0, p.limit) : rows;
  return { data: kept.map(map), has_more, last_id: kept.at(-1)?.id ?? null };
}
