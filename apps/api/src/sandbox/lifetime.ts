import { ApiError } from '../lib/errors.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';

/** The server-wide idle times: the default of every workspace and the most one may set. */
export interface IdleBounds {
  idleMs: number;
  maxIdleMs: number;
}

/** A workspace's sandbox idle time: its `sandbox.idle_s` capped by the server's maximum, else the server default. */
export function idleMsFor(ws: Pick<WorkspaceSettings['sandbox'], 'idle_s'>, bounds: IdleBounds): number {
  // Workspaces stored before the setting existed lack it: the server default.
  const idleS = ws.idle_s ?? null;
  return idleS === null ? bounds.idleMs : Math.min(idleS * 1000, bounds.maxIdleMs);
}

/** Refuses (400, like any other invalid setting) an idle time over the server's maximum. */
export function checkIdleS(idleS: number | null | undefined, bounds: IdleBounds): void {
  if (idleS === undefined || idleS === null || idleS * 1000 <= bounds.maxIdleMs) return;
  const path = 'body.settings.sandbox.idle_s';
  const message = `must be at most ${bounds.maxIdleMs / 1000} (this server's KILN_SANDBOX_MAX_IDLE_S)`;
  throw new ApiError('invalid_request', `${path}: ${message}`, { details: [{ path, message }] });
}

/** When a sandbox goes: at its idle deadline, or at its container's hard lifetime if that comes first. */
export function reclaimAt(idleUntil: number, hardExpiry: number | undefined): Date {
  return new Date(hardExpiry === undefined ? idleUntil : Math.min(idleUntil, hardExpiry));
}
