/**
 * @kiln/sdk: a typed client for the Kiln HTTP API, generated from its OpenAPI document
 * (`npm run sdk:generate` writes ./openapi.ts) and built on openapi-fetch. See docs/sdk.md.
 */
export {
  type ApprovalDecision,
  type Approval,
  type AuditEvent,
  type Commit,
  type CommitOutcome,
  createKiln,
  type Directory,
  type Evolution,
  type ExecResult,
  type File,
  type FileEntry,
  type Kiln,
  type KilnOptions,
  type Message,
  type Run,
  type Session,
  type Team,
  type Template,
  type Workspace,
  type WorkspaceSecret,
  type WorkspaceSettings,
} from './client.ts';
export {
  AuthenticationError,
  ConflictError,
  ERROR_STATUS,
  type ErrorCode,
  type ErrorDetail,
  InvalidRequestError,
  KilnConnectionError,
  KilnError,
  NotFoundError,
  PermissionDeniedError,
  RateLimitError,
  ServerError,
} from './errors.ts';
export type { components, operations, paths } from './openapi.ts';
export { type Page, paginate } from './pagination.ts';
export type { SseMessage } from './sse.ts';
export { type RunEvent, type RunEventData, type StreamOptions, TERMINAL_EVENTS } from './stream.ts';
