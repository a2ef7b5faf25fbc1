import { api } from '../api.ts';
import { h, table, when } from '../dom.ts';
import { action, afterParam, link, pagedPanel, panel, type Dispose } from '../panel.ts';
import type { Commit, Evolution, List, Run, Session, Workspace } from '../types.ts';
import { commitHref, evolutionHref } from './change.ts';
import { chatHref } from './chat.ts';
import { fileHref } from './files.ts';
import { mcpServersPanels } from './mcp-servers.ts';
import { runsTable } from './overview.ts';

const EVERY_MS = 5000;
const short = (sha: string | null) => (sha ? sha.slice(0, 10) : '—');

/** One workspace: its MCP servers, its runs and sessions, its history with Revert, its evolutions with Undo. */
export function workspaceView(ws: string, dispose: Dispose[]): HTMLElement {
  const base = `/v1/workspaces/${encodeURIComponent(ws)}`;
  const reloadAll: (() => Promise<void>)[] = [];
  const refreshAll = async () => void (await Promise.all(reloadAll.map((f) => f())));
  const remember = (reload: () => Promise<void>) => reloadAll.includes(reload) || reloadAll.push(reload);
  return h(
    'div',
    { class: 'view' },
    panel(
      'workspace',
      'Workspace',
      () => api<Workspace>('GET', base),
      (w) =>
        h(
          'div',
          {},
          h('h3', { class: 'ws-name' }, w.name),
          h(
            'p',
            {},
            link(fileHref(ws, ''), 'Files, memory and skills'),
            ' · ',
            link(chatHref(ws), 'Chat with its agent'),
          ),
          h(
            'p',
            {},
            `${w.id} · HEAD ${short(w.head)} · approval ${w.settings.approval.mode} · protocol ${w.settings.protocol}`,
          ),
          action(
            'Request a review',
            async () => `review ${(await api<Evolution>('POST', `${base}/review`, {})).id} queued`,
            { after: refreshAll },
          ),
          action(
            'Request a dream',
            async () => `dream ${(await api<Evolution>('POST', `${base}/dream`, {})).id} queued`,
            { after: refreshAll },
          ),
        ),
      { dispose },
    ),
    pagedPanel<Run>(
      'ws-runs',
      'Runs',
      (after) => api<List<Run>>('GET', `/v1/runs?workspace=${encodeURIComponent(ws)}&limit=20${afterParam(after)}`),
      (rows) => runsTable(rows, 'no run yet'),
      { everyMs: EVERY_MS, dispose, actions: [link(`#/runs?workspace=${encodeURIComponent(ws)}`, 'filter…')] },
    ).box,
    pagedPanel<Session>(
      'sessions',
      'Sessions',
      (after) => api<List<Session>>('GET', `${base}/sessions?limit=20${afterParam(after)}`),
      (rows) =>
        table(
          ['session', 'title', 'status', 'last activity', ''],
          rows,
          (s) => [
            s.id,
            s.title ?? '—',
            s.status,
            when(s.last_activity_at),
            h(
              'span',
              {},
              link(chatHref(ws, s.id), 'chat'),
              ' · ',
              link(`#/runs?session=${encodeURIComponent(s.id)}`, 'runs'),
            ),
          ],
          'no session yet',
        ),
      { everyMs: EVERY_MS, dispose },
    ).box,
    pagedPanel<Commit>(
      'commits',
      'Commits',
      (after) => api<List<Commit>>('GET', `${base}/commits?limit=20${afterParam(after)}`),
      (rows, reload) => {
        remember(reload);
        return table(
          ['commit', 'kind', 'author', 'message', 'files', 'when', ''],
          rows,
          (c) => [
            link(commitHref(ws, c.sha), h('code', {}, short(c.sha))),
            c.kind,
            c.author,
            c.summary,
            c.paths.join(', '),
            when(c.created_at),
            action(
              'Revert',
              async () =>
                `reverted as ${short((await api<{ commit: Commit | null }>('POST', `${base}/commits/${c.sha}/revert`)).commit?.sha ?? null)}`,
              {
                confirm: `Revert ${short(c.sha)} "${c.summary}" with a new commit?`,
                after: refreshAll,
              },
            ),
          ],
          'no commit',
        );
      },
      { everyMs: EVERY_MS, dispose },
    ).box,
    pagedPanel<Evolution>(
      'evolutions',
      'Evolutions',
      (after) => api<List<Evolution>>('GET', `${base}/evolutions?limit=20${afterParam(after)}`),
      (rows, reload) => {
        remember(reload);
        return table(
          ['evolution', 'kind', 'status', 'summary', 'commit', 'when', ''],
          rows,
          (e) => [
            link(evolutionHref(ws, e.id), e.id),
            e.kind,
            e.status,
            e.summary ?? '—',
            h('code', {}, short(e.commit_sha)),
            when(e.created_at),
            e.commit_sha && e.status === 'committed'
              ? action(
                  'Undo',
                  async () =>
                    `undone as ${short((await api<{ commit_sha: string }>('POST', `${base}/evolutions/${e.id}/undo`)).commit_sha)}`,
                  {
                    confirm: `Undo ${e.kind} ${e.id} with a new commit?`,
                    after: refreshAll,
                  },
                )
              : null,
          ],
          'no evolution yet',
        );
      },
      { everyMs: EVERY_MS, dispose },
    ).box,
    ...mcpServersPanels(ws, dispose),
  );
}
