import { OffThread } from '../lib/off-thread.ts';

/**
 * How large a frame from the runner may be. Code in the sandbox runs as the runner's user and
 * can write to the runner's stdout, so every frame is untrusted: a header over the limit ends
 * the sandbox before any of its body is buffered. The limit is the largest answer a pending
 * request can legitimately get:
 *
 * - an execution's result, with `sync`: the runner sends at most the step's byte quota of
 *   changed files (`sync_limit`, 16 MiB by default), base64-encoded (4/3: 22,369,624 bytes),
 *   plus stdout and stderr of at most `max_output` bytes each, which JSON can escape to 6 bytes
 *   per byte (`\ufffd`, `\u0000`), plus the figures it returns (PNG, base64) and, per file of
 *   the step's file quota (`sync_max_files`), its path and fields: about 27 MiB by default;
 * - a file read: the runner reads files of at most 32 MiB, base64-encoded (44,739,244 bytes);
 * - anything else (ready, ok, error, live output between results): 1 MiB.
 */
const SYNC_BYTES = 16 * 1024 * 1024;
const MAX_FILE_BYTES = 32 * 1024 * 1024;
const base64Length = (bytes: number) => 4 * Math.ceil(bytes / 3);
const ALLOWANCE_BYTES = 5 * 1024 * 1024; // figures (4 MiB) and paths and fields (1 MiB)
export const SMALL_FRAME_BYTES = 1024 * 1024;
/** A changed file's entry besides its content: a path of at most 1,024 bytes (JSON-escaped) and its fields. */
const PER_FILE_BYTES = 6 * 1024 + 64;

/** The largest frame that may answer `msg` (a request to the runner). */
export function frameLimitOf(msg: Record<string, unknown>): number {
  if (msg.op === 'exec') {
    const files = Number(msg.sync_max_files ?? 0);
    return (
      base64Length(Number(msg.sync_limit ?? SYNC_BYTES)) +
      2 * 6 * Number(msg.max_output ?? 65_536) +
      ALLOWANCE_BYTES +
      files * PER_FILE_BYTES
    );
  }
  if (msg.op === 'get') return base64Length(MAX_FILE_BYTES) + SMALL_FRAME_BYTES;
  return SMALL_FRAME_BYTES;
}

/** Frames up to this size are parsed inline; larger ones in the frame thread. */
const INLINE_PARSE_BYTES = 1024 * 1024;
const parser = new OffThread<{ body: Uint8Array }, Record<string, unknown>>(
  new URL('./frames.worker.mjs', import.meta.url),
  'runner frames',
);

/**
 * Reads length-prefixed JSON frames (4-byte big-endian length, then UTF-8 JSON) from a stream's
 * chunks in linear time: a frame's chunks are kept as they come and joined once, when the frame
 * is complete. Large frames are parsed off the event loop; frames are delivered in order.
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** The body length of the frame being read, once its header is in. */
  private body: number | undefined;
  /** Delivery of the frames behind one being parsed in the frame thread, in order. */
  private order: Promise<void> | undefined;
  private stopped = false;

  constructor(
    private readonly opts: {
      /** The largest frame acceptable now. */
      limit: () => number;
      onFrame: (msg: Record<string, unknown>) => void;
      /** The stream is unusable (a frame too large, or not JSON); nothing more is delivered. */
      onError: (reason: string) => void;
      /** A frame's JSON once its signature checks out, else undefined (the stream is then unusable). */
      authenticate?: (body: Buffer) => Buffer | undefined;
    },
  ) {}

  push(chunk: Buffer): void {
    if (this.stopped) return;
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    for (;;) {
      if (this.body === undefined) {
        if (this.buffered < 4) return;
        const n = this.take(4).readUInt32BE(0);
        const limit = this.opts.limit();
        if (n > limit) {
          this.fail(`the runner sent a frame of ${n} bytes (limit ${limit})`);
          return;
        }
        this.body = n;
      }
      if (this.buffered < this.body) return;
      const raw = this.take(this.body);
      this.body = undefined;
      const body = this.opts.authenticate ? this.opts.authenticate(raw) : raw;
      if (!body) {
        this.fail('the runner sent a frame not signed with its key');
        return;
      }
      this.deliver(body);
    }
  }

  stop(): void {
    this.stopped = true;
    this.chunks = [];
    this.buffered = 0;
  }

  /** The first `n` buffered bytes: a view when one chunk holds them, else joined once. */
  private take(n: number): Buffer {
    let used = 0;
    let got = 0;
    const parts: Buffer[] = [];
    while (got < n) {
      const c = this.chunks[used]!;
      const want = n - got;
      if (c.length <= want) {
        parts.push(c);
        got += c.length;
        used++;
      } else {
        parts.push(c.subarray(0, want));
        this.chunks[used] = c.subarray(want);
        got = n;
      }
    }
    this.chunks = used ? this.chunks.slice(used) : this.chunks;
    this.buffered -= n;
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts, n);
  }

  private deliver(body: Buffer): void {
    if (body.length <= INLINE_PARSE_BYTES && !this.order) {
      const msg = parseInline(body);
      if (msg) this.opts.onFrame(msg);
      else this.fail('the runner sent a frame that is not JSON');
      return;
    }
    const parsed = body.length <= INLINE_PARSE_BYTES ? Promise.resolve(parseInline(body)) : parseOffThread(body);
    const next = (this.order ?? Promise.resolve())
      .then(() => parsed)
      .then((msg) => {
        if (this.stopped) return;
        if (msg) this.opts.onFrame(msg);
        else this.fail('the runner sent a frame that is not JSON');
      });
    this.order = next;
    void next.finally(() => {
      if (this.order === next) this.order = undefined;
    });
  }

  private fail(reason: string): void {
    if (this.stopped) return;
    this.stop();
    this.opts.onError(reason);
  }
}

function parseInline(body: Buffer): Record<string, unknown> | undefined {
  try {
    return JSON.parse(body.toString()) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/** Parses in the frame thread; the bytes move there (copied first only when they share memory). */
function parseOffThread(body: Buffer): Promise<Record<string, unknown> | undefined> {
  const own = body.byteOffset === 0 && body.byteLength === body.buffer.byteLength ? body : new Uint8Array(body);
  return parser.run({ body: own }, [own.buffer as ArrayBuffer]).catch(() => undefined);
}
