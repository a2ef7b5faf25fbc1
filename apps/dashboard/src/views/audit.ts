import { api } from '../api.ts';
import { h, table, when } from '../dom.ts';
import { filterForm, pagedPanel, type Dispose } from '../panel.ts';
import type { AuditEvent, List } from '../types.ts';

const FILTERS = [
  ['actor', 'actor key id', 'key_…'],
  ['action', 'action', 'workspace.update'],
  ['resource_type', 'resource type', 'workspace'],
  ['resource', 'resource id', 'ws_…'],
] as const;

/** A datetime-local input's value (local time) as the API's ISO 8601 instant; '' stays ''. */
const isoOf = (local: string) => (local ? new Date(local).toISOString() : '');

/**
 * The audit log (a team key: its team; an org-admin key: every team), filtered by actor key,
 * action, resource and time range, paged with the API's cursor.
 */
export function auditView(dispose: Dispose[]): HTMLElement {
  const inputs = new Map<string, HTMLInputElement>();
  const field = (name: string, label: string, attrs: Record<string, string>) => {
    const input = h('input', { name, id: `audit-${name}`, ...attrs });
    inputs.set(name, input);
    return h('label', {}, label, input);
  };
  const perPage = h(
    'select',
    { name: 'limit', id: 'audit-limit' },
    ...['10', '50', '100'].map((n) => h('option', { value: n, ...(n === '50' ? { selected: true } : {}) }, n)),
  );
  const query = () => {
    const q = new URLSearchParams({ limit: perPage.value });
    for (const [name] of FILTERS) {
      const v = inputs.get(name)!.value.trim();
      if (v) q.set(name, v);
    }
    for (const name of ['since', 'until']) {
      const v = isoOf(inputs.get(name)!.value);
      if (v) q.set(name, v);
    }
    return q;
  };
  // The fields first: the list loads at once and reads them.
  const fields = [
    ...FILTERS.map(([name, label, placeholder]) => field(name, label, { placeholder, maxlength: '128' })),
    field('since', 'from', { type: 'datetime-local', step: '0.001' }),
    field('until', 'until', { type: 'datetime-local', step: '0.001' }),
  ];
  const list = pagedPanel<AuditEvent>(
    'audit',
    'Audit log',
    (after) => {
      const q = query();
      if (after) q.set('after', after);
      return api<List<AuditEvent>>('GET', `/v1/audit?${q}`);
    },
    (rows) =>
      table(
        ['when', 'action', 'resource', 'actor', 'team'],
        rows,
        (e) => [
          when(e.created_at),
          e.action,
          [e.resource_type, e.resource_id].filter(Boolean).join(' '),
          e.actor ?? 'system',
          e.team_id ?? '—',
        ],
        'no audit event matches',
      ),
    { everyMs: 10_000, dispose },
  );
  const form = filterForm('audit-filters', list, ...fields, h('label', {}, 'per page', perPage));
  return h('div', { class: 'view' }, form, list.box);
}
