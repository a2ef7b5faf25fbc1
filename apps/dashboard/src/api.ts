const KEY = 'kiln.key';

export const getKey = () => sessionStorage.getItem(KEY);
export const setKey = (key: string) => sessionStorage.setItem(KEY, key);
export const clearKey = () => sessionStorage.removeItem(KEY);
/** Org-admin keys manage teams and updates; team routes answer them 403. */
export const isOrgAdminKey = (key: string | null) => !!key && key.startsWith('kiln_admin_');

/** An answer outside 2xx: its message is the API's `error.message`. */
class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    /** The envelope's `details` (one per bad field of a 400), when it has them. */
    readonly details: ErrorDetail[] = [],
  ) {
    super(message);
  }
}

/** One bad field of a refused request, as the envelope's `details` list names it. */
export interface ErrorDetail {
  path: string;
  message: string;
}

/** The API error envelope's message, or what can be said without one. */
async function failureOf(res: Response): Promise<ApiFailure> {
  const body = (await res.json().catch(() => null)) as {
    error?: { code?: string; message?: string; details?: unknown };
  } | null;
  const details = Array.isArray(body?.error?.details)
    ? (body.error.details as unknown[]).flatMap((d) => {
        const { path, message } = (d ?? {}) as Record<string, unknown>;
        return typeof message === 'string' ? [{ path: typeof path === 'string' ? path : '', message }] : [];
      })
    : [];
  return new ApiFailure(
    res.status,
    body?.error?.code ?? 'http_error',
    body?.error?.message ?? `HTTP ${res.status} ${res.statusText}`,
    details,
  );
}

export function authHeaders(key = getKey()): Record<string, string> {
  return key ? { authorization: `Bearer ${key}` } : {};
}

/** One call to the HTTP API with the signed-in key (or `key`). */
export function api<T = unknown>(method: string, path: string, body?: unknown, key?: string): Promise<T> {
  return send<T>(method, path, body === undefined ? undefined : JSON.stringify(body), 'application/json', key);
}

/** A call whose body is bytes, not JSON (a file's content). */
export function apiRaw<T = unknown>(method: string, path: string, body: string): Promise<T> {
  return send<T>(method, path, body, 'application/octet-stream');
}

async function send<T>(method: string, path: string, body: string | undefined, type: string, key?: string) {
  const headers: Record<string, string> = { ...authHeaders(key ?? getKey()), accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = type;
  let res: Response;
  try {
    res = await fetch(path, { method, headers, body });
  } catch (err) {
    throw new ApiFailure(0, 'network', `the API could not be reached: ${(err as Error).message}`);
  }
  if (!res.ok) throw await failureOf(res);
  return (await res.json()) as T;
}

export const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err));
/** The HTTP status of a failed call (0 when the API could not be reached), undefined for other errors. */
export const statusOf = (err: unknown) => (err instanceof ApiFailure ? err.status : undefined);
/** The bad fields the API named for a refused request (empty when it named none). */
export const detailsOf = (err: unknown): ErrorDetail[] => (err instanceof ApiFailure ? err.details : []);
