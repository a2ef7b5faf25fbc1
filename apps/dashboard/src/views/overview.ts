import { api } from '../api.ts';
import { h, table, when } from '../dom.ts';
import { action, afterParam, link, pagedPanel, panel, type Dispose } from '../panel.ts';
import { dayChart, type DayPoint } from '../chart.ts';
import type { Approval, DailyUsage, List, Run, Sandbox, UsageRow, Workspace } from '../types.ts';

const EVERY_MS = 3000;
const IN_FLIGHT = 'queued,in_progress,requires_action';

/** Pushes a session's sandbox's idle deadline forward by its workspace's idle time. */
const keepAlive = (sessionId: string, reload: () => Promise<void>) =>
  action('Keep alive', async () => void (await api('POST', `/v1/sessions/${sessionId}/keepalive`)), {
    after: reload,
  });

/**
 * What can be done with a session's sandbox now: a paused one resumed; a running gVisor one kept
 * alive or paused to disk (its variables kept); any other kept alive.
 */
export const sandboxActions = (s: Sandbox, reload: () => Promise<void>) => {
  if (!s.session_id) return '';
  const session = s.session_id;
  if (s.state === 'paused')
    return action('Resume', async () => void (await api('POST', `/v1/sessions/${session}/resume`)), {
      after: reload,
    });
  if (s.state === 'resuming' || s.state === 'starting') return '';
  const pause =
    s.runtime === 'gvisor'
      ? action('Pause', async () => void (await api('POST', `/v1/sessions/${session}/pause`)), { after: reload })
      : '';
  return h('span', {}, keepAlive(session, reload), ' ', pause);
};

const mib = (bytes: number) => `${(bytes / 1048576).toFixed(1)} MiB`;

/** A sandbox's memory now, or, paused, its checkpoint on disk. */
const sandboxMemory = (s: Sandbox) =>
  s.state === 'paused'
    ? s.checkpoint_bytes === null
      ? 'on disk'
      : `${mib(s.checkpoint_bytes)} on disk`
    : s.memory_bytes === null
      ? '—'
      : `${mib(s.memory_bytes)} / ${s.limits.memoryMb} MiB`;

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

/** Every day from `from` to `to` (YYYY-MM-DD, UTC), both included. */
function daysBetween(from: string, to: string): string[] {
  const out: string[] = [];
  for (let t = Date.parse(`${from}T00:00:00Z`); t <= Date.parse(`${to}T00:00:00Z`); t += 86_400_000)
    out.push(new Date(t).toISOString().slice(0, 10));
  return out;
}

/** Each workspace's totals, its runs over the period and a chart of its tokens and runs per day. */
function usageTable(totals: UsageRow[], daily: DailyUsage, names: Map<string, string>): HTMLElement {
  const days = daysBetween(daily.from, daily.to);
  const byWs = new Map<string, Map<string, DayPoint>>();
  for (const d of daily.data) {
    const points = byWs.get(d.workspace_id) ?? new Map<string, DayPoint>();
    points.set(d.day, { day: d.day, tokens: d.prompt_tokens + d.completion_tokens, runs: d.runs });
    byWs.set(d.workspace_id, points);
  }
  const keys = [...new Set([...totals.map((u) => u.key), ...byWs.keys()])].sort();
  const total = new Map(totals.map((u) => [u.key, u]));
  return table(
    ['workspace', 'calls', 'prompt tokens', 'completion tokens', 'runs (14 d)', 'tokens and runs per day'],
    keys,
    (ws) => {
      const t = total.get(ws);
      const points = byWs.get(ws) ?? new Map<string, DayPoint>();
      const runs = [...points.values()].reduce((n, p) => n + p.runs, 0);
      return [
        link(`#/ws/${ws}`, names.get(ws) ?? ws),
        t?.calls ?? 0,
        t?.prompt_tokens ?? 0,
        t?.completion_tokens ?? 0,
        runs,
        dayChart(days, points, `tokens and runs per day of ${ws}, ${daily.from} to ${daily.to}`),
      ];
    },
    'no model calls yet',
  );
}

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
    pagedPanel<Run>(
      'runs',
      'Runs in flight',
      (after) => api<List<Run>>('GET', `/v1/runs?status=${IN_FLIGHT}&limit=20${afterParam(after)}`),
      (rows) => runsTable(rows, 'no run in flight'),
      { everyMs: EVERY_MS, dispose },
    ).box,
    pagedPanel<Approval>(
      'approvals',
      'Pending approvals',
      (after) => api<List<Approval>>('GET', `/v1/approvals?status=pending&limit=20${afterParam(after)}`),
      (rows, reload) =>
        rows.length === 0
          ? h('p', { class: 'empty' }, 'nothing waits for approval')
          : h(
              'ul',
              { class: 'approvals' },
              ...rows.map((a) =>
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
    ).box,
    panel(
      'sandboxes',
      'Sandboxes',
      () => api<List<Sandbox>>('GET', '/v1/sandboxes'),
      (p, reload) =>
        table(
          ['sandbox', 'session', 'state', 'runtime', 'image', 'memory', 'CPU', 'last used', 'reclaimed at', '', ''],
          p.data,
          (s) => [
            s.id,
            s.session_id ?? '—',
            // One word, never broken in a narrow cell ("pau sed").
            h('span', { class: 'nowrap' }, s.state),
            s.runtime,
            h('code', { class: 'image' }, s.image),
            sandboxMemory(s),
            s.cpu_percent === null ? '—' : `${s.cpu_percent.toFixed(1)} %`,
            when(s.last_used_at),
            // Paused: when its checkpoint is deleted.
            h('span', { class: 'reclaim-at' }, when(s.state === 'paused' ? s.expires_at : s.reclaim_at)),
            sandboxActions(s, reload),
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
    pagedPanel<Workspace>(
      'workspaces',
      'Workspaces',
      (after) => api<List<Workspace>>('GET', `/v1/workspaces?limit=20${afterParam(after)}`),
      (rows) =>
        table(
          ['workspace', 'id', 'approval', 'created'],
          rows,
          (w) => [link(`#/ws/${w.id}`, w.name), w.id, w.settings.approval.mode, when(w.created_at)],
          'no workspace yet',
        ),
      { everyMs: EVERY_MS * 5, dispose },
    ).box,
    panel(
      'usage',
      'Usage by workspace (last 14 days)',
      async () => ({
        totals: await api<{ data: UsageRow[] }>('GET', '/v1/usage?group_by=workspace'),
        daily: await api<DailyUsage>('GET', '/v1/usage/daily?days=14'),
        names: await api<List<Workspace>>('GET', '/v1/workspaces?limit=100'),
      }),
      ({ totals, daily, names }) => usageTable(totals.data, daily, new Map(names.data.map((w) => [w.id, w.name]))),
      { everyMs: EVERY_MS * 5, dispose },
    ),
  );
}
