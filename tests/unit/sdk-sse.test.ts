import { describe, expect, it } from 'vitest';
import { readSse } from '../../apps/sdk/src/sse.ts';

/** A response body that arrives in exactly these chunks. */
const body = (...chunks: (string | Uint8Array)[]) =>
  new ReadableStream<Uint8Array>({
    start(c) {
      for (const x of chunks) c.enqueue(typeof x === 'string' ? new TextEncoder().encode(x) : x);
      c.close();
    },
  });

const read = async (b: ReadableStream<Uint8Array>) => {
  const got = [];
  for await (const m of readSse(b)) got.push(m);
  return got;
};

describe('the SDK reading Server-Sent Events', () => {
  it('multi-line data, comments, CRLF / CR / LF split anywhere, a BOM, ids persisting, an id with NUL ignored', async () => {
    const got = await read(
      body(
        '\uFEFF: a comment\r',
        '\nid: 7\r\nevent: a\r\ndata: one\r\ndata:two\r\ndata\r\n\r',
        '\nretry: 1500\ndata: x\n\n',
        'event: b\rdata: y\r\r',
        'id: 9\0\ndata: z\n\n',
        'id\ndata: ignored at the end',
      ),
    );
    expect(got).toEqual([
      { id: '7', event: 'a', data: 'one\ntwo\n' },
      { id: '7', event: 'message', data: 'x' },
      { id: '7', event: 'b', data: 'y' },
      { id: '7', event: 'message', data: 'z' },
    ]);
  });

  it('a space after the colon is dropped once', async () => {
    expect(await read(body('id: 3\ndata:  two spaces\n\n'))).toEqual([
      { id: '3', event: 'message', data: ' two spaces' },
    ]);
  });

  it('reads a body whose chunks split a UTF-8 character and a CRLF', async () => {
    const bytes = new TextEncoder().encode('id: 1\r\ndata: {"text":"é✓"}\r\ndata: 2\r\n\r\n');
    const at = bytes.indexOf(0xc3) + 1;
    // Between the CR and the LF ending the first data line: one line end, not two.
    const cr = bytes.indexOf(0x0d, at) + 1;
    const got = await read(body(bytes.subarray(0, at), bytes.subarray(at, cr), bytes.subarray(cr)));
    expect(got).toEqual([{ id: '1', event: 'message', data: '{"text":"é✓"}\n2' }]);
  });
});
