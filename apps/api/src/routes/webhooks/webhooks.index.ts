import { teamOf, writableTeamOf } from '../../http/guards.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import type { WebhookEventType } from '../../webhooks/events.ts';
import type { DeliveryRow, WebhookRow, WebhookService } from '../../webhooks/service.ts';
import * as r from './webhooks.routes.ts';

const view = (w: WebhookRow) => ({
  id: w.id,
  url: w.url,
  events: w.events as WebhookEventType[],
  description: w.description,
  enabled: w.enabled,
  created_at: w.createdAt.toISOString(),
  updated_at: w.updatedAt.toISOString(),
});

const deliveryView = (d: DeliveryRow) => ({
  id: d.id,
  webhook_id: d.webhookId,
  event_id: d.eventId,
  event_type: d.eventType,
  status: d.status,
  attempts: d.attempts,
  max_attempts: d.maxAttempts,
  last_status_code: d.lastStatusCode,
  last_error: d.lastError,
  attempt_log: d.attemptLog as {
    attempt: number;
    at: string;
    status_code: number | null;
    error: string | null;
    duration_ms: number;
  }[],
  replay_of: d.replayOf,
  payload: JSON.parse(d.body) as Record<string, unknown>,
  created_at: d.createdAt.toISOString(),
  updated_at: d.updatedAt.toISOString(),
  next_attempt_at: d.nextAttemptAt?.toISOString() ?? null,
  delivered_at: d.deliveredAt?.toISOString() ?? null,
});

/** Team-scoped: viewers read, members and up write; another team's webhook is 404. The secret never reaches the audit log. */
export function webhooksRouter(hooks: WebhookService) {
  return createRouter()
    .openapi(r.create, async (c) => {
      const { row, secret } = await hooks.create(writableTeamOf(c), c.req.valid('json'));
      c.set('audit', { action: 'webhook.create', resourceType: 'webhook', resourceId: row.id, after: view(row) });
      return c.json({ ...view(row), secret }, 201);
    })
    .openapi(r.list, async (c) => {
      const q = c.req.valid('query');
      return c.json(toPage(await hooks.list(teamOf(c), q), q, view), 200);
    })
    .openapi(r.get, async (c) => c.json(view(await hooks.get(teamOf(c), c.req.valid('param').webhook)), 200))
    .openapi(r.update, async (c) => {
      const id = c.req.valid('param').webhook;
      const { before, after } = await hooks.update(writableTeamOf(c), id, c.req.valid('json'));
      c.set('audit', {
        action: 'webhook.update',
        resourceType: 'webhook',
        resourceId: id,
        before: view(before),
        after: view(after),
      });
      return c.json(view(after), 200);
    })
    .openapi(r.remove, async (c) => {
      const id = c.req.valid('param').webhook;
      const before = await hooks.remove(writableTeamOf(c), id);
      c.set('audit', { action: 'webhook.delete', resourceType: 'webhook', resourceId: id, before: view(before) });
      return c.json({ id, deleted: true as const }, 200);
    })
    .openapi(r.rotateSecret, async (c) => {
      const id = c.req.valid('param').webhook;
      const { row, secret } = await hooks.rotateSecret(writableTeamOf(c), id);
      c.set('audit', { action: 'webhook.rotate_secret', resourceType: 'webhook', resourceId: id, after: view(row) });
      return c.json({ ...view(row), secret }, 200);
    })
    .openapi(r.test, async (c) => {
      const id = c.req.valid('param').webhook;
      const d = await hooks.test(writableTeamOf(c), id);
      c.set('audit', { action: 'webhook.test', resourceType: 'webhook', resourceId: id, after: { delivery_id: d.id } });
      return c.json(deliveryView(d), 202);
    })
    .openapi(r.deliveries, async (c) => {
      const q = c.req.valid('query');
      const rows = await hooks.listDeliveries(teamOf(c), c.req.valid('param').webhook, q);
      return c.json(toPage(rows, q, deliveryView), 200);
    })
    .openapi(r.getDelivery, async (c) => {
      const { webhook, delivery } = c.req.valid('param');
      return c.json(deliveryView(await hooks.getDelivery(teamOf(c), webhook, delivery)), 200);
    })
    .openapi(r.replay, async (c) => {
      const { webhook, delivery } = c.req.valid('param');
      const d = await hooks.replay(writableTeamOf(c), webhook, delivery);
      c.set('audit', {
        action: 'webhook.replay',
        resourceType: 'webhook',
        resourceId: webhook,
        after: { delivery_id: d.id, replay_of: delivery },
      });
      return c.json(deliveryView(d), 202);
    });
}
