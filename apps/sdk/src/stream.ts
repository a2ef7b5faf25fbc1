import { errorFrom, isAbort, KilnConnectionError, KilnError } from './errors.ts';
import { readSse } from './sse.ts';

/** The events that end a run's stream. */
export const TERMINAL_EVENTS: readonly string[] = ['run.completed', 'run.failed', 'run.cancelled'];

/**
 * The fields of run events (docs/architecture.md lists the events); which are present depends
 * on the event's name: `thinking` has `text`, `code.proposed` `code`, `exec.output` `stream` and
 * `data`, `exec.completed` `error`/`commit`, `approval.requested` `approval_id`,
 * `message.created` `role`/`content`, `run.failed` `error`, …
 */
export interface RunEventData {
  text?: string;
  protocol_violation?: boolean;
  attempt?: number;
  code?: string;
  stream?: 'stdout' | 'stderr';
  data?: string;
  error?: { type?: string; code?: string; message: string };
  commit?: { sha: string; paths: string[] } | null;
  query?: string;
  hits?: unknown[];
  before_tokens?: number;
  after_tokens?: number;
  approval_id?: string;
  role?: string;
  content?: string;
  [field: string]: unknown;
}

/** One event of a run: `id` is its sequence number in the run (1, 2, …), the SSE `id`. */
export interface RunEvent {
  id: number;
  event: string;
  data: RunEventData;
}

export interface StreamOptions {
  /** Start after this event id (0: from the first event). */
  after?: number;
  /** Stops the stream (the iteration ends; no error). */
  signal?: AbortSignal;
  /** Reconnects in a row without a new event before giving up (default 8). */
  maxRetries?: number;
  /** Base of the backoff between reconnects without progress (default 250 ms, doubling, at most 10 s). */
  retryDelayMs?: number;
}

type Answer = { data?: ReadableStream<Uint8Array> | null; error?: unknown; response: Response };

const retryable = (err: unknown) => !(err instanceof KilnError) || err.status >= 500 || err.status === 429;

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (ms <= 0 || signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * Follows a run's SSE stream: yields each event once, in order, until a terminal event. When
 * the connection breaks (or the server ends the stream early, or answers 5xx/429) it reconnects
 * asking for the events after the last one it yielded (Last-Event-ID and ?after), right away
 * the first time, then with a doubling backoff while no new event arrives. An answer such as
 * 404 or 401 is thrown as the typed error at once.
 */
export async function* streamRun(
  open: (after: number, signal: AbortSignal) => Promise<Answer>,
  opts: StreamOptions = {},
): AsyncGenerator<RunEvent, void, undefined> {
  let last = opts.after ?? 0;
  const maxRetries = opts.maxRetries ?? 8;
  const base = opts.retryDelayMs ?? 250;
  const ctl = new AbortController();
  const stop = () => ctl.abort(opts.signal?.reason);
  if (opts.signal?.aborted) return;
  opts.signal?.addEventListener('abort', stop, { once: true });
  let failures = 0;
  try {
    for (;;) {
      let failure: unknown;
      let wait = 0;
      try {
        const r = await open(last, ctl.signal);
        if (r.error !== undefined || !r.response.ok || !r.data) {
          failure = errorFrom(r.response, r.error);
          const after = (failure as KilnError).headers.get('retry-after');
          if (after && /^\d+$/.test(after)) wait = Number(after) * 1000;
          if (!retryable(failure)) throw failure;
        } else {
          for await (const m of readSse(r.data)) {
            if (m.event === 'ping') continue;
            const id = Number(m.id);
            // An event at or before the last one yielded is never yielded again.
            if (!Number.isSafeInteger(id) || id <= last) continue;
            last = id;
            failures = 0;
            let data: RunEventData;
            try {
              data = JSON.parse(m.data) as RunEventData;
            } catch {
              data = { data: m.data };
            }
            yield { id, event: m.event, data };
            if (TERMINAL_EVENTS.includes(m.event)) return;
          }
          failure = new KilnConnectionError(`the event stream ended before the run did (after event ${last})`);
        }
      } catch (err) {
        if (ctl.signal.aborted) return;
        if (!retryable(err) && !isAbort(err)) throw err;
        failure = err;
      }
      failures++;
      if (failures > maxRetries) {
        throw failure instanceof Error && !(failure instanceof KilnError) && !(failure instanceof KilnConnectionError)
          ? new KilnConnectionError(`run event stream: ${failure.message}`, { cause: failure })
          : failure;
      }
      await sleep(Math.max(wait, failures === 1 ? 0 : Math.min(base * 2 ** (failures - 2), 10_000)), ctl.signal);
      if (ctl.signal.aborted) return;
    }
  } finally {
    opts.signal?.removeEventListener('abort', stop);
    ctl.abort();
  }
}
