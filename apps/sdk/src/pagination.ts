/** One page of a list operation (the API's list envelope, apps/api/src/http/pagination.ts). */
export interface Page<T> {
  data: T[];
  has_more: boolean;
  /** The cursor of the next page (`after`), null on an empty page. */
  last_id: string | null;
}

/**
 * Every item of a list operation, page after page: asks for the first page with `query`, then
 * for the next with `after: last_id` while `has_more`. Stops early when the caller breaks out.
 *
 *   for await (const run of kiln.paginate(kiln.runs.list, { status: 'failed', limit: 100 })) …
 */
export async function* paginate<Q extends { after?: string }, T>(
  list: (query?: Q) => Promise<Page<T>>,
  query?: NoInfer<Q>,
): AsyncGenerator<T, void, undefined> {
  let q = { ...query } as Q;
  for (;;) {
    const page = await list(q);
    yield* page.data;
    if (!page.has_more || !page.last_id || page.last_id === q.after) return;
    q = { ...q, after: page.last_id };
  }
}
