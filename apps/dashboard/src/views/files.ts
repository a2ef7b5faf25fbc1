import { api, apiRaw, messageOf } from '../api.ts';
import { h, replace, type Child } from '../dom.ts';
import { renderMarkdown } from '../markdown.ts';
import { flash, link, panel, type Dispose } from '../panel.ts';

interface Entry {
  name: string;
  path: string;
  type: 'file' | 'dir';
  size: number;
}
type Listing = { path: string; type: 'dir'; entries: Entry[] };
type FileBody = { path: string; type: 'file'; size: number; encoding: 'utf-8' | 'base64'; content: string };
interface MemoryUsage {
  entries: number;
  bytes: number;
  max_entries: number;
  max_bytes: number;
}
interface Skill {
  name: string;
  description: string;
  path: string;
  builtin: boolean;
}
interface Hit {
  path: string;
  start_line: number;
  end_line: number;
  snippet: string;
  heading: string | null;
}
interface Outcome {
  commit: { sha: string } | null;
  redactions: { path: string; line: number; type: string }[];
  refused: { path: string; reason: string }[];
}

const enc = encodeURIComponent;
/** The console's address of a workspace file (or folder), optionally at a line. */
export const fileHref = (ws: string, path: string, line?: number) =>
  `#/ws/${enc(ws)}/files/${path.split('/').map(enc).join('/')}${line ? `?line=${line}` : ''}`;

/** The prompt and memory files a person edits most, offered at the top. */
const EDITABLE_HINT = ['AGENT.md', 'RULE.md', 'USER.md', 'MEMORY.md'];

/** One level of the tree; a folder opens (and loads) when it is clicked. */
function treeLevel(base: string, ws: string, dir: string, current: string): HTMLElement {
  const list = h('ul', { class: 'tree' }, h('li', { class: 'loading' }, 'loading…'));
  void api<Listing>('GET', `${base}/files?path=${enc(dir)}`).then(
    (l) => {
      const dirs = l.entries.filter((e) => e.type === 'dir').sort((a, b) => a.name.localeCompare(b.name));
      const files = l.entries.filter((e) => e.type === 'file').sort((a, b) => a.name.localeCompare(b.name));
      replace(
        list,
        ...dirs.map((d) => {
          const open = current.startsWith(`${d.path}/`);
          const item = h('details', open ? { open: true } : {}, h('summary', {}, `${d.name}/`));
          let loaded = false;
          const load = () => {
            if (loaded) return;
            loaded = true;
            item.append(treeLevel(base, ws, d.path, current));
          };
          if (open) load();
          item.addEventListener('toggle', load);
          return h('li', { class: 'dir' }, item);
        }),
        ...files.map((f) =>
          h('li', { class: f.path === current ? 'file current' : 'file' }, link(fileHref(ws, f.path), f.name)),
        ),
      );
    },
    (err) => replace(list, h('li', { class: 'error' }, messageOf(err))),
  );
  return list;
}

const isMarkdown = (path: string) => /\.(md|markdown)$/i.test(path);

/** A text file's lines, numbered, each a text node; `line` is marked and scrolled to. */
function numbered(text: string, line: number | undefined): HTMLElement {
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  const pre = h(
    'pre',
    { class: 'lines' },
    ...lines.map((l, i) =>
      h('span', { class: i + 1 === line ? 'ln hl' : 'ln', 'data-line': i + 1 }, h('i', {}, String(i + 1)), `${l}\n`),
    ),
  );
  if (line) requestAnimationFrame(() => pre.querySelector('.hl')?.scrollIntoView({ block: 'center' }));
  return pre;
}

/** What the API said about a save: the commit, or why nothing (or not everything) was committed. */
function outcomeNote(o: Outcome): Child[] {
  return [
    h('p', { class: 'ok' }, o.commit ? `saved as commit ${o.commit.sha.slice(0, 10)}` : 'unchanged: nothing to commit'),
    ...o.redactions.map((r) =>
      h('p', { class: 'warn' }, `a secret (${r.type}) on line ${r.line} was replaced by [REDACTED:${r.type}]`),
    ),
    ...o.refused.map((r) => h('p', { class: 'error' }, `${r.path} was not committed: ${r.reason}`)),
  ];
}

/** One file: rendered (Markdown, sanitised) or as text, with its budget if it is MEMORY.md, and an editor. */
function fileView(base: string, ws: string, path: string, line: number | undefined, dispose: Dispose[]) {
  let mode: 'rendered' | 'text' = isMarkdown(path) && !line ? 'rendered' : 'text';
  const note = h('div', { class: 'save-note', role: 'status' });
  return panel(
    'file',
    path,
    async () => ({
      file: await api<FileBody | Listing>('GET', `${base}/files?path=${enc(path)}`),
      usage: path === 'MEMORY.md' ? await api<MemoryUsage>('GET', `${base}/memory`) : null,
    }),
    ({ file, usage }, reload) => {
      // A folder's address (#/ws/…/files/knowledge): its entries, each a link, not a file's view.
      if (file.type === 'dir')
        return h(
          'ul',
          { class: 'tree' },
          ...(file.entries.length
            ? file.entries.map((e) =>
                h('li', { class: e.type }, link(fileHref(ws, e.path), e.type === 'dir' ? `${e.name}/` : e.name)),
              )
            : [h('li', { class: 'empty' }, 'an empty folder')]),
        );
      const body = h('div', { class: 'file-body' });
      const show = () => {
        if (file.encoding === 'base64') replace(body, h('p', { class: 'empty' }, `binary file, ${file.size} bytes`));
        else if (mode === 'rendered')
          replace(
            body,
            h(
              'div',
              { class: 'markdown' },
              renderMarkdown(file.content, path, (p) => fileHref(ws, p)),
            ),
          );
        else replace(body, numbered(file.content, line));
      };
      const toggle = isMarkdown(path)
        ? h(
            'button',
            {
              type: 'button',
              class: 'mode',
              onclick: (ev: Event) => {
                mode = mode === 'rendered' ? 'text' : 'rendered';
                (ev.target as HTMLButtonElement).textContent = mode === 'rendered' ? 'Show text' : 'Show rendered';
                show();
              },
            },
            mode === 'rendered' ? 'Show text' : 'Show rendered',
          )
        : null;
      const edit =
        file.encoding === 'utf-8'
          ? h(
              'button',
              {
                type: 'button',
                class: 'edit',
                onclick: () => {
                  const area = h('textarea', { class: 'editor', spellcheck: 'false', rows: 24 });
                  area.value = file.content;
                  const save = h(
                    'button',
                    {
                      type: 'button',
                      class: 'save',
                      onclick: async () => {
                        save.disabled = true;
                        try {
                          const o = await apiRaw<Outcome>('PUT', `${base}/files?path=${enc(path)}`, area.value);
                          replace(note, ...outcomeNote(o));
                          replace(flash);
                          await reload();
                        } catch (err) {
                          replace(note, h('p', { class: 'error', role: 'alert' }, messageOf(err)));
                        } finally {
                          save.disabled = false;
                        }
                      },
                    },
                    'Save',
                  );
                  const cancel = h('button', { type: 'button', onclick: () => show() }, 'Cancel');
                  replace(body, area, h('div', { class: 'editor-actions' }, save, cancel));
                  area.focus();
                },
              },
              'Edit',
            )
          : null;
      show();
      return h(
        'div',
        {},
        h(
          'p',
          { class: 'file-meta' },
          `${file.size} bytes`,
          usage
            ? h(
                'span',
                { class: 'budget' },
                ` · budget: ${usage.entries} of ${usage.max_entries} entries, ${usage.bytes} of ${usage.max_bytes} bytes`,
              )
            : null,
        ),
        h('div', { class: 'file-actions' }, toggle, edit),
        note,
        body,
      );
    },
    { dispose },
  );
}

/** Core memory, the skills and a memory search: what the agent knows, at a glance. */
function knowledgeView(base: string, ws: string, dispose: Dispose[]): HTMLElement[] {
  const results = h('div', { class: 'hits' });
  const q = h('input', {
    type: 'search',
    name: 'q',
    id: 'memory-q',
    placeholder: 'search memory, logs, knowledge, skills',
    maxlength: '500',
  });
  const search = h(
    'form',
    {
      class: 'search',
      id: 'memory-search',
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        if (!q.value.trim()) return;
        try {
          const r = await api<{ data: Hit[] }>('GET', `${base}/memory/search?q=${enc(q.value.trim())}&k=20`);
          replace(
            results,
            r.data.length === 0
              ? h('p', { class: 'empty' }, 'nothing matches')
              : h(
                  'ol',
                  {},
                  ...r.data.map((hit) =>
                    h(
                      'li',
                      {},
                      link(fileHref(ws, hit.path, hit.start_line), `${hit.path}:${hit.start_line}`),
                      hit.heading ? h('span', { class: 'heading' }, ` — ${hit.heading}`) : null,
                      h('pre', { class: 'snippet' }, hit.snippet),
                    ),
                  ),
                ),
          );
        } catch (err) {
          replace(results, h('p', { class: 'error', role: 'alert' }, messageOf(err)));
        }
      },
    },
    q,
    h('button', { type: 'submit' }, 'Search'),
  );
  return [
    panel(
      'memory',
      'Core memory',
      () => api<MemoryUsage>('GET', `${base}/memory`),
      (u) =>
        h(
          'p',
          {},
          link(fileHref(ws, 'MEMORY.md'), 'MEMORY.md'),
          ` uses ${u.entries} of ${u.max_entries} entries and ${u.bytes} of ${u.max_bytes} bytes. `,
          'Prompt files: ',
          ...EDITABLE_HINT.flatMap((p, i) => [i ? ', ' : '', link(fileHref(ws, p), p)]),
        ),
      { dispose },
    ),
    h('section', { class: 'panel', id: 'search' }, h('header', {}, h('h2', {}, 'Memory search')), search, results),
    panel(
      'skills',
      'Skills',
      () => api<{ data: Skill[] }>('GET', `${base}/skills`),
      (s) =>
        s.data.length === 0
          ? h('p', { class: 'empty' }, 'no skill yet')
          : h(
              'ul',
              { class: 'skills' },
              ...s.data.map((k) =>
                h(
                  'li',
                  {},
                  link(fileHref(ws, k.path), k.name),
                  k.builtin ? h('span', { class: 'badge' }, 'built-in') : null,
                  h('span', { class: 'desc' }, ` — ${k.description}`),
                ),
              ),
            ),
      { dispose },
    ),
  ];
}

/** A workspace's files: the tree beside a file (or, at the top, memory, search and skills). */
export function filesView(ws: string, path: string, line: number | undefined, dispose: Dispose[]): HTMLElement {
  const base = `/v1/workspaces/${enc(ws)}`;
  const main = path ? [fileView(base, ws, path, line, dispose)] : knowledgeView(base, ws, dispose);
  return h(
    'div',
    { class: 'view' },
    h('p', {}, link(`#/ws/${enc(ws)}`, '← workspace'), ' · ', link(fileHref(ws, ''), 'files')),
    h(
      'div',
      { class: 'files' },
      h(
        'section',
        { class: 'panel tree-panel', id: 'tree' },
        h('header', {}, h('h2', {}, 'Files')),
        treeLevel(base, ws, '', path),
      ),
      h('div', { class: 'file-main' }, ...main),
    ),
  );
}
