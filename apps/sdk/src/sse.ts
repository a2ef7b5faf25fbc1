import { type EventSourceMessage, EventSourceParserStream } from 'eventsource-parser/stream';

export interface SseMessage {
  /** The stream's last event id when this message came ("" when it never set one): ids persist across events. */
  id: string;
  /** The event type ("message" when the event named none). */
  event: string;
  data: string;
}

/**
 * Reads a response body as Server-Sent Events. The parsing is eventsource-parser's (the WHATWG
 * event-stream rules: CRLF, CR or LF line ends split anywhere between chunks, a leading BOM,
 * comments, multi-line data, ids with NUL ignored); UTF-8 is decoded across chunk boundaries.
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  let lastId = '';
  const events = body
    .pipeThrough(new TextDecoderStream() as unknown as TransformStream<Uint8Array, string>)
    .pipeThrough(new EventSourceParserStream());
  for await (const e of events as unknown as AsyncIterable<EventSourceMessage>) {
    if (e.id !== undefined) lastId = e.id;
    yield { id: lastId, event: e.event ?? 'message', data: e.data };
  }
}
