import { api, messageOf } from '../api.ts';
import { h, replace } from '../dom.ts';
import { flash, link, type Dispose } from '../panel.ts';
import type { RunEvent } from '../sse.ts';
import type { List, Run, Session, Workspace } from '../types.ts';
import { commitHref } from './change.ts';
import { egressTable, streamRun, toolBlock } from './run.ts';

interface Message {
  id: string;
  role: string;
  content: string;
  run_id: string | null;
}
interface Artifact {
  name: string;
  mime: string;
  base64: string;
}

const TERMINAL = new Set(['run.completed', 'run.failed', 'run.cancelled']);
const IN_FLIGHT = 'queued,in_progress,requires_action';
const enc = encodeURIComponent;
export const chatHref = (ws?: string, session?: string) =>
  `#/chat${ws ? `/${enc(ws)}${session ? `/${enc(session)}` : ''}` : ''}`;

/** Only PNG artifacts whose data is plain base64 become images (a data: URL, allowed by the page's policy). */
const isPng = (a: Artifact) => a.mime === 'image/png' && /^[A-Za-z0-9+/]+={0,2}$/.test(a.base64);

const bubble = (role: string, text: string) =>
  h(
    'div',
    { class: `msg ${role}` },
    h('span', { class: 'who' }, role === 'user' ? 'you' : 'agent'),
    h('div', { class: 'text' }, text),
  );

/**
 * One run as it happens, in the transcript: thinking, code, output as it streams, images,
 * commits, approvals (decided inline) and the answer. Follows the run's SSE stream, resumed
 * after a dropped connection with Last-Event-ID, so nothing is lost or shown twice.
 */
function followTurn(runId: string, into: HTMLElement, dispose: Dispose[], onEnd: (status: string) => void) {
  const turn = h('div', { class: 'turn', 'data-run': runId });
  const state = h('span', { class: 'stream-state', 'data-state': 'connecting' }, 'connecting');
  const cancel = h(
    'button',
    {
      type: 'button',
      class: 'danger cancel',
      onclick: async () => {
        cancel.disabled = true;
        try {
          await api('POST', `/v1/runs/${enc(runId)}/cancel`);
        } catch (err) {
          replace(flash, messageOf(err));
          cancel.disabled = false;
        }
      },
    },
    'Cancel',
  );
  into.append(h('div', { class: 'turn-head' }, link(`#/runs/${enc(runId)}`, runId), state, cancel), turn);
  let output: HTMLElement | null = null;
  const approvals = new Map<string, HTMLElement>();
  const onEvent = (ev: RunEvent) => {
    const d = (ev.data ?? {}) as Record<string, unknown>;
    const text = (k: string) => (typeof d[k] === 'string' ? (d[k] as string) : '');
    switch (ev.event) {
      case 'thinking':
        turn.append(h('details', { class: 'thinking' }, h('summary', {}, 'thinking'), h('pre', {}, text('text'))));
        break;
      case 'code.proposed':
        output = null;
        turn.append(h('pre', { class: 'code' }, text('code')));
        break;
      case 'exec.output': {
        if (!output) {
          output = h('pre', { class: 'output' });
          turn.append(output);
        }
        output.append(h('span', { class: text('stream') === 'stderr' ? 'stderr' : 'stdout' }, text('data')));
        break;
      }
      case 'exec.completed': {
        output = null;
        const err = d.error as { type?: string; message?: string } | null;
        if (err) turn.append(h('p', { class: 'error' }, `${err.type ?? 'Error'}: ${err.message ?? ''}`));
        for (const a of (d.artifacts as Artifact[] | undefined) ?? [])
          turn.append(
            isPng(a)
              ? h('img', { class: 'artifact', src: `data:image/png;base64,${a.base64}`, alt: a.name })
              : h('p', { class: 'hint' }, `artifact ${a.name} (${a.mime})`),
          );
        const commit = d.commit as { sha: string; kind: string; paths: string[] } | null;
        if (commit) {
          const ws = into.getAttribute('data-ws') ?? '';
          turn.append(
            h(
              'p',
              { class: 'commit' },
              'committed ',
              link(commitHref(ws, commit.sha), h('code', {}, commit.sha.slice(0, 10))),
              ` (${commit.kind}): ${commit.paths.join(', ')}`,
            ),
          );
        }
        const egress = egressTable(ev);
        if (egress) turn.append(egress);
        for (const r of (d.refused as { path: string; reason: string }[] | undefined) ?? [])
          turn.append(h('p', { class: 'warn' }, `${r.path} not committed: ${r.reason}`));
        break;
      }
      case 'tool.call':
      case 'tool.result':
        output = null;
        turn.append(toolBlock(ev)!);
        break;
      case 'approval.requested': {
        const id = text('approval_id');
        const box = h(
          'div',
          { class: 'approval', 'data-approval': id },
          h('strong', {}, 'The agent wants to run this code:'),
          h('pre', { class: 'code' }, text('code')),
        );
        const decide = (decision: string, label: string) =>
          h(
            'button',
            {
              type: 'button',
              class: decision,
              onclick: async (e: Event) => {
                for (const b of box.querySelectorAll('button')) b.disabled = true;
                try {
                  await api('POST', `/v1/approvals/${enc(id)}`, { decision });
                } catch (err) {
                  replace(flash, messageOf(err));
                  for (const b of box.querySelectorAll('button')) b.disabled = false;
                }
                e.preventDefault();
              },
            },
            label,
          );
        box.append(
          h(
            'div',
            { class: 'decide' },
            decide('approve', 'Approve'),
            decide('approve_session', 'Approve for session'),
            decide('deny', 'Deny'),
          ),
        );
        approvals.set(id, box);
        turn.append(box);
        break;
      }
      case 'approval.resolved': {
        const box = approvals.get(text('approval_id'));
        if (box) {
          for (const b of box.querySelectorAll('.decide')) b.remove();
          box.append(h('p', { class: 'resolved' }, `${text('status')}${d.reason ? `: ${String(d.reason)}` : ''}`));
        }
        break;
      }
      case 'message.created':
        if (d.role === 'assistant') turn.append(bubble('assistant', text('content')));
        break;
      default:
        if (TERMINAL.has(ev.event)) {
          cancel.remove();
          const why = d.error as { message?: string } | undefined;
          turn.append(
            h(
              'p',
              { class: `end ${ev.event.slice(4)}` },
              `run ${ev.event.slice(4)}${why?.message ? `: ${why.message}` : ''}`,
            ),
          );
          onEnd(ev.event.slice(4));
        }
    }
  };
  streamRun(runId, state, dispose, onEvent);
}

/** Talk to the agent of a workspace: pick (or start) a session, send a message, watch the run. */
export function chatView(ws: string | undefined, session: string | undefined, dispose: Dispose[]): HTMLElement {
  const wsSelect = h('select', { id: 'chat-ws', name: 'workspace' }, h('option', { value: '' }, 'pick a workspace…'));
  const sesSelect = h('select', { id: 'chat-session', name: 'session', disabled: !ws });
  const log = h('div', { class: 'chat-log', id: 'chat-log', 'data-ws': ws ?? '' });
  const input = h('textarea', { id: 'chat-input', rows: 3, placeholder: 'Ask the agent…', maxlength: '200000' });
  const send = h('button', { type: 'submit', id: 'chat-send', disabled: !session }, 'Send');
  const busy = (on: boolean) => {
    send.disabled = on || !session;
    input.disabled = on || !session;
  };

  // A failed read (an org-admin key, which acts in no team) is said in the chat, never left unhandled.
  const failed = (err: unknown) => log.append(h('p', { class: 'error', role: 'alert' }, messageOf(err)));
  void api<List<Workspace>>('GET', '/v1/workspaces?limit=100').then((l) => {
    for (const w of l.data)
      wsSelect.append(h('option', { value: w.id, ...(w.id === ws ? { selected: true } : {}) }, w.name));
  }, failed);
  wsSelect.addEventListener('change', () => {
    location.hash = chatHref(wsSelect.value || undefined);
  });
  if (ws) {
    void api<List<Session>>('GET', `/v1/workspaces/${enc(ws)}/sessions?limit=50`).then((l) => {
      sesSelect.append(h('option', { value: '' }, l.data.length ? 'pick a session…' : 'no session yet'));
      for (const s of l.data)
        sesSelect.append(
          h('option', { value: s.id, ...(s.id === session ? { selected: true } : {}) }, s.title ?? s.id),
        );
    }, failed);
  }
  // Send waits for a session: say how to get one, instead of a button that is just grey.
  if (!session)
    log.append(
      h(
        'p',
        { class: 'hint', id: 'chat-hint' },
        ws
          ? 'Pick a session above, or start a New session, to talk to the agent.'
          : 'Pick a workspace above, then a session (or New session), to talk to the agent.',
      ),
    );
  sesSelect.addEventListener('change', () => {
    if (sesSelect.value) location.hash = chatHref(ws, sesSelect.value);
  });
  const newSession = h(
    'button',
    {
      type: 'button',
      id: 'chat-new',
      disabled: !ws,
      onclick: async () => {
        try {
          const s = await api<Session>('POST', `/v1/workspaces/${enc(ws!)}/sessions`, {});
          location.hash = chatHref(ws, s.id);
        } catch (err) {
          replace(flash, messageOf(err));
        }
      },
    },
    'New session',
  );

  if (session) {
    busy(true);
    void (async () => {
      try {
        const msgs = await api<List<Message>>('GET', `/v1/sessions/${enc(session)}/messages?limit=200`);
        const live = await api<List<Run>>('GET', `/v1/runs?session=${enc(session)}&status=${IN_FLIGHT}&limit=1`);
        const active = live.data[0]?.id;
        // A run starts with the person's message and ends with its answer, its last assistant message;
        // the messages between are its steps (code, tool calls, what the platform fed back).
        const asked = new Map<string | null, string>();
        const answers = new Map<string | null, string>();
        for (const m of msgs.data) {
          if (m.role === 'user' && !asked.has(m.run_id)) asked.set(m.run_id, m.id);
          if (m.role === 'assistant') answers.set(m.run_id, m.id);
        }
        for (const m of msgs.data) {
          if (m.role === 'user' && (m.run_id === null || asked.get(m.run_id) === m.id))
            log.append(bubble('user', m.content));
          // The active run's answer comes with its stream.
          else if (m.role === 'assistant' && answers.get(m.run_id) === m.id && m.run_id !== active)
            log.append(bubble('assistant', m.content));
        }
        if (active) followTurn(active, log, dispose, () => busy(false));
        else busy(false);
      } catch (err) {
        log.append(h('p', { class: 'error', role: 'alert' }, messageOf(err)));
      }
    })();
  }

  const form = h(
    'form',
    {
      class: 'composer',
      id: 'chat-form',
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        const content = input.value.trim();
        if (!content || !session) return;
        busy(true);
        try {
          const r = await api<{ run: Run }>('POST', `/v1/sessions/${enc(session)}/messages`, { content });
          input.value = '';
          log.append(bubble('user', content));
          followTurn(r.run.id, log, dispose, () => busy(false));
        } catch (err) {
          log.append(h('p', { class: 'error', role: 'alert' }, messageOf(err)));
          busy(false);
        }
      },
    },
    input,
    send,
  );
  return h(
    'div',
    { class: 'view chat' },
    h(
      'section',
      { class: 'panel', id: 'chat' },
      h('header', {}, h('h2', {}, 'Chat'), wsSelect, sesSelect, newSession),
      log,
      form,
    ),
  );
}
