import { messageOf } from './api.ts';
import { h, replace, type Child } from './dom.ts';

/** What a view registers to stop when the route changes (timers, streams). */
export type Dispose = () => void;

/**
 * A titled box that loads its data from the API and renders it; with `everyMs` it reloads,
 * and re-renders only when the data changed (so a button is not swapped under the cursor).
 * A failed load shows the API's error message in the box.
 */
export function panel<T>(
  id: string,
  title: string,
  load: () => Promise<T>,
  render: (data: T, reload: () => Promise<void>) => Child,
  opts: { everyMs?: number; dispose: Dispose[]; actions?: Child[] },
): HTMLElement {
  const body = h('div', { class: 'panel-body' }, h('p', { class: 'loading' }, 'loading…'));
  const box = h('section', { class: 'panel', id }, h('header', {}, h('h2', {}, title), ...(opts.actions ?? [])), body);
  let last: string | undefined;
  let stopped = false;
  const reload = async () => {
    try {
      const data = await load();
      const json = JSON.stringify(data);
      if (stopped || json === last) return;
      last = json;
      replace(body, render(data, reload));
    } catch (err) {
      const text = messageOf(err);
      if (stopped || last === `!${text}`) return;
      last = `!${text}`;
      replace(body, h('p', { class: 'error', role: 'alert' }, text));
    }
  };
  void reload();
  const timer = opts.everyMs ? setInterval(() => void reload(), opts.everyMs) : undefined;
  opts.dispose.push(() => {
    stopped = true;
    clearInterval(timer);
  });
  return box;
}

/** Where actions report what they did or the API's error: one line under the navigation, kept across panel reloads. */
export const flash = h('p', { id: 'flash', role: 'status' });

/** Reports in `flash` (an action does it itself; this is for what outlives its view). */
export function say(text: string, ok: boolean) {
  flash.className = ok ? 'ok' : 'error';
  replace(flash, text);
}

/** A button that runs an API action, reports its outcome (or the API's error) in `flash`, then reloads. */
export function action(
  label: string,
  run: () => Promise<string | undefined>,
  opts: {
    confirm?: string;
    after?: () => Promise<void>;
    className?: string;
    /** Also told of a failure (after it is reported in `flash`), e.g. to explain it on the page. */
    onError?: (err: unknown) => void;
  } = {},
): HTMLElement {
  const button = h(
    'button',
    {
      type: 'button',
      class: opts.className ?? '',
      onclick: async () => {
        if (opts.confirm && !window.confirm(opts.confirm)) return;
        button.disabled = true;
        try {
          say(`${label}: ${(await run()) ?? 'done'}`, true);
          await opts.after?.();
        } catch (err) {
          say(`${label}: ${messageOf(err)}`, false);
          opts.onError?.(err);
        } finally {
          button.disabled = false;
        }
      },
    },
    label,
  );
  return button;
}

/**
 * A list panel that pages with the API's cursor (`after` = the previous page's `last_id`):
 * Older goes one page further, Newer one back, and a reload (or `everyMs`) re-reads the page shown.
 * `query()` is read at every load, so a filter form only has to call the returned `restart`.
 */
export function pagedPanel<T>(
  id: string,
  title: string,
  load: (after: string | undefined) => Promise<{ data: T[]; has_more?: boolean; last_id?: string | null }>,
  render: (rows: T[], reload: () => Promise<void>) => Child,
  opts: { everyMs?: number; dispose: Dispose[]; actions?: Child[] },
): { box: HTMLElement; restart: () => Promise<void> } {
  const cursors: (string | undefined)[] = [undefined];
  let reloadNow: () => Promise<void> = async () => undefined;
  const box = panel(
    id,
    title,
    async () => ({ page: cursors.length, list: await load(cursors.at(-1)) }),
    ({ page, list }, reload) => {
      reloadNow = reload;
      const step = (label: string, enabled: boolean, move: () => void) =>
        h(
          'button',
          {
            type: 'button',
            class: 'pager',
            disabled: !enabled,
            onclick: () => {
              move();
              void reload();
            },
          },
          label,
        );
      return h(
        'div',
        {},
        render(list.data, reload),
        h(
          'div',
          { class: 'pages' },
          step('← Newer', page > 1, () => cursors.pop()),
          h('span', { class: 'page' }, `page ${page}`),
          step('Older →', Boolean(list.has_more && list.last_id), () => cursors.push(list.last_id ?? undefined)),
        ),
      );
    },
    opts,
  );
  const restart = async () => {
    cursors.splice(1);
    await reloadNow();
  };
  return { box, restart };
}

/** A filter form over a paged list: submitting it reads the list's first page again. */
export function filterForm(id: string, list: { restart: () => Promise<void> }, ...fields: Child[]): HTMLElement {
  const submit = (ev: Event) => {
    ev.preventDefault();
    void list.restart();
  };
  return h('form', { class: 'filters', id, onsubmit: submit }, ...fields, h('button', { type: 'submit' }, 'Filter'));
}

/** The query part that asks a list for the page after `after` ('' for the first page). */
export const afterParam = (after: string | undefined) => (after ? `&after=${encodeURIComponent(after)}` : '');

/** A route link. */
export const link = (href: string, text: Child) => h('a', { href }, text);
