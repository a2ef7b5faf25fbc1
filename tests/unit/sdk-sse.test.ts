import { describe, expect, it } from 'vitest';
import { readSse, SseParser } from '../../apps/sdk/src/sse.ts';

describe('the SSE parser (WHATWG event stream interpretation)', () => {
  const parse = (...chunks: string[]) => {
    const got: { id: string; event: string; data: string }[] = [];
    const p = new SseParser((m) => got.push(m));
    for (const c of chunks) p.feed(c);
    p.end();
    return { got, p };
  };

  it('multi-line data, comments, CRLF / CR / LF split anywhere, BOM, ids persisting, retry', () => {
    const { got, p } = parse(
      '\uFEFF: a comment\r',
      '\nid: 7\r\nevent: a\r\ndata: one\r\ndata:two\r\ndata\r\n\r',
      '\nretry: 1500\ndata: x\n\n',
      'event: b\rdata: y\r\r',
      'id: 9\0\ndata: z\n\n',
      'id\ndata: ignored at the end',
    );
    expect(got).toEqual([
      { id: '7', event: 'a', data: 'one\ntwo\n' },
      { id: '7', event: 'message', data: 'x' },
      { id: '7', event: 'b', data: 'y' },
      { id: '7', event: 'message', data: 'z' },
    ]);
    expect(p.retry).toBe(1500);
  });

  it('an event with no data is not dispatched but its id counts; a space after the colon is dropped once', () => {
    const { got } = parse('id: 3\nevent: ping\n\n', 'data:  two spaces\n\n');
    expect(got).toEqual([{ id: '3', event: 'message', data: ' two spaces' }]);
  });

  it('reads a body whose chunks split a UTF-8 character and a CRLF', async () => {
    const bytes = new TextEncoder().encode('id: 1\r\ndata: {"text":"é✓"}\r\ndata: 2\r\n\r\n');
    const at = bytes.indexOf(0xc3) + 1;
    // Between the CR and the LF ending the first data line: one line end, not two.
    const cr = bytes.indexOf(0x0d, at) + 1;
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(bytes.subarray(0, at));
        c.enqueue(bytes.subarray(at, cr));
        c.enqueue(bytes.subarray(cr));
        c.close();
      },
    });
    const got = [];
    for await (const m of readSse(body)) got.push(m);
    expect(got).toEqual([{ id: '1', event: 'message', data: '{"text":"é✓"}\n2' }]);
  });
});
