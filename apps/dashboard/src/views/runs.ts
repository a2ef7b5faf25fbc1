import { api } from '../api.ts';
import { h } from '../dom.ts';
import { filterForm, pagedPanel, type Dispose } from '../panel.ts';
import type { List, Run } from '../types.ts';
import { runsTable } from './overview.ts';

const STATUSES = ['queued', 'in_progress', 'requires_action', 'completed', 'failed', 'cancelled'];

/** Every run of the team, filtered by status, workspace and session, paged with the API's cursor. */
export function runsView(dispose: Dispose[], preset: URLSearchParams): HTMLElement {
  const boxes = STATUSES.map((s) =>
    h('input', {
      type: 'checkbox',
      name: 'status',
      value: s,
      id: `runs-status-${s}`,
      ...(preset.get('status')?.split(',').includes(s) ? { checked: true } : {}),
    }),
  );
  const text = (name: string, placeholder: string) =>
    h('input', { name, id: `runs-${name}`, placeholder, maxlength: '64', value: preset.get(name) ?? '' });
  const workspace = text('workspace', 'ws_…');
  const session = text('session', 'ses_…');
  const list = pagedPanel<Run>(
    'all-runs',
    'Runs',
    (after) => {
      const q = new URLSearchParams({ limit: '20' });
      const statuses = boxes.filter((b) => b.checked).map((b) => b.value);
      if (statuses.length) q.set('status', statuses.join(','));
      if (workspace.value.trim()) q.set('workspace', workspace.value.trim());
      if (session.value.trim()) q.set('session', session.value.trim());
      if (after) q.set('after', after);
      return api<List<Run>>('GET', `/v1/runs?${q}`);
    },
    (rows) => runsTable(rows, 'no run matches'),
    { everyMs: 5000, dispose },
  );
  const form = filterForm(
    'runs-filters',
    list,
    h(
      'fieldset',
      { class: 'statuses' },
      h('legend', {}, 'status'),
      ...boxes.map((b) => h('label', { class: 'check' }, b, b.value)),
    ),
    h('label', {}, 'workspace', workspace),
    h('label', {}, 'session', session),
  );
  return h('div', { class: 'view' }, form, list.box);
}
