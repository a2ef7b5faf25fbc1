/** An audit event as a handler describes it; the audit trail middleware records it. */
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
