import type { ZodError } from 'zod';

const STATUS = {
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

export type ErrorCode = keyof typeof STATUS;
export type ErrorStatus = (typeof STATUS)[ErrorCode];

const TYPE: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  409: 'conflict_error',
  413: 'invalid_request_error',
  415: 'invalid_request_error',
  429: 'rate_limit_error',
  500: 'api_error',
  503: 'api_error',
};

interface ErrorDetail {
  path: string;
  message: string;
}

/** The one error type handlers throw; `onError` turns it into the API's error envelope. */
export class ApiError extends Error {
  readonly status: ErrorStatus;
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly extra: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
    /** What caused it, for the server's log (its message is appended there), never for the caller. */
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.status = STATUS[code];
  }

  get type(): string {
    return TYPE[this.status] ?? 'api_error';
  }

  static notFound(what: string): ApiError {
    return new ApiError('not_found', `${what} not found`);
  }

  /** One readable message naming every bad field, plus the same list as `details`. */
  static fromZod(error: ZodError, where?: string): ApiError {
    const details: ErrorDetail[] = error.issues.map((i) => ({
      path: [where, ...i.path].filter((p) => p !== undefined && p !== '').join('.'),
      message: i.message,
    }));
    const message = details.map((d) => (d.path ? `${d.path}: ${d.message}` : d.message)).join('; ');
    return new ApiError('invalid_request', message || 'invalid request', { details });
  }
}

export function errorBody(err: ApiError, requestId: string) {
  return { error: { type: err.type, code: err.code, message: err.message, request_id: requestId, ...err.extra } };
}

/** Settings that cannot run: one readable line per problem (start-up stops with them). */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  ${p}`).join('\n')}`);
  }
}
