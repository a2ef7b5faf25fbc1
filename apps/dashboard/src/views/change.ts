import { api, messageOf, statusOf } from '../api.ts';
import { diffView } from '../diff.ts';
import { h, replace, when, type Child } from '../dom.ts';
import { action, link, panel, type Dispose } from '../panel.ts';
import type { Commit, CommitWithDiff, Evolution } from '../types.ts';

const short = (sha: string | null) => (sha ? sha.slice(0, 10) : '—');
const enc = encodeURIComponent;
export const commitHref = (ws: string, sha: string) => `#/ws/${enc(ws)}/commits/${enc(sha)}`;
export const evolutionHref = (ws: string, id: string) => `#/ws/${enc(ws)}/evolutions/${enc(id)}`;

const back = (ws: string) => h('p', {}, link(`#/ws/${enc(ws)}`, '← workspace'));

/** A key/value list of a change's provenance: its git trailers, with links where they lead somewhere. */
function facts(rows: [string, Child][]): HTMLElement {
  return h('dl', { class: 'facts' }, ...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '—')]));
}

/**
 * Where a refused Revert or Undo is explained, on the page: a 409 means nothing was changed
 * because a later commit touched the same lines.
 */
function conflictBox(what: 'revert' | 'undo'): { box: HTMLElement; show: (err: unknown) => void } {
  const box = h('div', { class: 'conflict', role: 'alert', hidden: true });
  const show = (err: unknown) => {
    box.hidden = false;
    if (statusOf(err) !== 409) {
      replace(box, h('p', {}, messageOf(err)));
      return;
    }
    replace(
      box,
      h('strong', {}, `The ${what} was refused, and nothing was changed.`),
      h('p', {}, messageOf(err)),
      h(
        'p',
        {},
        'A later commit changed the same lines, so this change cannot be taken back on its own. ' +
          'Revert the later commits first (newest first), or edit the files by hand.',
      ),
    );
  };
  return { box, show };
}

/** One commit: its trailers, its patch file by file, and Revert. */
export function commitView(ws: string, sha: string, dispose: Dispose[]): HTMLElement {
  const base = `/v1/workspaces/${enc(ws)}`;
  const conflict = conflictBox('revert');
  return h(
    'div',
    { class: 'view' },
    back(ws),
    panel(
      'commit',
      `Commit ${short(sha)}`,
      () => api<CommitWithDiff>('GET', `${base}/commits/${enc(sha)}`),
      (c) =>
        h(
          'div',
          {},
          h('h3', { class: 'summary' }, c.summary),
          facts([
            ['sha', h('code', {}, c.sha)],
            ['kind', c.kind],
            ['author', c.author],
            ['session', c.session_id],
            ['run', c.run_id ? link(`#/runs/${enc(c.run_id)}`, c.run_id) : null],
            ['evolution', c.evolution_id ? link(evolutionHref(ws, c.evolution_id), c.evolution_id) : null],
            ['when', when(c.created_at)],
          ]),
          action(
            'Revert',
            async () => {
              const out = await api<{ commit: Commit | null }>('POST', `${base}/commits/${enc(c.sha)}/revert`);
              conflict.box.hidden = true;
              if (out.commit) location.hash = commitHref(ws, out.commit.sha);
              return `reverted as ${short(out.commit?.sha ?? null)}`;
            },
            { confirm: `Revert ${short(c.sha)} "${c.summary}" with a new commit?`, onError: conflict.show },
          ),
          conflict.box,
          diffView(c.diff, c.diff_truncated),
        ),
      { dispose },
    ),
  );
}

/** One evolution: what it decided (summary, diary, error), the patch of its commit, and Undo. */
export function evolutionView(ws: string, id: string, dispose: Dispose[]): HTMLElement {
  const base = `/v1/workspaces/${enc(ws)}`;
  const conflict = conflictBox('undo');
  const load = async () => {
    const e = await api<Evolution>('GET', `${base}/evolutions/${enc(id)}`);
    const commit = e.commit_sha ? await api<CommitWithDiff>('GET', `${base}/commits/${enc(e.commit_sha)}`) : null;
    return { e, commit };
  };
  return h(
    'div',
    { class: 'view' },
    back(ws),
    panel(
      'evolution',
      `Evolution ${id}`,
      load,
      ({ e, commit }, reload) =>
        h(
          'div',
          {},
          h('h3', { class: 'summary' }, e.summary ?? `${e.kind} (${e.status})`),
          facts([
            ['kind', e.kind],
            ['status', e.status],
            ['session', e.session_id],
            ['commit', e.commit_sha ? link(commitHref(ws, e.commit_sha), h('code', {}, short(e.commit_sha))) : null],
            ['files', e.changed_paths.join(', ') || null],
            ['started', when(e.created_at)],
            ['finished', when(e.finished_at)],
          ]),
          e.error ? h('p', { class: 'error' }, e.error) : null,
          e.diary ? h('details', { class: 'diary' }, h('summary', {}, 'Diary'), h('pre', {}, e.diary)) : null,
          e.commit_sha && e.status === 'committed'
            ? action(
                'Undo',
                async () => {
                  const out = await api<{ commit_sha: string }>('POST', `${base}/evolutions/${enc(e.id)}/undo`);
                  conflict.box.hidden = true;
                  return `undone as ${short(out.commit_sha)}`;
                },
                { confirm: `Undo ${e.kind} ${e.id} with a new commit?`, after: reload, onError: conflict.show },
              )
            : null,
          conflict.box,
          commit ? diffView(commit.diff, commit.diff_truncated) : h('p', { class: 'empty' }, 'it committed nothing'),
        ),
      { dispose },
    ),
  );
}
