import { api } from '../api.ts';
import { h, table, when } from '../dom.ts';
import { panel, type Dispose } from '../panel.ts';
import type { AuditEvent, List, Team, Update, Version } from '../types.ts';

/** The audit log (a team key: its team; an org-admin key: every team). */
export function auditView(dispose: Dispose[]): HTMLElement {
  return h(
    'div',
    { class: 'view' },
    panel(
      'audit',
      'Audit log',
      () => api<List<AuditEvent>>('GET', '/v1/audit?limit=100'),
      (p) =>
        table(
          ['when', 'action', 'resource', 'actor', 'team'],
          p.data,
          (e) => [
            when(e.created_at),
            e.action,
            [e.resource_type, e.resource_id].filter(Boolean).join(' '),
            e.actor ?? 'system',
            e.team_id ?? '—',
          ],
          'no audit event',
        ),
      { everyMs: 10_000, dispose },
    ),
  );
}

/** Teams, the running version and platform updates: org-admin matters (a team key sees its own team). */
export function adminView(dispose: Dispose[]): HTMLElement {
  return h(
    'div',
    { class: 'view' },
    panel(
      'teams',
      'Teams',
      () => api<List<Team>>('GET', '/v1/teams'),
      (p) => table(['team', 'id', 'created'], p.data, (t) => [t.name, t.id, when(t.created_at)]),
      { dispose },
    ),
    panel(
      'version',
      'Running version',
      () => api<Version>('GET', '/v1/system/version'),
      (v) => h('p', {}, `commit ${v.commit ?? '—'} on ${v.branch ?? '—'} · pid ${v.pid} · since ${when(v.started_at)}`),
      { dispose },
    ),
    panel(
      'updates',
      'Platform updates',
      () => api<List<Update>>('GET', '/v1/system/updates'),
      (p) =>
        table(
          ['update', 'status', 'reason', 'commit', 'error', 'when'],
          p.data,
          (u) => [u.id, u.status, u.reason, u.commit_sha?.slice(0, 10) ?? '—', u.error ?? '', when(u.created_at)],
          'no update',
        ),
      { everyMs: 10_000, dispose },
    ),
  );
}
