import { api } from '../api.ts';
import { h, table, when } from '../dom.ts';
import { action, link, panel, type Dispose } from '../panel.ts';
import type { Approval, List, Run, Sandbox, UsageRow, Workspace } from '../types.ts';

const EVERY_MS = 3000;
const IN_FLIGHT = 'queued,in_progress,requires_action';

/** Pushes a session's sandbox's idle deadline forward by its workspace's idle time. */
export const keepAlive = (sessionId: string, reload: () => Promise<void>) =>
  action('Keep alive', async () => void (await api('POST', `/v1/sessions/${sessionId}/keepalive`)), {
    after: reload,
  });

export const runsTable = (runs: Run[], empty: string) =>
  table(
    ['run', 'workspace', 'status', 'steps', 'started'],
    runs,
    (r) => [
      link(`#/runs/${r.id}`, r.id),
      link(`#/ws/${r.workspace_id}`, r.workspace_id),
      h('span', { class: `status ${r.status}` }, r.status),
      r.steps,
      when(r.created_at),
    ],
    empty,
  );

/** What is happening now: runs in flight, approvals waiting for a person, sandboxes, workspaces, usage. */
export function overview(dispose: Dispose[]): HTMLElement {
  const decide = (a: Approval, decision: string, label: string, reload: () => Promise<void>) =>
    action(label, async () => void (await api('POST', `/v1/approvals/${a.id}`, { decision })), {
      after: reload,
      className: decision,
    });
  return h(
    'div',
    { class: 'view' },
    panel(
      'runs',
      'Runs in flight',
      () => api<List<Run>>('GET', `/v1/runs?status=${IN_FLIGHT}&limit=50`),
      (p) => runsTable(p.data, 'no run in flight'),
      { everyMs: EVERY_MS, dispose },
    ),
    panel(
      'approvals',
      'Pending approvals',
      () => api<List<Approval>>('GET', '/v1/approvals?status=pending'),
      (p, reload) =>
        p.data.length === 0
          ? h('p', { class: 'empty' }, 'nothing waits for approval')
          : h(
              'ul',
              { class: 'approvals' },
              ...p.data.map((a) =>
                h(
                  'li',
                  { 'data-approval': a.id },
                  h(
                    'div',
                    {},
                    'run ',
                    link(`#/runs/${a.run_id}`, a.run_id),
                    ' · workspace ',
                    link(`#/ws/${a.workspace_id}`, a.workspace_id),
                    ' · expires ',
                    when(a.expires_at),
                  ),
                  h('pre', { class: 'code' }, a.code),
                  decide(a, 'approve', 'Approve', reload),
                  decide(a, 'approve_session', 'Approve for session', reload),
                  decide(a, 'deny', 'Deny', reload),
                ),
              ),
            ),
      { everyMs: EVERY_MS, dispose },
    ),
    panel(
      'sandboxes',
      'Sandboxes',
      () => api<List<Sandbox>>('GET', '/v1/sandboxes'),
      (p, reload) =>
        table(
          ['sandbox', 'session', 'state', 'runtime', 'memory', 'CPU', 'last used', 'reclaimed at', '', ''],
          p.data,
          (s) => [
            s.id,
            s.session_id ?? '—',
            s.state,
            s.runtime,
            s.memory_bytes === null ? '—' : `${(s.memory_bytes / 1048576).toFixed(1)} MiB / ${s.limits.memoryMb} MiB`,
            s.cpu_percent === null ? '—' : `${s.cpu_percent.toFixed(1)} %`,
            when(s.last_used_at),
            h('span', { class: 'reclaim-at' }, when(s.reclaim_at)),
            s.session_id ? keepAlive(s.session_id, reload) : '',
            action('Kill', async () => void (await api('DELETE', `/v1/sandboxes/${s.id}`)), {
              confirm: `Kill sandbox ${s.id}? Its session loses its variables.`,
              after: reload,
              className: 'danger',
            }),
          ],
          'no live sandbox',
        ),
      { everyMs: EVERY_MS, dispose },
    ),
    panel(
      'workspaces',
      'Workspaces',
      () => api<List<Workspace>>('GET', '/v1/workspaces?limit=100'),
      (p) =>
        table(
          ['workspace', 'id', 'approval', 'created'],
          p.data,
          (w) => [link(`#/ws/${w.id}`, w.name), w.id, w.settings.approval.mode, when(w.created_at)],
          'no workspace yet',
        ),
      { everyMs: EVERY_MS * 5, dispose },
    ),
    panel(
      'usage',
      'Usage by workspace',
      () => api<{ data: UsageRow[] }>('GET', '/v1/usage?group_by=workspace'),
      (p) =>
        table(
          ['workspace', 'calls', 'prompt tokens', 'completion tokens'],
          p.data,
          (u) => [u.key, u.calls, u.prompt_tokens, u.completion_tokens],
          'no model calls yet',
        ),
      { everyMs: EVERY_MS * 5, dispose },
    ),
  );
}
