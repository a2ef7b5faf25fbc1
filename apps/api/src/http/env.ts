import type { Logger } from 'pino';
import type { AuditDraft } from '../audit/draft.ts';
import type { Principal } from '../auth/principal.ts';

export type { Principal };

/** Typed per-request context shared by every middleware and handler. */
export interface AppEnv {
  Variables: {
    requestId: string;
    log: Logger;
    principal: Principal;
    audit: AuditDraft | undefined;
  };
}
