/** One server-sent event as the wire carried it. */
export interface SseFrame {
  id?: string;
  event: string;
  data: string;
}

/**
 * Incremental text/event-stream parser (the WHATWG rules Kiln's frames need: `id`, `event`,
 * multi-line `data`, comments, CRLF). Fed decoded chunks, it returns the frames they complete.
 */
export class SseParser {
  private buffer = '';
  private frame: { id?: string; event?: string; data: string[] } = { data: [] };

  push(chunk: string): SseFrame[] {
    this.buffer += chunk;
    const out: SseFrame[] = [];
    let nl: RegExpExecArray | null;
    const lineEnd = /\r\n|\r|\n/;
    while ((nl = lineEnd.exec(this.buffer))) {
      // A lone \r at the end may be the first half of \r\n: wait for more.
      if (nl[0] === '\r' && nl.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, nl.index);
      this.buffer = this.buffer.slice(nl.index + nl[0].length);
      if (line === '') {
        if (this.frame.data.length > 0 || this.frame.event !== undefined) {
          out.push({
            ...(this.frame.id !== undefined ? { id: this.frame.id } : {}),
            event: this.frame.event ?? 'message',
            data: this.frame.data.join('\n'),
          });
        }
        this.frame = { data: [] };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon === -1 ? line : line.slice(0, colon);
      const value = colon === -1 ? '' : line.slice(colon + 1).replace(/^ /, '');
      if (field === 'data') this.frame.data.push(value);
      else if (field === 'event') this.frame.event = value;
      else if (field === 'id') this.frame.id = value;
    }
    return out;
  }
}

export interface RunEvent {
  id: number;
  event: string;
  data: unknown;
}

type StreamState = 'connecting' | 'live' | 'reconnecting' | 'ended';

export interface FollowOptions {
  /** GET /v1/runs/{run}/events */
  url: string;
  headers: Record<string, string>;
  signal: AbortSignal;
  onEvent(ev: RunEvent): void;
  onState?(state: StreamState, detail?: string): void;
  /** Events after which nothing more comes. */
  terminal: ReadonlySet<string>;
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  retryMs?: number;
}

/** An answer that retrying cannot fix (bad key, unknown run). */
export class StreamRefused extends Error {}

/**
 * Follows a run's SSE stream with fetch (EventSource cannot send an Authorization header).
 * A dropped connection is resumed with `Last-Event-ID`, so no event is lost or seen twice;
 * resolves after the terminal event, or when `signal` aborts.
 */
export async function followRun(o: FollowOptions): Promise<void> {
  const doFetch = o.fetch ?? ((url, init) => fetch(url, init));
  let lastId: number | undefined;
  while (!o.signal.aborted) {
    o.onState?.(lastId === undefined ? 'connecting' : 'reconnecting');
    try {
      const headers: Record<string, string> = { ...o.headers, accept: 'text/event-stream' };
      if (lastId !== undefined) headers['last-event-id'] = String(lastId);
      const res = await doFetch(o.url, { headers, signal: o.signal });
      if (!res.ok || !res.body) {
        const body = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
        const message = body?.error?.message ?? `HTTP ${res.status}`;
        if (res.status >= 400 && res.status < 500 && res.status !== 429) throw new StreamRefused(message);
        throw new Error(message);
      }
      o.onState?.('live');
      const parser = new SseParser();
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const f of parser.push(value)) {
          if (f.event === 'ping' || f.id === undefined) continue;
          const id = Number(f.id);
          if (lastId !== undefined && id <= lastId) continue;
          lastId = id;
          o.onEvent({ id, event: f.event, data: f.data ? (JSON.parse(f.data) as unknown) : null });
          if (o.terminal.has(f.event)) {
            await reader.cancel().catch(() => undefined);
            o.onState?.('ended');
            return;
          }
        }
      }
    } catch (err) {
      if (o.signal.aborted) return;
      if (err instanceof StreamRefused) throw err;
      o.onState?.('reconnecting', (err as Error).message);
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, o.retryMs ?? 1000);
      o.signal.addEventListener(
        'abort',
        () => {
          clearTimeout(timer);
          resolve();
        },
        { once: true },
      );
    });
  }
}
