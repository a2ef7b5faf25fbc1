/**
 * Webhooks: a team's endpoints (CRUD, the signing secret sealed at rest and shown once), their
 * delivery logs, replays and test events. The work itself, the fan-out of an owed event and each
 * delivery, is delivery.ts, as durable jobs on the job runner.
 *
 * May touch: `webhooks`, `webhook_deliveries`, `jobs` (through the runner, and the one statement
 * that writes deliveries with their jobs). Requests go only through OutboundPolicy.
 */
import { and, eq, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { rowsOf } from '../db/rows.ts';
import { webhookDeliveries, webhooks } from '../db/schema/index.ts';
import type { JobRunner } from '../jobs/runner.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import { OutboundPolicy, OutboundRefused } from '../lib/outbound.ts';
import type { Sealer } from '../secrets/sealing.ts';
import { WebhookDeliveries } from './delivery.ts';
import { TEST_EVENT, type WebhookEventType } from './events.ts';
import { newSecret } from './signing.ts';

export type WebhookRow = typeof webhooks.$inferSelect;
export type DeliveryRow = typeof webhookDeliveries.$inferSelect;

export interface WebhookOptions {
  /** Attempts per delivery, the first included (KILN_WEBHOOK_MAX_ATTEMPTS). */
  maxAttempts: number;
  /** The wait after the first failed attempt; each later one is 3 times the one before, ±20 % (KILN_WEBHOOK_RETRY_BASE_S). */
  retryBaseMs: number;
  /** One attempt's whole-request deadline (KILN_WEBHOOK_TIMEOUT_S). */
  timeoutMs: number;
  /** Webhooks a team may have (KILN_WEBHOOK_MAX_PER_TEAM). */
  maxPerTeam: number;
  /** Deliveries (and fan-outs) in flight at once in this server (KILN_WEBHOOK_CONCURRENCY). */
  concurrency: number;
  /** Of those, at most this many one team's, across every replica (KILN_WEBHOOK_TEAM_CONCURRENCY). */
  teamConcurrency: number;
  /** How often owed deliveries are looked for (KILN_WEBHOOK_POLL_MS): the statement that owes one is elsewhere. */
  pollMs: number;
  /** KILN_OUTBOUND_ALLOW: the non-public addresses receivers may be at. */
  outboundAllow: readonly string[];
}

export class WebhookService {
  private readonly policy: OutboundPolicy;
  /** The fan-outs and deliveries: the jobs that do the work (delivery.ts). */
  private readonly deliveries: WebhookDeliveries;

  constructor(
    private readonly db: Db,
    private readonly sealer: Sealer,
    jobs: JobRunner,
    private readonly opts: WebhookOptions,
    log: Logger,
  ) {
    this.policy = new OutboundPolicy(opts.outboundAllow);
    this.deliveries = new WebhookDeliveries(db, sealer, jobs, this.policy, opts, log);
  }

  async close(): Promise<void> {
    await this.policy.close();
  }

  // ---- webhooks ------------------------------------------------------------------------

  /** The URL's form and, for an address literal, the address (a name is checked when it is resolved, at each attempt). */
  private checkUrl(url: string): string {
    try {
      return this.policy.checkUrl(url).toString();
    } catch (err) {
      if (err instanceof OutboundRefused) throw new ApiError('invalid_request', `url: ${err.message}`);
      throw err;
    }
  }

  async create(
    teamId: string,
    input: { url: string; events: WebhookEventType[]; description?: string | null },
  ): Promise<{ row: WebhookRow; secret: string }> {
    const url = this.checkUrl(input.url);
    const [count] = rowsOf<{ n: number }>(
      await this.db.execute(sql`select count(*)::int as n from webhooks where team_id = ${teamId}`),
    );
    if ((count?.n ?? 0) >= this.opts.maxPerTeam)
      throw new ApiError('conflict', `a team may have at most ${this.opts.maxPerTeam} webhooks`);
    const id = newId('whk');
    const secret = newSecret();
    const [row] = await this.db
      .insert(webhooks)
      .values({
        id,
        teamId,
        url,
        events: input.events,
        description: input.description ?? null,
        secretSealed: this.sealer.seal(id, secret),
      })
      .returning();
    return { row: row!, secret };
  }

  async get(teamId: string, id: string): Promise<WebhookRow> {
    const [row] = await this.db
      .select()
      .from(webhooks)
      .where(and(eq(webhooks.id, id), eq(webhooks.teamId, teamId)));
    if (!row) throw ApiError.notFound('webhook');
    return row;
  }

  list(teamId: string, p: ListParams): Promise<WebhookRow[]> {
    const c = cursorOn(webhooks.id, p);
    return this.db
      .select()
      .from(webhooks)
      .where(and(eq(webhooks.teamId, teamId), c.where))
      .orderBy(c.orderBy)
      .limit(c.limit);
  }

  async update(
    teamId: string,
    id: string,
    patch: { url?: string; events?: WebhookEventType[]; description?: string | null; enabled?: boolean },
  ): Promise<{ before: WebhookRow; after: WebhookRow }> {
    const before = await this.get(teamId, id);
    const url = patch.url === undefined ? undefined : this.checkUrl(patch.url);
    const [after] = await this.db
      .update(webhooks)
      .set({
        ...(url !== undefined ? { url } : {}),
        ...(patch.events !== undefined ? { events: patch.events } : {}),
        ...(patch.description !== undefined ? { description: patch.description } : {}),
        ...(patch.enabled !== undefined ? { enabled: patch.enabled } : {}),
        updatedAt: new Date(),
      })
      .where(and(eq(webhooks.id, id), eq(webhooks.teamId, teamId)))
      .returning();
    if (!after) throw ApiError.notFound('webhook');
    return { before, after };
  }

  /** A new signing secret (shown once); the old one stops signing at once. */
  async rotateSecret(teamId: string, id: string): Promise<{ row: WebhookRow; secret: string }> {
    await this.get(teamId, id);
    const secret = newSecret();
    const [row] = await this.db
      .update(webhooks)
      .set({ secretSealed: this.sealer.seal(id, secret), updatedAt: new Date() })
      .where(and(eq(webhooks.id, id), eq(webhooks.teamId, teamId)))
      .returning();
    if (!row) throw ApiError.notFound('webhook');
    return { row, secret };
  }

  /** Deletes the webhook and its delivery log; deliveries still owed are dropped (their jobs find nothing to send). */
  async remove(teamId: string, id: string): Promise<WebhookRow> {
    const [row] = await this.db
      .delete(webhooks)
      .where(and(eq(webhooks.id, id), eq(webhooks.teamId, teamId)))
      .returning();
    if (!row) throw ApiError.notFound('webhook');
    return row;
  }

  // ---- deliveries ----------------------------------------------------------------------

  async listDeliveries(teamId: string, webhookId: string, p: ListParams): Promise<DeliveryRow[]> {
    await this.get(teamId, webhookId);
    const c = cursorOn(webhookDeliveries.id, p);
    return this.db
      .select()
      .from(webhookDeliveries)
      .where(and(eq(webhookDeliveries.webhookId, webhookId), eq(webhookDeliveries.teamId, teamId), c.where))
      .orderBy(c.orderBy)
      .limit(c.limit);
  }

  async getDelivery(teamId: string, webhookId: string, id: string): Promise<DeliveryRow> {
    const [row] = await this.db
      .select()
      .from(webhookDeliveries)
      .where(
        and(
          eq(webhookDeliveries.id, id),
          eq(webhookDeliveries.webhookId, webhookId),
          eq(webhookDeliveries.teamId, teamId),
        ),
      );
    if (!row) throw ApiError.notFound('delivery');
    return row;
  }

  /** A new delivery (new id, so a receiver that de-duplicates by `webhook-id` takes it) of the same body. */
  async replay(teamId: string, webhookId: string, deliveryId: string): Promise<DeliveryRow> {
    const hook = await this.get(teamId, webhookId);
    if (!hook.enabled) throw new ApiError('conflict', 'this webhook is disabled: enable it to replay its deliveries');
    const original = await this.getDelivery(teamId, webhookId, deliveryId);
    const [row] = await this.deliveries.owe([
      {
        webhookId,
        teamId,
        eventId: original.eventId,
        eventType: original.eventType,
        body: original.body,
        replayOf: original.replayOf ?? original.id,
      },
    ]);
    if (!row) throw ApiError.notFound('webhook');
    return this.getDelivery(teamId, webhookId, row);
  }

  /** A `webhook.test` event to this webhook alone, delivered (and retried) like any other. */
  async test(teamId: string, webhookId: string): Promise<DeliveryRow> {
    const hook = await this.get(teamId, webhookId);
    if (!hook.enabled) throw new ApiError('conflict', 'this webhook is disabled');
    const id = newId('evt');
    const event = {
      id,
      type: TEST_EVENT,
      created_at: new Date().toISOString(),
      team_id: teamId,
      data: { webhook_id: webhookId, links: { webhook: `/v1/webhooks/${webhookId}` } },
    };
    const [row] = await this.deliveries.owe([
      { webhookId, teamId, eventId: id, eventType: TEST_EVENT, body: JSON.stringify(event), replayOf: null },
    ]);
    if (!row) throw ApiError.notFound('webhook');
    return this.getDelivery(teamId, webhookId, row);
  }
}
