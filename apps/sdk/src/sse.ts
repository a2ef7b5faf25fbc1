/**
 * A Server-Sent Events parser following the WHATWG HTML standard's "event stream
 * interpretation" (https://html.spec.whatwg.org/multipage/server-sent-events.html): lines end
 * in CRLF, LF or CR (a CR at the end of one chunk and the LF starting the next are one line end);
 * a leading BOM is dropped; lines starting with ":" are comments; a field without ":" has an
 * empty value and one space after the ":" is not part of the value; `data` lines join with
 * LF; `id` with a NUL is ignored and otherwise sets the last event id, which persists across
 * events; `retry` takes ASCII digits only; a blank line dispatches, unless no data came.
 * (eventsource-parser would do this, but it is not a dependency of the SDK yet.)
 */

export interface SseMessage {
  /** The last event id at dispatch ("" when the stream never set one). */
  id: string;
  /** The event type ("message" when the event named none). */
  event: string;
  data: string;
}

export class SseParser {
  private buffer = '';
  private started = false;
  private pendingCr = false;
  private data = '';
  private hasData = false;
  private eventType = '';
  private idBuffer = '';
  /** The last event id, as of the last dispatch (the standard's "last event ID string"). */
  lastEventId = '';
  /** The reconnection time the stream asked for (ms), if it sent a valid `retry`. */
  retry: number | undefined;

  constructor(private readonly onMessage: (m: SseMessage) => void) {}

  /** Feeds decoded text; complete lines are interpreted at once, a partial one waits for the next chunk. */
  feed(chunk: string): void {
    let text = chunk;
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this.pendingCr && text.startsWith('\n')) text = text.slice(1);
    this.pendingCr = false;
    this.buffer += text;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const ch = this.buffer.charCodeAt(i);
      if (ch !== 10 && ch !== 13) continue;
      this.line(this.buffer.slice(start, i));
      if (ch === 13) {
        if (i + 1 < this.buffer.length) {
          if (this.buffer.charCodeAt(i + 1) === 10) i++;
        } else this.pendingCr = true;
      }
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
  }

  /** The stream ended: a partial event (no blank line after it) is discarded, as the standard says. */
  end(): void {
    this.buffer = '';
    this.pendingCr = false;
    this.data = '';
    this.hasData = false;
    this.eventType = '';
  }

  private line(line: string): void {
    if (line === '') {
      this.dispatch();
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.eventType = value;
    else if (field === 'data') {
      this.data += this.hasData ? `\n${value}` : value;
      this.hasData = true;
    } else if (field === 'id') {
      if (!value.includes('\0')) this.idBuffer = value;
    } else if (field === 'retry') {
      if (/^[0-9]+$/.test(value)) this.retry = Number(value);
    }
  }

  private dispatch(): void {
    const { data, hasData, eventType } = this;
    this.lastEventId = this.idBuffer;
    this.data = '';
    this.hasData = false;
    this.eventType = '';
    if (!hasData) return;
    this.onMessage({ id: this.lastEventId, event: eventType || 'message', data });
  }
}

/** Reads a response body as SSE messages (UTF-8 decoded across chunk boundaries). */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const queue: SseMessage[] = [];
  const parser = new SseParser((m) => queue.push(m));
  const decoder = new TextDecoder('utf-8');
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      parser.feed(done ? decoder.decode() : decoder.decode(value, { stream: true }));
      yield* queue.splice(0);
      if (done) return parser.end();
    }
  } finally {
    reader.releaseLock();
  }
}
