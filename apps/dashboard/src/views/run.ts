import { api, authHeaders, messageOf } from '../api.ts';
import { h, replace, when } from '../dom.ts';
import { action, link, panel, type Dispose } from '../panel.ts';
import { followRun, type RunEvent } from '../sse.ts';
import type { EgressRow, List, Run, Sandbox } from '../types.ts';
import { sandboxActions } from './overview.ts';

const TERMINAL = new Set(['run.completed', 'run.failed', 'run.cancelled']);

/** How much of a tool's result the page shows before "show all" (the API keeps up to 16,000 characters). */
const EXCERPT = 1500;

const str = (v: unknown) => (typeof v === 'string' ? v : v === undefined || v === null ? '' : JSON.stringify(v));

/** A long text as its head, the rest one click away (all of it as text). */
function excerpt(text: string, className: string): HTMLElement {
  if (text.length <= EXCERPT) return h('pre', { class: className }, text);
  return h(
    'div',
    {},
    h('pre', { class: className }, `${text.slice(0, EXCERPT)}…`),
    h('details', {}, h('summary', {}, `show all ${text.length} characters`), h('pre', { class: className }, text)),
  );
}

/**
 * An MCP tool call (`tool.call`: server.tool, the policy's decision, the arguments) or its result
 * (`tool.result`: duration, error, an excerpt of what it answered), or null for other events.
 * Everything in them came from the model or a tenant's server: it is only ever text.
 */
export function toolBlock(ev: RunEvent): HTMLElement | null {
  if (ev.event !== 'tool.call' && ev.event !== 'tool.result') return null;
  const d = (ev.data ?? {}) as Record<string, unknown>;
  const name = h('strong', { class: 'tool-name' }, `${str(d.server)}.${str(d.tool)}`);
  if (ev.event === 'tool.call') {
    const decision = str(d.decision);
    return h(
      'div',
      { class: 'tool call' },
      h(
        'p',
        { class: 'tool-head' },
        name,
        ' ',
        h('span', { class: `decision ${decision}` }, decision || 'no decision'),
      ),
      excerpt(JSON.stringify(d.arguments ?? {}, null, 2), 'args'),
    );
  }
  const failed = Boolean(d.is_error) || typeof d.error === 'string';
  const content = str(d.content);
  return h(
    'div',
    { class: `tool result${failed ? ' failed' : ''}` },
    h(
      'p',
      { class: 'tool-head' },
      name,
      h('span', { class: 'duration' }, ` · ${typeof d.duration_ms === 'number' ? d.duration_ms : '?'} ms`),
      failed ? h('span', { class: 'status failed' }, ' · error') : null,
      d.truncated ? h('span', { class: 'hint' }, ' · cut by the server') : null,
    ),
    typeof d.error === 'string' ? h('p', { class: 'error tool-error' }, d.error) : null,
    content
      ? excerpt(content, 'result')
      : typeof d.error === 'string'
        ? null
        : h('p', { class: 'hint' }, '(no content)'),
  );
}

/** The readable part of an event: output text, code, thinking, a tool call; otherwise its data as JSON. */
function eventText(ev: RunEvent): string {
  const d = (ev.data ?? {}) as Record<string, unknown>;
  for (const k of ['data', 'code', 'text', 'content', 'summary', 'message'])
    if (typeof d[k] === 'string') return d[k] as string;
  return JSON.stringify(ev.data);
}

/** An execution's requests through the egress proxy (sandbox.network allowlist), allowed and refused. */
export function egressTable(ev: RunEvent): HTMLElement | null {
  const rows = ((ev.data ?? {}) as { egress?: EgressRow[] }).egress;
  if (ev.event !== 'exec.completed' || !rows?.length) return null;
  return h(
    'table',
    { class: 'egress' },
    h('tr', {}, ...['network', 'host', 'method', 'status', 'sent', 'received'].map((c) => h('th', {}, c))),
    ...rows.map((r) =>
      h(
        'tr',
        { class: r.allowed ? 'allowed' : 'refused' },
        h('td', {}, r.allowed ? 'allowed' : 'refused'),
        h('td', {}, `${r.host}:${r.port}`),
        h('td', {}, r.method),
        h('td', {}, String(r.status)),
        h('td', {}, String(r.bytes_out)),
        h('td', {}, String(r.bytes_in)),
      ),
    ),
  );
}

/**
 * Follows a run's events (SSE, resumed after a drop with Last-Event-ID) until it ends or the view
 * goes; `state` shows the connection's state (connecting, live, reconnecting, ended, or the error).
 */
export function streamRun(runId: string, state: HTMLElement, dispose: Dispose[], onEvent: (ev: RunEvent) => void) {
  const abort = new AbortController();
  dispose.push(() => abort.abort());
  void followRun({
    url: `/v1/runs/${encodeURIComponent(runId)}/events`,
    headers: authHeaders(),
    signal: abort.signal,
    terminal: TERMINAL,
    onState: (s, detail) => {
      state.setAttribute('data-state', s);
      replace(state, detail ? `${s}: ${detail}` : s);
    },
    onEvent,
  }).catch((err) => {
    state.setAttribute('data-state', 'error');
    state.className = 'stream-state error';
    replace(state, messageOf(err));
  });
}

/** One run: its status, a Cancel button and its events as they happen (SSE, resumed after a drop). */
export function runView(id: string, dispose: Dispose[]): HTMLElement {
  const path = `/v1/runs/${encodeURIComponent(id)}`;
  let refreshRun: () => Promise<void> = async () => undefined;
  const state = h('span', { class: 'stream-state', 'data-state': 'connecting' }, 'connecting');
  const list = h('ol', { class: 'events' });
  streamRun(id, state, dispose, (ev) => {
    list.append(
      h(
        'li',
        { class: `event ${ev.event.replace(/\./g, '-')}`, 'data-seq': ev.id },
        h('span', { class: 'seq' }, ev.id),
        h('span', { class: 'name' }, ev.event),
        toolBlock(ev) ?? h('pre', {}, eventText(ev)),
        egressTable(ev),
      ),
    );
    if (ev.event.startsWith('run.') || ev.event.startsWith('approval.')) void refreshRun();
  });
  return h(
    'div',
    { class: 'view' },
    panel(
      'run',
      `Run ${id}`,
      () => api<Run>('GET', path),
      (r, reload) => {
        refreshRun = reload;
        return h(
          'div',
          {},
          h(
            'p',
            {},
            'status ',
            h('strong', { class: `status ${r.status}`, id: 'run-status' }, r.status),
            ` · ${r.steps} steps · model ${r.model ?? '—'} · tokens ${r.usage.prompt_tokens}/${r.usage.completion_tokens}`,
          ),
          h(
            'p',
            {},
            'workspace ',
            link(`#/ws/${r.workspace_id}`, r.workspace_id),
            ` · session ${r.session_id} · started ${when(r.created_at)} · finished ${when(r.finished_at)}`,
          ),
          r.error ? h('p', { class: 'error' }, `${r.error.code}: ${r.error.message}`) : null,
          TERMINAL.has(`run.${r.status}`)
            ? null
            : action('Cancel', async () => void (await api('POST', `${path}/cancel`)), {
                confirm: 'Cancel this run? Its running code is killed.',
                after: reload,
                className: 'danger',
              }),
        );
      },
      { dispose },
    ),
    panel(
      'run-sandbox',
      'Sandbox',
      async () => {
        const { session_id } = await api<Run>('GET', path);
        const all = await api<List<Sandbox>>('GET', '/v1/sandboxes');
        return { session_id, sandbox: all.data.find((s) => s.session_id === session_id) ?? null };
      },
      ({ sandbox }, reload) =>
        sandbox?.state === 'paused'
          ? h(
              'p',
              {},
              `${sandbox.id} · paused to disk with its variables (its next execution resumes it) · deleted at `,
              h('strong', { class: 'reclaim-at' }, when(sandbox.expires_at)),
              ' ',
              sandboxActions(sandbox, reload),
            )
          : sandbox
            ? h(
                'p',
                {},
                // A gVisor sandbox is paused (not removed) at its idle deadline, where the host can.
                `${sandbox.id} · ${sandbox.state} · ${sandbox.runtime === 'gvisor' ? 'paused or reclaimed' : 'reclaimed'} at `,
                h('strong', { class: 'reclaim-at' }, when(sandbox.reclaim_at)),
                ' unless used or kept alive ',
                sandboxActions(sandbox, reload),
              )
            : h('p', { class: 'empty' }, 'no sandbox running for this session: its next execution starts one'),
      { everyMs: 5000, dispose },
    ),
    h('section', { class: 'panel', id: 'events' }, h('header', {}, h('h2', {}, 'Events'), state), list),
  );
}
