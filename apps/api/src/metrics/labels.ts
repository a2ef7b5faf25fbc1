import type { Context } from 'hono';
import { matchedRoutes } from 'hono/route';

/** The label value of everything past a bound. */
const OTHER = 'other';

/**
 * Label values from a set nobody bounds (model names come from tenants' settings): the first `cap`
 * distinct values are kept, every later one (and any longer than 100 characters) is "other".
 */
export class BoundedLabel {
  private readonly seen = new Set<string>();

  constructor(
    private readonly cap: number,
    seed: (string | undefined)[] = [],
  ) {
    for (const v of seed) if (v) this.of(v);
  }

  of(value: string): string {
    if (this.seen.has(value)) return value;
    if (value.length > 100 || this.seen.size >= this.cap) return OTHER;
    this.seen.add(value);
    return value;
  }
}

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);

/** The request's method, or "other" for the rest of what Node's parser accepts. */
export const methodLabel = (method: string): string => (METHODS.has(method) ? method : OTHER);

/**
 * The pattern of the route the request matched (Hono's route path: `/v1/workspaces/:workspace`),
 * never the path itself; "unmatched" when only middleware matched (the 404 of an unknown path).
 * Middleware is what `use()` registered on a wildcard; the last route that is not middleware is
 * the one the request was for, even when a middleware answered first (a 401 from the key check).
 */
export function routeLabel(c: Context): string {
  const routes = matchedRoutes(c);
  for (let i = routes.length - 1; i >= 0; i--) {
    const r = routes[i]!;
    if (r.method === 'ALL' && r.path.endsWith('*')) continue;
    return r.path;
  }
  return 'unmatched';
}
