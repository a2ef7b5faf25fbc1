import { and, eq, gte, lt, sql, type SQL } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { auditEvents } from '../db/schema/index.ts';
import type { Principal } from '../auth/principal.ts';
import type { AuditDraft } from './draft.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';

/** The audit row for a draft: the actor's team unless the draft names one. */
export function auditRow(
  draft: AuditDraft,
  actor: Principal | undefined,
  requestId?: string,
): typeof auditEvents.$inferInsert {
  return {
    id: newId('aud'),
    teamId: draft.teamId === undefined ? (actor?.teamId ?? null) : draft.teamId,
    actorKeyId: actor?.keyId ?? null,
    actorRole: actor?.role ?? 'system',
    action: draft.action,
    resourceType: draft.resourceType ?? null,
    resourceId: draft.resourceId ?? null,
    before: draft.before ?? null,
    after: draft.after ?? null,
    requestId: requestId ?? null,
  };
}

/** The insert for an audit row, to go into a caller's combined write (one commit with the change it describes). */
export function insertAudit(a: typeof auditEvents.$inferInsert): SQL {
  const json = (v: unknown) => (v === null || v === undefined ? null : JSON.stringify(v));
  return sql`insert into audit_events (id, team_id, actor_key_id, actor_role, action, resource_type, resource_id, before, after, request_id)
    values (${a.id}, ${a.teamId ?? null}, ${a.actorKeyId ?? null}, ${a.actorRole}, ${a.action}, ${a.resourceType ?? null}, ${a.resourceId ?? null},
      ${json(a.before)}::jsonb, ${json(a.after)}::jsonb, ${a.requestId ?? null})`;
}

export async function recordAudit(db: Db, draft: AuditDraft, actor: Principal | undefined, requestId?: string) {
  await db.insert(auditEvents).values(auditRow(draft, actor, requestId));
}

/** Audit events visible to a team (or every event, for org admins: `teamId` null). */
export async function listAudit(
  db: Db,
  teamId: string | null,
  filter: {
    action?: string;
    actor?: string;
    resource_type?: string;
    resource?: string;
    since?: string;
    until?: string;
  },
  p: ListParams,
) {
  const c = cursorOn(auditEvents.id, p);
  const conds: (SQL | undefined)[] = [
    teamId ? eq(auditEvents.teamId, teamId) : undefined,
    filter.action ? eq(auditEvents.action, filter.action) : undefined,
    filter.actor ? eq(auditEvents.actorKeyId, filter.actor) : undefined,
    filter.resource_type ? eq(auditEvents.resourceType, filter.resource_type) : undefined,
    filter.resource ? eq(auditEvents.resourceId, filter.resource) : undefined,
    filter.since ? gte(auditEvents.createdAt, new Date(filter.since)) : undefined,
    filter.until ? lt(auditEvents.createdAt, new Date(filter.until)) : undefined,
    c.where,
  ];
  return db
    .select()
    .from(auditEvents)
    .where(and(...conds))
    .orderBy(c.orderBy)
    .limit(c.limit);
}
