import { api } from '../api.ts';
import { h, replace, table } from '../dom.ts';
import { action, panel, type Dispose } from '../panel.ts';
import type { McpServer, Workspace } from '../types.ts';
import { refusal } from './webhooks.ts';

/** `${secrets.NAME}` in a header value (the API's syntax): the only part of a value ever shown. */
const SECRET_REF = /\$\{secrets\.([A-Z_][A-Z0-9_]{0,63})\}/g;

/**
 * A server's headers by name. Values are never shown (settings are readable by every key of the
 * team, and a value may be a credential someone pasted); a value that references workspace
 * secrets shows those references.
 */
function headerList(headers: Record<string, string>): HTMLElement | string {
  const names = Object.keys(headers).sort((a, b) => a.localeCompare(b));
  if (names.length === 0) return '—';
  return h(
    'ul',
    { class: 'headers' },
    ...names.map((name) => {
      const refs = [...(headers[name] ?? '').matchAll(SECRET_REF)].map((m) => m[0]);
      return h(
        'li',
        {},
        h('code', {}, name),
        refs.length
          ? h('span', { class: 'hint' }, ' from ', ...refs.flatMap((r, i) => [i ? ', ' : '', h('code', {}, r)]))
          : h('span', { class: 'hint' }, ' (value hidden)'),
      );
    }),
  );
}

/** `Name: value` lines as headers; a line that is not one is named. */
function parseHeaders(text: string): Record<string, string> {
  const headers: Record<string, string> = {};
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const at = line.indexOf(':');
    if (at <= 0) throw new Error(`headers, line ${i + 1}: write it as Name: value`);
    headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  });
  return headers;
}

/**
 * A workspace's MCP servers (settings.mcp_servers) with Remove, and a form that adds one. The API
 * replaces the whole list on a PATCH, so each change is made on the list as just read.
 */
export function mcpServersPanels(ws: string, dispose: Dispose[]): HTMLElement[] {
  const path = `/v1/workspaces/${encodeURIComponent(ws)}`;
  const current = async () => (await api<Workspace>('GET', path)).settings.mcp_servers ?? [];
  const save = (servers: McpServer[]) => api<Workspace>('PATCH', path, { settings: { mcp_servers: servers } });
  let reloadList: () => Promise<void> = async () => undefined;
  const list = panel(
    'mcp-servers',
    'MCP servers',
    current,
    (servers, reload) => {
      reloadList = reload;
      return h(
        'div',
        {},
        table(
          ['name', 'URL', 'headers', ''],
          servers,
          (s) => [
            h('strong', { 'data-mcp': s.name }, s.name),
            h('span', { class: 'url' }, s.url),
            headerList(s.headers),
            action(
              'Remove',
              async () => {
                await save((await current()).filter((x) => x.name !== s.name));
                return `${s.name} removed`;
              },
              { confirm: `Remove the MCP server ${s.name}? The agent no longer gets its tools.`, after: reload },
            ),
          ],
          'none: the agent has only its sandbox',
        ),
        h('p', { class: 'hint' }, 'Their tools are offered to the agent; each call passes the approval policy.'),
      );
    },
    { dispose },
  );
  const name = h('input', { id: 'mcp-name', placeholder: 'github', maxlength: '24', size: 16 });
  const url = h('input', { id: 'mcp-url', placeholder: 'https://example.com/mcp', size: 40 });
  const headers = h('textarea', {
    id: 'mcp-headers',
    rows: 2,
    spellcheck: 'false',
    // biome-ignore lint/suspicious/noTemplateCurlyInString: the API's syntax, shown as the example
    placeholder: 'Authorization: Bearer ${secrets.GITHUB_TOKEN}',
  });
  const note = h('div', { class: 'save-note' });
  const form: HTMLFormElement = h(
    'form',
    {
      id: 'mcp-form',
      class: 'update-form',
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        replace(note);
        try {
          const server = { name: name.value.trim(), url: url.value.trim(), headers: parseHeaders(headers.value) };
          await save([...(await current()), server]);
          form.reset();
          replace(note, h('span', { class: 'ok' }, `${server.name} added`));
          await reloadList();
        } catch (err) {
          replace(note, refusal(err));
        }
      },
    },
    h('label', {}, 'name (the namespace of its tools)', name),
    h('label', {}, 'URL (Streamable HTTP endpoint)', url),
    h(
      'label',
      {},
      // biome-ignore lint/suspicious/noTemplateCurlyInString: the API's syntax
      'headers, one Name: value a line (a credential as ${secrets.NAME}, a workspace secret)',
      headers,
    ),
    h('button', { type: 'submit' }, 'Add MCP server'),
    note,
  );
  return [
    list,
    h('section', { class: 'panel', id: 'mcp-add' }, h('header', {}, h('h2', {}, 'Add an MCP server')), form),
  ];
}
