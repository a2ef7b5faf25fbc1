/**
 * The events webhooks announce, and the one statement that says "a delivery is owed" — written
 * by the part that owns the event in the same statement (or transaction) as the event itself,
 * so a crash between "the run ended" and "its webhooks are owed" cannot happen.
 *
 * The statement adds one `webhook.event` job to the job runner's queue, only when some enabled
 * webhook is subscribed (a team without webhooks pays nothing but the `exists`). The job fans the
 * event out into one delivery per subscribed webhook (webhooks/service.ts).
 *
 * May touch: the `jobs` table (one insert) and read `webhooks`. Imports nothing above `db/`.
 */
import { sql, type SQL } from 'drizzle-orm';
import { newId } from '../lib/ids.ts';

export const WEBHOOK_EVENTS = [
  'run.completed',
  'run.failed',
  'run.requires_action',
  'evolution.committed',
  'sandbox.oom',
  'update.applied',
] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENTS)[number];

/** The ping `POST /v1/webhooks/{webhook}/test` sends; nobody subscribes to it. */
export const TEST_EVENT = 'webhook.test';

export const FANOUT_JOB = 'webhook.event';
export const DELIVER_JOB = 'webhook.deliver';

/** What a `webhook.event` job carries: the event as every receiver gets it, but `team_id` (the receiving team's). */
export interface WebhookEvent {
  id: string;
  type: WebhookEventType;
  created_at: string;
  /** The team the event belongs to; null for a platform event (update.applied), which every team's webhooks may receive. */
  team_id: string | null;
  data: Record<string, unknown>;
}

/**
 * The write that makes an event owed to the webhooks subscribed to it: with `teamId`, that
 * team's; with null (a platform event), every team's. With `from` (the name of a CTE of the same
 * statement), only if that CTE returned a row — e.g. only if the update that ends a run took effect.
 */
export function webhookEventWrite(
  type: WebhookEventType,
  teamId: string | null,
  data: Record<string, unknown>,
  from?: SQL,
): SQL {
  const event: WebhookEvent = { id: newId('evt'), type, created_at: new Date().toISOString(), team_id: teamId, data };
  const team = teamId === null ? sql`` : sql`w.team_id = ${teamId} and `;
  const subscribed = sql`exists (select 1 from webhooks w where ${team}w.enabled and ${type}::text = any(w.events))`;
  return sql`insert into jobs (id, kind, payload, dedupe_key, run_at, max_attempts)
    select ${newId('job')}, ${FANOUT_JOB}, ${JSON.stringify({ event })}::jsonb, ${`${FANOUT_JOB}:${event.id}`},
      ${event.created_at}::timestamptz, 5
    ${from ? sql`from ${from} ` : sql``}where ${subscribed}`;
}

/** Relative links into the API for an event's data (receivers add their Kiln's base URL). */
export const runLinks = (runId: string) => ({ run: `/v1/runs/${runId}`, events: `/v1/runs/${runId}/events` });
