import './style.css';
import { api, clearKey, getKey, isOrgAdminKey, messageOf, setKey } from './api.ts';
import { h, replace } from './dom.ts';
import { flash, type Dispose } from './panel.ts';
import { adminView } from './views/admin.ts';
import { auditView } from './views/audit.ts';
import { commitView, evolutionView } from './views/change.ts';
import { chatView } from './views/chat.ts';
import { filesView } from './views/files.ts';
import { overview } from './views/overview.ts';
import { runView } from './views/run.ts';
import { runsView } from './views/runs.ts';
import { webhookView } from './views/webhooks.ts';
import { workspaceView } from './views/workspace.ts';

const root = document.getElementById('app')!;
let dispose: Dispose[] = [];

/** The first screen: the key is checked against the API before it is kept (in this tab only). */
function signIn(): HTMLElement {
  const input = h('input', {
    id: 'key',
    type: 'password',
    name: 'key',
    autocomplete: 'off',
    placeholder: 'kiln_…',
    required: true,
    size: 60,
  });
  const error = h('p', { class: 'error', role: 'alert' });
  const form = h(
    'form',
    {
      class: 'signin',
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        replace(error);
        const key = input.value.trim();
        try {
          await api('GET', '/v1/teams', undefined, key);
          setKey(key);
          render();
        } catch (err) {
          replace(error, messageOf(err));
        }
      },
    },
    h('h1', {}, 'Kiln ops'),
    h('p', {}, 'Paste an API key. It stays in this browser tab (sessionStorage) until you sign out.'),
    input,
    h('button', { type: 'submit' }, 'Sign in'),
    error,
  );
  return form;
}

function viewFor(hash: string): HTMLElement {
  const [route, search = ''] = hash.replace(/^#/, '').split('?');
  const [, name, id, sub, subId, ...rest] = route!.split('/');
  if (name === 'ws' && id && sub === 'files') {
    const path = [subId, ...rest]
      .filter((x): x is string => Boolean(x))
      .map(decodeURIComponent)
      .join('/');
    const line = Number(new URLSearchParams(search).get('line')) || undefined;
    return filesView(decodeURIComponent(id), path, line, dispose);
  }
  if (name === 'runs' && !id) return runsView(dispose, new URLSearchParams(search));
  if (name === 'chat') return chatView(id && decodeURIComponent(id), sub && decodeURIComponent(sub), dispose);
  if (name === 'ws' && id && sub === 'commits' && subId)
    return commitView(decodeURIComponent(id), decodeURIComponent(subId), dispose);
  if (name === 'ws' && id && sub === 'evolutions' && subId)
    return evolutionView(decodeURIComponent(id), decodeURIComponent(subId), dispose);
  if (name === 'ws' && id) return workspaceView(decodeURIComponent(id), dispose);
  if (name === 'runs' && id) return runView(decodeURIComponent(id), dispose);
  if (name === 'webhooks' && id) return webhookView(decodeURIComponent(id), dispose);
  if (name === 'audit') return auditView(dispose);
  if (name === 'admin') return adminView(dispose);
  return overview(dispose);
}

function render(): void {
  for (const d of dispose) d();
  dispose = [];
  const key = getKey();
  if (!key) {
    replace(root, signIn());
    return;
  }
  const nav = h(
    'nav',
    {},
    h('strong', {}, 'Kiln ops'),
    h('a', { href: '#/' }, 'Overview'),
    h('a', { href: '#/runs' }, 'Runs'),
    h('a', { href: '#/chat' }, 'Chat'),
    h('a', { href: '#/audit' }, 'Audit'),
    h('a', { href: '#/admin' }, isOrgAdminKey(key) ? 'Teams, nodes & updates' : 'Team & webhooks'),
    h('span', { class: 'who' }, isOrgAdminKey(key) ? 'org-admin key' : 'team key', ` ${key.slice(0, 14)}…`),
    h(
      'button',
      {
        type: 'button',
        id: 'signout',
        onclick: () => {
          clearKey();
          location.hash = '#/';
          render();
        },
      },
      'Sign out',
    ),
  );
  const hint = isOrgAdminKey(key)
    ? h(
        'p',
        { class: 'hint' },
        'An org-admin key manages teams, sandbox nodes and platform updates; runs, approvals, sandboxes and workspaces need a team key.',
      )
    : null;
  replace(flash);
  replace(root, nav, hint, flash, h('main', {}, viewFor(location.hash)));
}

window.addEventListener('hashchange', render);
render();
