import { Transform, type TransformCallback } from 'node:stream';

/**
 * The node protocol's shapes, shared by the node (server.ts) and the API's RemoteBackend
 * (remote.ts). One HTTP/2 connection per replica and node, over mutual TLS (pki.ts):
 *
 * - `POST /v1/call/<method>`: one backend call, JSON arguments in, `{ value }` or `{ error }` out;
 * - `POST /v1/runner` (the container in a `kiln-container` header): a runner's stdio as one
 *   stream: the request body is its stdin,
 *   the response body its stdout and stderr in frames (`[1 byte: 1 or 2][4 bytes: length][data]`);
 * - `POST /v1/resume` (the container in `kiln-container`, its moved lifetime's end in
 *   `kiln-lifetime-ends`, epoch ms): a paused container started from its checkpoint, then its
 *   runner's stdio as for `/v1/runner`;
 * - `POST /v1/images/build`: a template build, its output as JSON lines, the last one
 *   `{ done: true }` or `{ error }`; cancelling the stream stops the build;
 * - `POST /v1/tree` (the container in `kiln-container`, the workspace in `kiln-tree`): fills the
 *   container's workspace mount from the node's copy of that workspace (tree-store.ts): the
 *   manifest in, `{ wants }` out, the wanted files' frames in, `{ done }` / `{ stale }` / `{ error }` out.
 */
export const CALLS = [
  'create',
  'start',
  'update',
  'remove',
  'list',
  'stats',
  'pause',
  'capabilities',
  'capacity',
  'ping',
  'setAllow',
  'takeEgress',
  'sweepEgress',
  'imageId',
  'imageRemove',
  'imagesHeld',
] as const;
export type Call = (typeof CALLS)[number];

/** An error as it crosses the wire: its message, whether it says the container is gone, an API error code. */
export interface WireError {
  message: string;
  gone: boolean;
  code?: string;
  build?: boolean;
}

/** The largest call body either side accepts (a request, a list of every container). */
const MAX_CALL_BYTES = 8 * 1024 * 1024;
/** The largest stdio frame the node sends; the runner's own frames are bounded far below it. */
const MAX_FRAME = 1024 * 1024;

export const STDOUT = 1;
export const STDERR = 2;

export function frame(kind: number, data: Buffer): Buffer {
  const head = Buffer.allocUnsafe(5);
  head.writeUInt8(kind, 0);
  head.writeUInt32BE(data.length, 1);
  return Buffer.concat([head, data]);
}

/** Splits the node's stdio frames back into stdout and stderr; a malformed frame is an error. */
export class Demux extends Transform {
  private buf: Buffer = Buffer.alloc(0);

  constructor(private readonly onFrame: (kind: number, data: Buffer) => void) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    while (this.buf.length >= 5) {
      const kind = this.buf.readUInt8(0);
      const len = this.buf.readUInt32BE(1);
      if ((kind !== STDOUT && kind !== STDERR) || len > MAX_FRAME) {
        done(new Error(`malformed stdio frame from the node (kind ${kind}, ${len} bytes)`));
        return;
      }
      if (this.buf.length < 5 + len) break;
      this.onFrame(kind, this.buf.subarray(5, 5 + len));
      this.buf = this.buf.subarray(5 + len);
    }
    done();
  }
}

/** Reads a stream to the end, refusing more than `max` bytes. */
export async function readAll(stream: AsyncIterable<Buffer | string>, max = MAX_CALL_BYTES): Promise<Buffer> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of stream) {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    size += b.length;
    if (size > max) throw new Error(`more than ${max} bytes`);
    parts.push(b);
  }
  return Buffer.concat(parts);
}
