import type { Logger } from 'pino';

export interface Principal {
  keyId: string;
  role: 'org_admin' | 'owner' | 'admin' | 'member' | 'viewer';
  /** null for org-admin keys */
  teamId: string | null;
  canApprove: boolean;
}

export interface AuditDraft {
  action: string;
  resourceType?: string;
  resourceId?: string;
  teamId?: string | null;
  before?: unknown;
  after?: unknown;
  /** The handler already wrote this event together with its own change (one commit). */
  recorded?: boolean;
}

/** Typed per-request context shared by every middleware and handler. */
export interface AppEnv {
  Variables: {
    requestId: string;
    log: Logger;
    principal: Principal;
    audit: AuditDraft | undefined;
  };
}
