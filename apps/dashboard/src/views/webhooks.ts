import { api, detailsOf, messageOf } from '../api.ts';
import { h, replace, table, when, type Child } from '../dom.ts';
import { action, afterParam, link, pagedPanel, panel, say, type Dispose } from '../panel.ts';
import type { List, Webhook, WebhookDelivery, WebhookWithSecret } from '../types.ts';
import { WEBHOOK_EVENTS } from '../types.ts';

const EVERY_MS = 5000;
/** A pending delivery whose next attempt is this near is looked at every second. */
const SOON_MS = 5000;
const base = (id: string) => `/v1/webhooks/${encodeURIComponent(id)}`;
const webhookHref = (id: string) => `#/webhooks/${encodeURIComponent(id)}`;

/** A refusal under a form: the envelope's message, or, when it named several bad fields, each of them. */
export function refusal(err: unknown): HTMLElement {
  const details = detailsOf(err);
  if (details.length < 2) return h('div', { class: 'error', role: 'alert' }, h('p', {}, messageOf(err)));
  return h(
    'div',
    { class: 'error', role: 'alert' },
    h('p', {}, `The API refused it (${details.length} problems):`),
    h('ul', { class: 'details' }, ...details.map((d) => h('li', {}, d.path ? `${d.path}: ${d.message}` : d.message))),
  );
}

/**
 * Where a signing secret is shown, the once the API gives it (on create and on rotate): nothing
 * keeps it, so it is gone at the next render or reload.
 */
function secretBox(): { box: HTMLElement; show: (w: WebhookWithSecret, what: string) => void } {
  const box = h('div', { class: 'secret-box', id: 'webhook-secret', hidden: true });
  const show = (w: WebhookWithSecret, what: string) => {
    const code = h('code', { class: 'secret' }, w.secret);
    const copied = h('span', { class: 'hint', role: 'status' });
    box.hidden = false;
    replace(
      box,
      h('p', {}, h('strong', {}, `${what}: `), w.url),
      h('p', { class: 'warn' }, 'Copy the signing secret now: it is not shown again.'),
      h(
        'p',
        { class: 'secret-line' },
        code,
        h(
          'button',
          {
            type: 'button',
            onclick: async () => {
              try {
                await navigator.clipboard.writeText(w.secret);
                replace(copied, 'copied');
              } catch {
                getSelection()?.selectAllChildren(code);
                replace(copied, 'selected: copy it with Ctrl+C');
              }
            },
          },
          'Copy',
        ),
        h(
          'button',
          {
            type: 'button',
            onclick: () => {
              box.hidden = true;
              replace(box);
            },
          },
          'I have copied it',
        ),
        copied,
      ),
      h('p', { class: 'hint' }, 'Receivers verify each request with it (docs/webhooks.md). Lost, rotate it.'),
    );
  };
  return { box, show };
}

/** The six events as checkboxes (none checked). */
function eventChecks(name: string, checked: readonly string[] = []): HTMLElement {
  return h(
    'fieldset',
    { class: 'statuses events-pick' },
    h('legend', {}, 'events'),
    ...WEBHOOK_EVENTS.map((e) =>
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name, value: e, checked: checked.includes(e) }), e),
    ),
  );
}

const picked = (form: HTMLElement, name: string) =>
  [...form.querySelectorAll<HTMLInputElement>(`input[name="${name}"]:checked`)].map((i) => i.value);

function createForm(after: () => Promise<void>, secret: ReturnType<typeof secretBox>): HTMLElement {
  const url = h('input', { id: 'webhook-url', type: 'url', placeholder: 'https://hooks.example.com/kiln', size: 50 });
  const description = h('input', { id: 'webhook-description', maxlength: '500', size: 40, placeholder: 'optional' });
  const note = h('div', { class: 'save-note' });
  const form: HTMLFormElement = h(
    'form',
    {
      id: 'webhook-form',
      class: 'update-form',
      // The API checks the URL (scheme, credentials, address): the browser's own check would hide its message.
      novalidate: true,
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        replace(note);
        const body: Record<string, unknown> = { url: url.value, events: picked(form, 'event') };
        if (description.value.trim()) body.description = description.value;
        try {
          const w = await api<WebhookWithSecret>('POST', '/v1/webhooks', body);
          form.reset();
          secret.show(w, `Created ${w.id}`);
          await after();
        } catch (err) {
          replace(note, refusal(err));
        }
      },
    },
    h('label', {}, 'URL (the receiver: http or https)', url),
    eventChecks('event'),
    h('label', {}, 'description', description),
    h('button', { type: 'submit' }, 'Create webhook'),
    note,
  );
  return form;
}

/**
 * A delivery's HTTP codes, one per attempt (— for an attempt that got no answer), opening onto
 * each attempt: when, its code or error, how long it took.
 */
function codes(d: WebhookDelivery): HTMLElement {
  if (d.attempt_log.length === 0) return h('span', { class: 'hint' }, 'no attempt yet');
  return h(
    'details',
    { class: 'attempts' },
    h(
      'summary',
      { class: 'attempts-head' },
      h(
        'span',
        { class: 'codes' },
        ...d.attempt_log.map((a) =>
          h(
            'span',
            { class: `code ${a.status_code !== null && a.status_code < 300 ? 'ok' : 'bad'}` },
            a.status_code === null ? '—' : String(a.status_code),
          ),
        ),
      ),
    ),
    h(
      'ol',
      {},
      ...d.attempt_log.map((a) =>
        h(
          'li',
          {},
          `${when(a.at)} · ${a.status_code === null ? 'no answer' : `HTTP ${a.status_code}`} · ${a.duration_ms} ms`,
          a.error ? h('span', { class: 'last-error' }, ` · ${a.error}`) : null,
        ),
      ),
    ),
  );
}

const lastDelivery = (d: WebhookDelivery | undefined): Child =>
  d
    ? h(
        'span',
        {},
        h('span', { class: `status ${d.status}` }, d.status),
        ` ${d.event_type} · `,
        d.last_status_code === null ? 'no answer' : `HTTP ${d.last_status_code}`,
        ` · ${when(d.created_at)}`,
      )
    : h('span', { class: 'hint' }, 'none yet');

/** The team's webhooks (a page, each with its last delivery) and the form that makes one. */
export function webhooksPanels(dispose: Dispose[]): HTMLElement[] {
  const secret = secretBox();
  const list = pagedPanel<Webhook & { last?: WebhookDelivery }>(
    'webhooks',
    'Webhooks',
    async (after) => {
      const page = await api<List<Webhook>>('GET', `/v1/webhooks?limit=20${afterParam(after)}`);
      const lasts = await Promise.all(
        page.data.map((w) =>
          api<List<WebhookDelivery>>('GET', `${base(w.id)}/deliveries?limit=1`).then((l) => l.data[0]),
        ),
      );
      return { ...page, data: page.data.map((w, i) => ({ ...w, last: lasts[i] })) };
    },
    (rows) =>
      table(
        ['webhook', 'events', 'enabled', 'last delivery'],
        rows,
        (w) => [
          h(
            'span',
            { class: 'hook', 'data-webhook': w.id },
            link(webhookHref(w.id), w.url),
            w.description ? h('span', { class: 'hint' }, w.description) : null,
          ),
          w.events.join(', '),
          w.enabled ? 'yes' : h('span', { class: 'status failed' }, 'disabled'),
          lastDelivery(w.last),
        ],
        'no webhook yet',
      ),
    // Each webhook's last delivery is one more request: this list is read every 30 s, not every 5
    // (a team's rate limit is shared by all its keys).
    { everyMs: 30_000, dispose },
  );
  return [
    list.box,
    h(
      'section',
      { class: 'panel', id: 'webhook-create' },
      h('header', {}, h('h2', {}, 'New webhook')),
      h(
        'p',
        { class: 'hint' },
        'Kiln POSTs each event named to the URL, signed (Standard Webhooks); a failed delivery is retried with backoff.',
      ),
      secret.box,
      createForm(() => list.restart(), secret),
    ),
  ];
}

/** One webhook: what it is, its actions, and its delivery log (paged, with Replay). */
export function webhookView(id: string, dispose: Dispose[]): HTMLElement {
  const path = base(id);
  const secret = secretBox();
  let reloadLog: () => Promise<void> = async () => undefined;
  let due = false;
  const hook = panel(
    'webhook',
    'Webhook',
    () => api<Webhook>('GET', path),
    (w, reload) =>
      h(
        'div',
        {},
        h(
          'dl',
          { class: 'facts' },
          h('dt', {}, 'URL'),
          h('dd', { class: 'webhook-url' }, w.url),
          h('dt', {}, 'events'),
          h('dd', {}, w.events.join(', ')),
          h('dt', {}, 'description'),
          h('dd', {}, w.description ?? '—'),
          h('dt', {}, 'enabled'),
          h('dd', { id: 'webhook-enabled' }, w.enabled ? 'yes' : 'no: nothing new is sent to it'),
          h('dt', {}, 'id'),
          h('dd', {}, w.id),
          h('dt', {}, 'created · changed'),
          h('dd', {}, `${when(w.created_at)} · ${when(w.updated_at)}`),
        ),
        h(
          'p',
          { class: 'actions' },
          action(
            w.enabled ? 'Disable' : 'Enable',
            async () => ((await api<Webhook>('PATCH', path, { enabled: !w.enabled })).enabled ? 'enabled' : 'disabled'),
            { after: reload },
          ),
          action(
            'Send test',
            async () => `delivery ${(await api<WebhookDelivery>('POST', `${path}/test`)).id} queued`,
            { after: () => reloadLog() },
          ),
          action(
            'Rotate secret',
            async () => {
              const r = await api<WebhookWithSecret>('POST', `${path}/rotate-secret`);
              secret.show(r, 'New secret');
              return 'the old secret signs nothing more';
            },
            { confirm: 'Rotate the signing secret? The old one stops signing at once: receivers need the new one.' },
          ),
          action(
            'Delete',
            async () => {
              await api('DELETE', path);
              const done = `${id} deleted with its delivery log`;
              // The team page's render clears the flash: say it once that page is there.
              window.addEventListener('hashchange', () => say(`Delete: ${done}`, true), { once: true });
              location.hash = '#/admin';
              return done;
            },
            { confirm: `Delete the webhook to ${w.url} and its delivery log?`, className: 'danger' },
          ),
        ),
        secret.box,
      ),
    { dispose, actions: [link('#/admin', '← all webhooks')] },
  );
  const log = pagedPanel<WebhookDelivery>(
    'deliveries',
    'Deliveries',
    (after) => api<List<WebhookDelivery>>('GET', `${path}/deliveries?limit=20${afterParam(after)}`),
    (rows, reload) => {
      reloadLog = reload;
      due = rows.some(
        (d) => d.status === 'pending' && (!d.next_attempt_at || Date.parse(d.next_attempt_at) - Date.now() < SOON_MS),
      );
      return table(
        ['delivery', 'event', 'status', 'attempts', 'HTTP', 'last error', 'created', 'next · delivered', ''],
        rows,
        (d) => [
          h(
            'span',
            { 'data-delivery': d.id },
            d.id,
            d.replay_of ? h('span', { class: 'hint' }, ` replay of ${d.replay_of}`) : null,
          ),
          d.event_type,
          h('span', { class: `status ${d.status}` }, d.status),
          `${d.attempts}/${d.max_attempts}`,
          codes(d),
          d.last_error ? h('span', { class: 'last-error' }, d.last_error) : '—',
          when(d.created_at),
          d.delivered_at
            ? `delivered ${when(d.delivered_at)}`
            : d.next_attempt_at
              ? `next ${when(d.next_attempt_at)}`
              : '—',
          action(
            'Replay',
            async () => `sent again as ${(await api<WebhookDelivery>('POST', `${path}/deliveries/${d.id}/replay`)).id}`,
            { after: reload },
          ),
        ],
        'no delivery yet: Send test queues one',
      );
    },
    { everyMs: EVERY_MS, dispose },
  );
  // A delivery being sent, or due within seconds, is looked at every second until it is done, so
  // Send test or Replay shows its outcome at once; one waiting minutes for a retry is not.
  const soon = setInterval(() => {
    if (due) void reloadLog();
  }, 1000);
  dispose.push(() => clearInterval(soon));
  return h('div', { class: 'view' }, hook, log.box);
}
