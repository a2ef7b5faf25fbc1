/** Something that can stand as a child: text is always added as a text node, never parsed as HTML. */
export type Child = Node | string | number | null | undefined | false;
type Props = Record<string, string | number | boolean | undefined | ((ev: Event) => void)>;

/** Builds an element; `on…` props are listeners, the rest attributes. API data only ever becomes text nodes. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Props = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else if (v !== undefined && v !== false) el.setAttribute(k, String(v));
  }
  append(el, ...children);
  return el;
}

function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, ...children);
}

export const when = (iso: string | null | undefined) => (iso ? new Date(iso).toLocaleString() : '—');

/** A table: headers, then one row of cells per item. */
export function table<T>(heads: string[], rows: T[], cells: (row: T) => Child[], empty = 'none'): HTMLElement {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h(
    'table',
    {},
    h('thead', {}, h('tr', {}, ...heads.map((x) => h('th', {}, x)))),
    // Each cell names its column (data-label), for the narrow-screen layout that stacks a row's cells.
    h('tbody', {}, ...rows.map((r) => h('tr', {}, ...cells(r).map((c, i) => h('td', { 'data-label': heads[i] }, c))))),
  );
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element: attributes set as given, children appended (text only ever as text nodes). */
export function svg(tag: string, attrs: Record<string, string | number> = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  append(el, ...children);
  return el;
}
