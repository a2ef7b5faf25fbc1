import { api, getKey, isOrgAdminKey, messageOf } from '../api.ts';
import { h, replace, table, when } from '../dom.ts';
import { action, afterParam, pagedPanel, panel, type Dispose } from '../panel.ts';
import type { List, SandboxNode, Team, Update, Version } from '../types.ts';
import { webhooksPanels } from './webhooks.ts';

const short = (sha: string | null) => (sha ? sha.slice(0, 10) : '—');

/** An update's self-check, step by step, each with its log (head and tail, keys redacted). */
function checks(u: Update): HTMLElement {
  if (u.checks.length === 0) return h('p', { class: 'empty' }, u.status === 'checking' ? 'checking…' : 'no check ran');
  return h(
    'ol',
    { class: 'checks' },
    ...u.checks.map((c) =>
      h(
        'li',
        { class: c.ok ? 'ok' : 'failed' },
        h(
          'details',
          c.ok ? {} : { open: true },
          h('summary', {}, `${c.name}: ${c.ok ? 'passed' : 'failed'} in ${(c.duration_ms / 1000).toFixed(1)} s`),
          h('pre', { class: 'log' }, c.log || '(no output)'),
        ),
      ),
    ),
  );
}

/** Submit a patch to the platform's source: it is self-checked in the background. */
function submitForm(after: () => Promise<void>): HTMLElement {
  const patch = h('textarea', {
    id: 'update-patch',
    rows: 10,
    placeholder: 'a unified diff (git diff) against the source HEAD',
    spellcheck: 'false',
  });
  const reason = h('input', { id: 'update-reason', placeholder: 'why', maxlength: '4000', size: 60 });
  const note = h('p', { class: 'save-note', role: 'status' });
  const form = h(
    'form',
    {
      id: 'update-form',
      class: 'update-form',
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        try {
          const u = await api<Update>('POST', '/v1/system/updates', { patch: patch.value, reason: reason.value });
          replace(note, h('span', { class: 'ok' }, `submitted as ${u.id}: ${u.status}`));
          patch.value = '';
          reason.value = '';
          await after();
        } catch (err) {
          replace(note, h('span', { class: 'error', role: 'alert' }, messageOf(err)));
        }
      },
    },
    h('label', {}, 'patch', patch),
    h('label', {}, 'reason', reason),
    h('button', { type: 'submit' }, 'Submit for self-check'),
    note,
  );
  return form;
}

/** The running version and platform updates (org-admin matters: the API answers a team key 403). */
function platformPanels(dispose: Dispose[]): HTMLElement[] {
  let reloadUpdates: () => Promise<void> = async () => undefined;
  const updates = pagedPanel<Update>(
    'updates',
    'Platform updates',
    (after) => api<List<Update>>('GET', `/v1/system/updates?limit=20${afterParam(after)}`),
    (rows, reload) => {
      reloadUpdates = reload;
      if (rows.length === 0) return h('p', { class: 'empty' }, 'no update');
      return h(
        'ul',
        { class: 'updates' },
        ...rows.map((u) =>
          h(
            'li',
            { 'data-update': u.id },
            h(
              'div',
              { class: 'update-head' },
              h('strong', {}, u.id),
              h('span', { class: `status ${u.status}` }, u.status),
              h('span', {}, u.reason),
              h('code', {}, short(u.commit_sha)),
              h('span', { class: 'hint' }, when(u.created_at)),
              u.status === 'ready'
                ? action(
                    'Apply',
                    async () => `${(await api<Update>('POST', `/v1/system/updates/${u.id}/apply`)).status}`,
                    {
                      confirm: `Apply ${u.id}? The server restarts into the new source.`,
                      after: reload,
                    },
                  )
                : null,
              u.status === 'applied'
                ? action(
                    'Revert',
                    async () => `submitted ${(await api<Update>('POST', `/v1/system/updates/${u.id}/revert`)).id}`,
                    { confirm: `Submit the reverse of ${u.id} for its self-check?`, after: reload },
                  )
                : null,
            ),
            u.changed_paths.length ? h('p', { class: 'paths' }, u.changed_paths.join(', ')) : null,
            u.error ? h('p', { class: 'error' }, u.error) : null,
            checks(u),
          ),
        ),
      );
    },
    { everyMs: 5000, dispose },
  );
  const nodes = panel(
    'nodes',
    'Sandbox nodes',
    () => api<{ data: SandboxNode[] }>('GET', '/v1/system/nodes'),
    ({ data }, reload) =>
      table(
        [
          'node',
          'state',
          'heard',
          'memory (placed / capacity)',
          'CPUs',
          'sandboxes',
          'runtimes',
          'template images',
          'last heard',
          '',
        ],
        data,
        (n) => [
          h('strong', {}, n.name),
          h('span', { class: `status ${n.state}` }, n.state),
          h('span', { class: n.health === 'heard' ? 'ok' : 'error' }, n.health),
          `${n.committed.memory_mb} / ${n.capacity.memory_mb} MB`,
          `${n.committed.cpus} / ${n.capacity.cpus}`,
          String(n.sandboxes),
          n.runtimes.map((r) => `${r.runtime}${r.egress ? ' (egress)' : ''}`).join(', ') || '—',
          h('span', { title: n.images.join('\n') }, String(n.images.length)),
          n.last_heard_at ? when(n.last_heard_at) : 'never',
          n.state === 'active'
            ? action(
                'Drain',
                async () => `${(await api<SandboxNode>('POST', `/v1/system/nodes/${n.name}/drain`)).state}`,
                {
                  confirm: `Drain ${n.name}? It takes no new sandboxes; the ones it has end as usual.`,
                  after: reload,
                },
              )
            : action(
                'Remove',
                async () => `removed ${(await api<SandboxNode>('DELETE', `/v1/system/nodes/${n.name}`)).name}`,
                {
                  confirm: `Forget ${n.name}? Only a drained node with no sandboxes left can be removed.`,
                  after: reload,
                },
              ),
        ],
        'no sandbox node: sandboxes run on this server’s own Docker Engine (docs/scaling.md)',
      ),
    { everyMs: 5000, dispose },
  );
  return [
    nodes,
    panel(
      'version',
      'Running version',
      () => api<Version>('GET', '/v1/system/version'),
      (v) => h('p', {}, `commit ${v.commit ?? '—'} on ${v.branch ?? '—'} · pid ${v.pid} · since ${when(v.started_at)}`),
      { dispose },
    ),
    updates.box,
    h(
      'section',
      { class: 'panel', id: 'update-submit' },
      h('header', {}, h('h2', {}, 'Submit a platform update')),
      submitForm(() => reloadUpdates()),
    ),
  ];
}

/** Teams, the running version and platform updates: org-admin matters (a team key sees its own team and its webhooks). */
export function adminView(dispose: Dispose[]): HTMLElement {
  const admin = isOrgAdminKey(getKey());
  return h(
    'div',
    { class: 'view' },
    pagedPanel<Team>(
      'teams',
      'Teams',
      (after) => api<List<Team>>('GET', `/v1/teams?limit=20${afterParam(after)}`),
      (rows) => table(['team', 'id', 'created'], rows, (t) => [t.name, t.id, when(t.created_at)]),
      { dispose },
    ).box,
    // Webhooks are a team's: an org-admin key cannot act for a team (the API answers it 403), and
    // the version and platform updates are org-admin matters (a team key is answered 403).
    ...(admin
      ? [
          h(
            'p',
            { class: 'hint', id: 'webhooks-hint' },
            'Webhooks belong to a team: sign in with a team key to manage them.',
          ),
          ...platformPanels(dispose),
        ]
      : webhooksPanels(dispose)),
  );
}
