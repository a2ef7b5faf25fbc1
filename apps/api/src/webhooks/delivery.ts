/**
 * The work of webhooks, as durable jobs on the job runner (in a lane of their own): the fan-out of
 * an owed event into one delivery per subscribed webhook, and each delivery, one signed HTTP
 * attempt per run of its job, retried on its own schedule (exponential, with jitter) until a 2xx,
 * a permanent refusal or the last attempt. Every attempt is kept in the delivery's log. Requests
 * go only through the OutboundPolicy.
 */
import { and, eq, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { webhookDeliveries, webhooks } from '../db/schema/index.ts';
import { FailJob, type JobRow, type JobRunner, RetryJob } from '../jobs/runner.ts';
import { newId } from '../lib/ids.ts';
import { type OutboundPolicy, OutboundRefused } from '../lib/outbound.ts';
import type { Sealer } from '../secrets/sealing.ts';
import { DELIVER_JOB, FANOUT_JOB, type WebhookEvent } from './events.ts';
import type { DeliveryRow, WebhookOptions } from './service.ts';
import { signedHeaders } from './signing.ts';

/** How much of a receiver's answer is read: enough for the log, never a tenant-sized download. */
const MAX_RESPONSE_BYTES = 4096;
/** How much of it the log keeps. */
const MAX_ERROR_CHARS = 300;

interface Attempt {
  attempt: number;
  at: string;
  status_code: number | null;
  error: string | null;
  duration_ms: number;
}

type Outcome =
  | { kind: 'succeeded'; status: number }
  | { kind: 'retry' | 'failed'; status: number | null; error: string };

/** The wait before attempt `n + 1` after attempt `n` failed: base · 3^(n−1), times a random 0.8–1.2. */
function retryDelayMs(baseMs: number, attemptsMade: number, random = Math.random): number {
  return Math.round(baseMs * 3 ** (attemptsMade - 1) * (0.8 + 0.4 * random()));
}

/**
 * Which answers are worth another attempt: timeouts, connection errors, 408, 425, 429 and 5xx.
 * Any other status is the receiver's final word (a 3xx is not followed: the URL should be
 * the final one; a 4xx refuses this request as it is), so the delivery fails at once; it can be replayed.
 */
const retryableStatus = (s: number) => s === 408 || s === 425 || s === 429 || s >= 500;

function causeOf(err: unknown): unknown {
  let e = err as { cause?: unknown } | undefined;
  for (let i = 0; i < 5 && e; i++) {
    if (e instanceof OutboundRefused) return e;
    e = e.cause as { cause?: unknown } | undefined;
  }
  return err;
}

const clip = (s: string) => (s.length > MAX_ERROR_CHARS ? `${s.slice(0, MAX_ERROR_CHARS)}…` : s);

export class WebhookDeliveries {
  private readonly send: typeof fetch;

  constructor(
    private readonly db: Db,
    private readonly sealer: Sealer,
    private readonly jobs: JobRunner,
    policy: OutboundPolicy,
    private readonly opts: WebhookOptions,
    private readonly log: Logger,
  ) {
    this.send = policy.fetch(opts.timeoutMs);
    // A lane of their own: deliveries never wait behind a template build or a review, and one
    // team's slow or silent receivers hold at most teamConcurrency of its workers (the job's
    // group is its team), so another team's deliveries still go out.
    const lane = {
      name: 'webhooks',
      concurrency: opts.concurrency,
      groupLimit: opts.teamConcurrency,
      pollMs: opts.pollMs,
    };
    jobs.handle(FANOUT_JOB, (p: { event: WebhookEvent }) => this.fanOut(p.event), lane);
    jobs.handle(DELIVER_JOB, (p: { delivery: string }, job) => this.deliver(p.delivery, job), lane);
  }

  /**
   * Deliveries and their jobs in one statement (all or nothing), for webhooks that still exist;
   * a first delivery of an event a webhook already has is skipped. Returns the ids written.
   */
  async owe(
    items: {
      webhookId: string;
      teamId: string;
      eventId: string;
      eventType: string;
      body: string;
      replayOf: string | null;
    }[],
  ): Promise<string[]> {
    if (!items.length) return [];
    const max = this.opts.maxAttempts;
    const now = new Date(this.jobs.now()).toISOString();
    const values = items.map(
      (d) =>
        sql`(${newId('whd')}::text, ${d.webhookId}::text, ${d.teamId}::text, ${d.eventId}::text, ${d.eventType}::text, ${d.body}::text, ${d.replayOf}::text)`,
    );
    const result = await this.db.execute(sql`
      with d as (
        insert into webhook_deliveries (id, webhook_id, team_id, event_id, event_type, body, replay_of, max_attempts, next_attempt_at)
        select v.id, v.webhook_id, v.team_id, v.event_id, v.event_type, v.body, v.replay_of, ${max}::int, ${now}::timestamptz
        from (values ${sql.join(values, sql`, `)}) v(id, webhook_id, team_id, event_id, event_type, body, replay_of)
        join webhooks w on w.id = v.webhook_id and w.team_id = v.team_id
        on conflict do nothing
        returning id, team_id),
      j as (
        insert into jobs (id, kind, payload, dedupe_key, run_at, max_attempts)
        select 'job_' || substr(d.id, 5), ${DELIVER_JOB}, jsonb_build_object('delivery', d.id, 'group', d.team_id), ${`${DELIVER_JOB}:`} || d.id,
          ${now}::timestamptz, ${max}::int
        from d
        returning 1)
      select id from d`);
    this.jobs.wake();
    return rowsOf<{ id: string }>(result).map((r) => r.id);
  }

  /** A `webhook.event` job: one delivery per enabled webhook subscribed to the event (of its team, or any team for a platform event). */
  private async fanOut(event: WebhookEvent): Promise<void> {
    const hooks = await this.db
      .select({ id: webhooks.id, teamId: webhooks.teamId })
      .from(webhooks)
      .where(
        and(
          event.team_id === null ? undefined : eq(webhooks.teamId, event.team_id),
          eq(webhooks.enabled, true),
          sql`${event.type}::text = any(${webhooks.events})`,
        ),
      );
    // Each team's receivers see their own team id (a platform event has none of its own).
    const items = hooks.map((h) => ({
      webhookId: h.id,
      teamId: h.teamId,
      eventId: event.id,
      eventType: event.type,
      body: JSON.stringify({ ...event, team_id: h.teamId }),
      replayOf: null,
    }));
    for (let i = 0; i < items.length; i += 200) await this.owe(items.slice(i, i + 200));
  }

  /** A `webhook.deliver` job: one signed attempt, recorded; RetryJob (with the delay) or FailJob tell the runner what next. */
  private async deliver(deliveryId: string, job: JobRow): Promise<void> {
    const [row] = await this.db
      .select({ d: webhookDeliveries, url: webhooks.url, sealed: webhooks.secretSealed, enabled: webhooks.enabled })
      .from(webhookDeliveries)
      .innerJoin(webhooks, eq(webhooks.id, webhookDeliveries.webhookId))
      .where(eq(webhookDeliveries.id, deliveryId));
    // Deleted with its webhook, or already ended (a job claimed again after a crash that followed the record).
    if (row?.d.status !== 'pending') return;
    const d = row.d;
    const attempt = job.attempts;
    let outcome: Outcome;
    const started = performance.now();
    const secret = this.openSecret(d.webhookId, row.sealed);
    if (!row.enabled) outcome = { kind: 'failed', status: null, error: 'the webhook was disabled' };
    else if (secret === null)
      outcome = {
        kind: 'failed',
        status: null,
        error: 'the signing secret does not open with this server\u2019s KILN_SECRETS_KEY: rotate it',
      };
    else outcome = await this.attempt(row.url, secret, d);
    if (outcome.kind === 'retry' && attempt >= d.maxAttempts) outcome = { ...outcome, kind: 'failed' };
    const delay = outcome.kind === 'retry' ? retryDelayMs(this.opts.retryBaseMs, attempt) : 0;
    const entry: Attempt = {
      attempt,
      at: new Date().toISOString(),
      status_code: outcome.status,
      error: outcome.kind === 'succeeded' ? null : outcome.error,
      duration_ms: Math.round(performance.now() - started),
    };
    const status = outcome.kind === 'retry' ? 'pending' : outcome.kind;
    const now = new Date(this.jobs.now());
    await this.db
      .update(webhookDeliveries)
      .set({
        status,
        attempts: attempt,
        lastStatusCode: outcome.status,
        lastError: entry.error,
        attemptLog: sql`${webhookDeliveries.attemptLog} || ${JSON.stringify([entry])}::jsonb`,
        updatedAt: now,
        nextAttemptAt: outcome.kind === 'retry' ? new Date(now.getTime() + delay) : null,
        deliveredAt: outcome.kind === 'succeeded' ? now : null,
      })
      .where(and(eq(webhookDeliveries.id, d.id), eq(webhookDeliveries.status, 'pending')));
    if (outcome.kind === 'retry') throw new RetryJob(outcome.error, delay);
    if (outcome.kind === 'failed') {
      this.log.warn({ delivery: d.id, webhook: d.webhookId, attempt, error: outcome.error }, 'webhook delivery failed');
      throw new FailJob(outcome.error);
    }
  }

  /** The signing secret, or null when it was sealed with another key (KILN_SECRETS_KEY changed). */
  private openSecret(webhookId: string, sealed: string): string | null {
    try {
      return this.sealer.open(webhookId, sealed);
    } catch {
      return null;
    }
  }

  /** One POST: signed afresh (a new timestamp) with the delivery's id; the answer's body read up to MAX_RESPONSE_BYTES. */
  private async attempt(url: string, secret: string, d: DeliveryRow): Promise<Outcome> {
    const headers = signedHeaders(secret, d.id, Math.floor(Date.now() / 1000), d.body);
    let res: Response;
    try {
      res = await this.send(url, { method: 'POST', headers, body: d.body });
    } catch (err) {
      const cause = causeOf(err);
      // The URL's name resolves only to addresses the server may not reach: no later attempt will differ.
      if (cause instanceof OutboundRefused) return { kind: 'failed', status: null, error: cause.message };
      const e = err as Error & { cause?: { code?: string; message?: string } };
      const why =
        e.name === 'TimeoutError' || e.name === 'AbortError'
          ? `no answer within ${this.opts.timeoutMs} ms`
          : `${e.message}${e.cause?.code ? ` (${e.cause.code})` : e.cause?.message ? ` (${e.cause.message})` : ''}`;
      return { kind: 'retry', status: null, error: clip(why) };
    }
    const text = await readBounded(res).catch(() => '');
    if (res.status >= 200 && res.status < 300) return { kind: 'succeeded', status: res.status };
    const error = clip(`HTTP ${res.status}${text.trim() ? `: ${text.trim()}` : ''}`);
    return { kind: retryableStatus(res.status) ? 'retry' : 'failed', status: res.status, error };
  }
}

/** The first MAX_RESPONSE_BYTES of a response's body; the rest is not downloaded. */
async function readBounded(res: Response): Promise<string> {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < MAX_RESPONSE_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.byteLength;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  return Buffer.concat(chunks).subarray(0, MAX_RESPONSE_BYTES).toString('utf8');
}
