import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { WEBHOOK_EVENTS } from '../../webhooks/events.ts';

const EventType = z.enum(WEBHOOK_EVENTS);
const Url = z
  .string()
  .trim()
  .min(1)
  .max(2048)
  .regex(/^https?:\/\//, 'must be an http or https URL')
  .openapi({
    description:
      'http(s) only, no credentials; a public address (or one KILN_OUTBOUND_ALLOW names), checked again when it is resolved at every attempt',
    example: 'https://example.com/kiln-hooks',
  });
const Events = z
  .array(EventType)
  .min(1, 'name at least one event')
  .max(WEBHOOK_EVENTS.length)
  .refine((e) => new Set(e).size === e.length, 'events must not repeat')
  .openapi({ description: 'the events this webhook receives' });
const Description = z.string().trim().max(500).nullable();

const Webhook = z
  .object({
    id: z.string(),
    url: z.string(),
    events: z.array(EventType),
    description: z.string().nullable(),
    enabled: z.boolean(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Webhook', { description: 'A webhook; its signing secret is shown only when it is made (or rotated)' });

const WithSecret = Webhook.extend({
  secret: z.string().openapi({
    description:
      'the signing secret (`whsec_…`, Standard Webhooks): shown this once, never again; sealed at rest, since every delivery is signed with it',
  }),
}).openapi('WebhookWithSecret');

const Attempt = z.object({
  attempt: z.number().int(),
  at: z.string(),
  status_code: z.number().int().nullable(),
  error: z.string().nullable(),
  duration_ms: z.number().int(),
});

const Delivery = z
  .object({
    id: z.string().openapi({ description: 'the `webhook-id` header of its requests (the same on every retry)' }),
    webhook_id: z.string(),
    event_id: z.string(),
    event_type: z.string(),
    status: z.enum(['pending', 'succeeded', 'failed']),
    attempts: z.number().int(),
    max_attempts: z.number().int(),
    last_status_code: z.number().int().nullable(),
    last_error: z.string().nullable(),
    attempt_log: z.array(Attempt),
    replay_of: z.string().nullable(),
    payload: z.record(z.string(), z.unknown()).openapi({ description: 'the JSON body sent' }),
    created_at: z.string(),
    updated_at: z.string(),
    next_attempt_at: z.string().nullable(),
    delivered_at: z.string().nullable(),
  })
  .openapi('WebhookDelivery');

const Params = z.object({ webhook: IdParam('webhook', 'whk_0abc') });
const DeliveryParams = Params.extend({ delivery: IdParam('delivery', 'whd_0abc') });
const security = [{ bearer: [] }];
const tags = ['Webhooks'];
const body = <T extends z.ZodType>(schema: T) => ({ content: { 'application/json': { schema } }, required: true });

const Create = z
  .object({ url: Url, events: Events, description: Description.optional() })
  .strict()
  .openapi('WebhookCreate');
const Update = z
  .object({
    url: Url.optional(),
    events: Events.optional(),
    description: Description.optional(),
    enabled: z.boolean().optional(),
  })
  .strict()
  .refine((p) => Object.keys(p).length > 0, 'change at least one field')
  .openapi('WebhookUpdate');

export const create = createRoute({
  operationId: 'createWebhook',
  method: 'post',
  path: '/v1/webhooks',
  tags,
  security,
  summary: 'Create a webhook: the team\u2019s events it names are POSTed to its URL, signed',
  request: { body: body(Create) },
  responses: {
    201: jsonContent(WithSecret, 'The webhook, with its signing secret (shown this once)'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const list = createRoute({
  operationId: 'listWebhooks',
  method: 'get',
  path: '/v1/webhooks',
  tags,
  security,
  summary: 'List the team\u2019s webhooks',
  request: { query: ListQuery },
  responses: { 200: jsonContent(listOf(Webhook), 'Webhooks'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getWebhook',
  method: 'get',
  path: '/v1/webhooks/{webhook}',
  tags,
  security,
  summary: 'Get a webhook (never its secret)',
  request: { params: Params },
  responses: { 200: jsonContent(Webhook, 'The webhook'), ...errorResponses },
});

export const update = createRoute({
  operationId: 'updateWebhook',
  method: 'patch',
  path: '/v1/webhooks/{webhook}',
  tags,
  security,
  summary: 'Change a webhook\u2019s URL, events, description or enabled',
  request: { params: Params, body: body(Update) },
  responses: { 200: jsonContent(Webhook, 'The webhook'), ...errorResponses },
});

export const remove = createRoute({
  operationId: 'deleteWebhook',
  method: 'delete',
  path: '/v1/webhooks/{webhook}',
  tags,
  security,
  summary: 'Delete a webhook and its delivery log (deliveries still owed are dropped)',
  request: { params: Params },
  responses: {
    200: jsonContent(z.object({ id: z.string(), deleted: z.literal(true) }), 'Deleted'),
    ...errorResponses,
  },
});

export const rotateSecret = createRoute({
  operationId: 'rotateWebhookSecret',
  method: 'post',
  path: '/v1/webhooks/{webhook}/rotate-secret',
  tags,
  security,
  summary: 'Replace the signing secret (shown this once); the old one signs nothing more',
  request: { params: Params },
  responses: { 200: jsonContent(WithSecret, 'The webhook with its new secret'), ...errorResponses },
});

export const test = createRoute({
  operationId: 'testWebhook',
  method: 'post',
  path: '/v1/webhooks/{webhook}/test',
  tags,
  security,
  summary: 'Send a `webhook.test` event to this webhook (delivered and retried like any other)',
  request: { params: Params },
  responses: {
    202: jsonContent(Delivery, 'The delivery, queued'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const deliveries = createRoute({
  operationId: 'listWebhookDeliveries',
  method: 'get',
  path: '/v1/webhooks/{webhook}/deliveries',
  tags,
  security,
  summary: 'The delivery log: each event sent, its status, attempts and their HTTP status codes',
  request: { params: Params, query: ListQuery },
  responses: { 200: jsonContent(listOf(Delivery), 'Deliveries'), ...errorResponses },
});

export const getDelivery = createRoute({
  operationId: 'getWebhookDelivery',
  method: 'get',
  path: '/v1/webhooks/{webhook}/deliveries/{delivery}',
  tags,
  security,
  summary: 'One delivery with its attempts',
  request: { params: DeliveryParams },
  responses: { 200: jsonContent(Delivery, 'The delivery'), ...errorResponses },
});

export const replay = createRoute({
  operationId: 'replayWebhookDelivery',
  method: 'post',
  path: '/v1/webhooks/{webhook}/deliveries/{delivery}/replay',
  tags,
  security,
  summary: 'Send a delivery\u2019s payload again, as a new delivery (a new `webhook-id`)',
  request: { params: DeliveryParams },
  responses: {
    202: jsonContent(Delivery, 'The new delivery, queued'),
    409: conflictResponse,
    ...errorResponses,
  },
});
