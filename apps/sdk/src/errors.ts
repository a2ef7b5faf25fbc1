/**
 * The API's errors as exceptions. Every error answer is the envelope
 * `{ error: { type, code, message, request_id, details? } }` (docs/api.md); `KilnError` carries
 * it, and a subclass per kind of failure lets callers `catch` what they handle. A request that
 * never got an answer (refused connection, reset, DNS) is a `KilnConnectionError`, not a
 * `KilnError`; an aborted one rethrows the caller's `AbortError` unchanged.
 */

/** Every code the API answers with, and its HTTP status (the API's lib/errors.ts; the SDK test checks they agree). */
export const ERROR_STATUS = {
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  session_busy: 409,
  approval_pending: 409,
  approval_expired: 409,
  workspace_busy: 409,
  payload_too_large: 413,
  unsupported_media_type: 415,
  rate_limited: 429,
  sandbox_unavailable: 429,
  internal: 500,
  model_unavailable: 503,
  unavailable: 503,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

/** One bad field of an `invalid_request`: where (`body.name`, `query.limit`) and what is wrong. */
export interface ErrorDetail {
  path: string;
  message: string;
}

interface Envelope {
  type?: string;
  code?: string;
  message?: string;
  request_id?: string;
  details?: ErrorDetail[];
  [extra: string]: unknown;
}

/** An error answer of the API (any status >= 400), with the envelope's fields. */
export class KilnError extends Error {
  override name = 'KilnError';
  /** The envelope's code; a code newer than this SDK still arrives, as a plain string. */
  readonly code: ErrorCode | (string & {});
  readonly type: string;
  readonly requestId: string | null;
  /** For `invalid_request`: every bad field. */
  readonly details: ErrorDetail[];
  /** The whole `error` object (some codes add fields: `approval_id`, `limit`, …). */
  readonly body: Envelope;

  constructor(
    readonly status: number,
    body: Envelope,
    readonly headers: Headers = new Headers(),
  ) {
    super(body.message ?? `HTTP ${status}`);
    this.body = body;
    this.code = body.code ?? `http_${status}`;
    this.type = body.type ?? 'api_error';
    this.requestId = body.request_id ?? headers.get('x-request-id');
    this.details = Array.isArray(body.details) ? body.details : [];
  }

  /** Narrows to one code: `if (KilnError.is(err, 'not_found')) …`. */
  static is<C extends ErrorCode>(err: unknown, code?: C): err is KilnError & { code: C } {
    return err instanceof KilnError && (code === undefined || err.code === code);
  }
}

/** 400, 413, 415: the request itself is wrong (see `details`). */
export class InvalidRequestError extends KilnError {
  override name = 'InvalidRequestError';
}
/** 401: no key, or a key the server does not know. */
export class AuthenticationError extends KilnError {
  override name = 'AuthenticationError';
}
/** 403: the key's role may not do this. */
export class PermissionDeniedError extends KilnError {
  override name = 'PermissionDeniedError';
}
/** 404: no such resource, or another team's. */
export class NotFoundError extends KilnError {
  override name = 'NotFoundError';
}
/** 409: conflicts with the current state (a busy session, a decided approval, …). */
export class ConflictError extends KilnError {
  override name = 'ConflictError';
}
/** 429: rate limited or no sandbox free; `retryAfter` is the server's Retry-After in seconds. */
export class RateLimitError extends KilnError {
  override name = 'RateLimitError';
  get retryAfter(): number | null {
    const v = Number(this.headers.get('retry-after'));
    return Number.isFinite(v) && v >= 0 && this.headers.has('retry-after') ? v : null;
  }
}
/** 5xx: the server failed or a part it needs (model, sandboxes) is unavailable. */
export class ServerError extends KilnError {
  override name = 'ServerError';
}

/** The request got no answer: the server is down or unreachable, or the connection broke. */
export class KilnConnectionError extends Error {
  override name = 'KilnConnectionError';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

function classFor(status: number): typeof KilnError {
  if (status === 401) return AuthenticationError;
  if (status === 403) return PermissionDeniedError;
  if (status === 404) return NotFoundError;
  if (status === 409) return ConflictError;
  if (status === 429) return RateLimitError;
  if (status >= 500) return ServerError;
  if (status >= 400) return InvalidRequestError;
  return KilnError;
}

/** The typed error of an error answer, from its parsed body (the envelope, or whatever a proxy sent). */
export function errorFrom(response: Response, body: unknown): KilnError {
  const env =
    body && typeof body === 'object' && 'error' in body && body.error && typeof body.error === 'object'
      ? (body.error as Envelope)
      : { message: typeof body === 'string' && body ? body.slice(0, 500) : `HTTP ${response.status}` };
  return new (classFor(response.status))(response.status, env, response.headers);
}

export const isAbort = (err: unknown): boolean =>
  err instanceof Error && (err.name === 'AbortError' || err.name === 'TimeoutError');
