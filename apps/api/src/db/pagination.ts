import { asc, desc, gt, lt, type AnyColumn, type SQL } from 'drizzle-orm';

/** A page of an id-ordered list: at most `limit` rows after the id `after`, in `order`. */
export interface ListParams {
  limit: number;
  after?: string;
  order: 'asc' | 'desc';
}

/** The cursor condition and ordering for id-ordered lists (ids sort by creation time). */
export function cursorOn(id: AnyColumn, p: ListParams): { where: SQL | undefined; orderBy: SQL; limit: number } {
  const where = p.after === undefined ? undefined : p.order === 'desc' ? lt(id, p.after) : gt(id, p.after);
  return { where, orderBy: p.order === 'desc' ? desc(id) : asc(id), limit: p.limit + 1 };
}
