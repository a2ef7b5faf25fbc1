import { createHash, createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import { HostLost, type RunnerChannel } from './backend.ts';
import { FrameReader, frameLimitOf, SMALL_FRAME_BYTES } from './frames.ts';

export interface ExecError {
  type: string;
  message: string;
  traceback?: string;
}

interface Artifact {
  name: string;
  mime: string;
  base64: string;
}

/** What the runner reports for one execution (see sandbox-image/runner/kiln_runner.py). */
export interface RunnerResult {
  ok: boolean;
  exit_code: number;
  error: ExecError | null;
  stdout: string;
  stderr: string;
  stdout_bytes: number;
  stderr_bytes: number;
  truncated: boolean;
  duration_ms: number;
  artifacts: Artifact[];
  /** The interpreter was restarted before or during this execution: earlier variables are gone. */
  restarted: boolean;
  /** With `restarted` for a new sandbox: why the session's previous one ended (idle, paused_expired, resume_failed, …). */
  restart_reason?: string;
  /** The session's paused sandbox was resumed for this execution, in this many ms: every variable kept. */
  resumed_ms?: number;
  /** With `sync`: what the code changed under /workspace since the last sync. */
  changes?: WorkspaceChanges;
}

export interface WorkspaceChanges {
  changed: { path: string; data: string }[];
  deleted: string[];
  skipped: { path: string; reason: string }[];
  /** The runner stopped collecting at the step's file-count cap or byte limit: more changed than listed. */
  over?: 'files' | 'bytes';
}

export type OutputListener = (stream: 'stdout' | 'stderr', data: string) => void;

interface Pending {
  resolve(msg: Record<string, unknown>): void;
  reject(err: Error): void;
  onOutput?: OutputListener;
  /** The only event that answers this request (besides `error`, and `out` for an exec). */
  answer: 'ready' | 'result' | 'ok' | 'file';
  /** For an exec: the sha256 of the code sent, which the result must echo. */
  codeSha256?: string;
  /** For an exec: whether it asked for the workspace's changes (none are accepted otherwise). */
  sync?: boolean;
  /** The largest frame that may answer this request (see frames.ts). */
  frameLimit?: number;
}

/** What each request op is answered with. */
const ANSWERS = {
  exec: 'result',
  put: 'ok',
  sync_in: 'ok',
  sync_begin: 'ok',
  sync_chunk: 'ok',
  sync_end: 'ok',
  delete: 'ok',
  ping: 'ok',
  get: 'file',
} as const;

/** The result of an execution cancelled before its code reached the interpreter. */
export const cancelledBeforeStart = (): RunnerResult =>
  notRun(130, { type: 'Cancelled', message: 'execution cancelled before it started; the code did not run' }, false);

/** The result of an execution whose code never ran (or whose run is lost): no output, only why. */
export function notRun(exitCode: number, error: ExecError, restarted: boolean): RunnerResult {
  return {
    ok: false,
    exit_code: exitCode,
    error,
    stdout: '',
    stderr: '',
    stdout_bytes: 0,
    stderr_bytes: 0,
    truncated: false,
    duration_ms: 0,
    artifacts: [],
    restarted,
  };
}

/** The runner stopped answering (or its stream ended): the sandbox must be replaced. */
export class RunnerGoneError extends Error {}

/**
 * The frames' version this server speaks, which the runner's `ready` must name (PROTOCOL in
 * sandbox-image/runner/kiln_runner.py; raise both when the frames change).
 */
export const RUNNER_PROTOCOL = 1;

/**
 * The runner speaks another version of the frames: its image is older (or newer) than this server.
 * A sandbox that outlived a restart is replaced by one of the current image; a new one cannot be made of it.
 */
export class RunnerOutdated extends RunnerGoneError {}

/** The runner's command line in the sandbox image. */
// -I: no user site-packages, no PYTHON* variables, not its own directory on sys.path; -S: no site
// module, so no .pth file of a template's packages runs in the runner before it hardens itself
// (the interpreter it starts for the user's code has site-packages as usual).
export const RUNNER_CMD = ['python3', '-I', '-S', '-u', '/opt/kiln/kiln_runner.py'];
/** Beyond the runner's own timeout and its 1 s interrupt grace, how long the host waits. */
const HOST_GRACE_MS = 5_000;

/**
 * One long-lived runner process (started by the backend: a `docker exec` with Docker), speaking
 * length-prefixed JSON frames over its stdin and stdout. Requests are matched to answers by id.
 */
export class RunnerClient {
  private pending = new Map<string, Pending>();
  /** Frames are untrusted (code in the sandbox can write to the runner's stdout): see frames.ts. */
  private readonly frames = new FrameReader({
    limit: () => Math.max(SMALL_FRAME_BYTES, ...[...this.pending.values()].map((p) => p.frameLimit ?? 0)),
    onFrame: (msg) => this.dispatch(msg),
    onError: (reason) => this.markGone(reason),
    authenticate: (body) => this.authenticate(body),
  });
  /** The key every frame after `ready` is signed with (HMAC-SHA256, in its first 32 bytes). */
  private key: Buffer | undefined;
  /**
   * Why the runner is gone, once it is (the first cause wins), and as what its sandbox ended: its
   * host stopped answering (`node_lost`: the connection failed with HostLost), or the runner itself.
   */
  private gone: { reason: string; as: 'node_lost' | 'runner_lost' } | undefined;
  private readonly exitListeners: ((reason: string) => void)[] = [];
  stderrTail = '';

  private constructor(private readonly channel: RunnerChannel) {}

  /**
   * Speaks to a runner the backend just started and waits until it is ready. With `sign`, the
   * runner is then given a key of its own (before any code has run in it) and every frame it
   * sends after must carry its signature: code in the sandbox that gets hold of the runner's
   * stdout (gVisor does not close /proc/<pid>/fd of a non-dumpable process to its own uid)
   * cannot forge one. Without, for stand-in runners in tests.
   */
  static async start(channel: RunnerChannel, readyTimeoutMs = 30_000, sign = false): Promise<RunnerClient> {
    const client = await RunnerClient.open(channel, readyTimeoutMs);
    if (sign) {
      const key = randomBytes(32);
      client.send({ op: 'key', key: key.toString('base64') });
      client.key = key;
    }
    return client;
  }

  /**
   * Speaks again to a daemon runner (kiln_runner.py) that was given `key` when it started, through
   * a new relay (a resumed sandbox): its `ready` must be signed with the key, and the client proves
   * it is the host by answering its nonce before anything else.
   */
  static async reattach(channel: RunnerChannel, key: Buffer, readyTimeoutMs = 30_000): Promise<RunnerClient> {
    const client = await RunnerClient.open(channel, readyTimeoutMs, key);
    const nonce = client.readyNonce;
    if (typeof nonce !== 'string') {
      client.markGone('the runner did not ask the host to prove itself');
      throw new RunnerGoneError('the runner did not ask the host to prove itself');
    }
    const mac = createHmac('sha256', key).update(`attach:${nonce}`).digest('hex');
    client.send({ op: 'auth', mac });
    return client;
  }

  /** The key its frames are signed with (kept while its sandbox is paused, to attach again after). */
  get signingKey(): Buffer | undefined {
    return this.key;
  }

  private readyNonce: unknown;

  private static async open(channel: RunnerChannel, readyTimeoutMs: number, key?: Buffer): Promise<RunnerClient> {
    const client = new RunnerClient(channel);
    client.key = key;
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new RunnerGoneError(`runner not ready within ${readyTimeoutMs} ms: ${client.stderrTail}`)),
        readyTimeoutMs,
      );
      client.pending.set('ready', {
        answer: 'ready',
        resolve: (msg) => {
          clearTimeout(timer);
          if (msg.protocol !== RUNNER_PROTOCOL) {
            const spoken = typeof msg.protocol === 'number' ? `protocol ${msg.protocol}` : 'no protocol version';
            channel.destroy();
            return reject(
              new RunnerOutdated(
                `the sandbox's runner speaks ${spoken}, this server ${RUNNER_PROTOCOL}: its image was built ` +
                  'from other sources than the server (run `npm run sandbox:build`; templates are rebuilt on it at the next start)',
              ),
            );
          }
          client.readyNonce = msg.nonce;
          resolve();
        },
        reject: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      });
    });
    channel.stdout.on('data', (chunk: Buffer) => client.onData(chunk));
    channel.stderr.on(
      'data',
      (chunk: Buffer) => (client.stderrTail = (client.stderrTail + chunk.toString()).slice(-2000)),
    );
    channel.onClose((err) => {
      const tail = client.stderrTail ? `: ${client.stderrTail.trim()}` : '';
      client.markGone(
        err ? `runner stream failed: ${err.message}` : `runner stream ended${tail}`,
        true,
        err instanceof HostLost ? 'node_lost' : 'runner_lost',
      );
    });
    await ready;
    return client;
  }

  private authenticate(body: Buffer): Buffer | undefined {
    if (!this.key) return body;
    if (body.length < 32) return undefined;
    const mac = createHmac('sha256', this.key).update(body.subarray(32)).digest();
    return timingSafeEqual(mac, body.subarray(0, 32)) ? body.subarray(32) : undefined;
  }

  get alive(): boolean {
    return this.gone === undefined;
  }

  /** Why a sandbox whose runner is gone ended: its host stopped answering (`node_lost`), or the runner itself. */
  get lostAs(): 'node_lost' | 'runner_lost' {
    return this.gone?.as ?? 'runner_lost';
  }

  onExit(listener: (reason: string) => void): void {
    if (this.gone) listener(this.gone.reason);
    else this.exitListeners.push(listener);
  }

  /** Runs code in the session's interpreter; output is streamed to `onOutput` as it comes. */
  exec(
    code: string,
    opts: {
      timeoutMs: number;
      maxOutputBytes: number;
      onOutput?: OutputListener;
      signal?: AbortSignal;
      sync?: boolean;
      syncCaps?: { maxFiles: number; maxBytes: number };
      /** Environment variables of the interpreter for this execution (the workspace's secrets). */
      env?: Record<string, string>;
    },
  ): Promise<RunnerResult> {
    // A cancel that came before the request (while the sandbox was claimed, synced or queued)
    // never fires again: checked here, at the last hand-off, the code is not sent at all.
    if (opts.signal?.aborted) return Promise.resolve(cancelledBeforeStart());
    const id = randomUUID();
    const onAbort = () => this.send({ op: 'cancel', id });
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    const hostTimer = setTimeout(
      () =>
        this.markGone(
          `no result ${opts.timeoutMs + HOST_GRACE_MS} ms after an execution with a ${opts.timeoutMs} ms limit`,
        ),
      opts.timeoutMs + HOST_GRACE_MS,
    );
    const sync = opts.sync ?? false;
    const check = { codeSha256: createHash('sha256').update(code, 'utf8').digest('hex'), sync };
    const msg = {
      op: 'exec' as const,
      id,
      code,
      timeout_ms: opts.timeoutMs,
      max_output: opts.maxOutputBytes,
      sync,
      sync_max_files: opts.syncCaps?.maxFiles,
      sync_limit: opts.syncCaps?.maxBytes,
      env: opts.env ?? {},
    };
    return this.request(msg, opts.onOutput, check).finally(() => {
      clearTimeout(hostTimer);
      opts.signal?.removeEventListener('abort', onAbort);
    }) as Promise<unknown> as Promise<RunnerResult>;
  }

  async putFile(path: string, data: Buffer, mode?: number): Promise<number> {
    const res = await this.request({ op: 'put', id: randomUUID(), path, data: data.toString('base64'), mode });
    return res.size as number;
  }

  /**
   * Unpacks a tar of the workspace (without .git) into /workspace, one chunk per frame as it
   * comes, and remembers it as synced. Returns the number of files.
   */
  async syncIn(tar: AsyncIterable<Buffer>): Promise<number> {
    await this.request({ op: 'sync_begin', id: randomUUID() });
    for await (const chunk of tar)
      await this.request({ op: 'sync_chunk', id: randomUUID(), data: chunk.toString('base64') });
    const res = await this.request({ op: 'sync_end', id: randomUUID() });
    return res.files as number;
  }

  /**
   * The host has copied the workspace into /workspace itself (a directory of its own mounted
   * there): the runner only takes what it finds as synced. Returns the number of files.
   */
  async syncLocal(): Promise<number> {
    const res = await this.request({ op: 'sync_in', id: randomUUID(), local: true });
    return res.files as number;
  }

  async deleteFile(path: string): Promise<void> {
    await this.request({ op: 'delete', id: randomUUID(), path });
  }

  async getFile(path: string): Promise<Buffer> {
    const res = await this.request({ op: 'get', id: randomUUID(), path });
    return Buffer.from(res.data as string, 'base64');
  }

  async ping(): Promise<{ busy: boolean }> {
    return (await this.request({ op: 'ping', id: randomUUID() })) as { busy: boolean };
  }

  /** Closes stdin: the runner kills whatever the user left running and exits. */
  close(): void {
    this.channel.stdin.end();
    this.markGone('closed');
  }

  /**
   * Lets go of a daemon runner (its sandbox is about to be paused): the relay ends, the runner
   * and its interpreter stay. Resolves once the relay's stream has ended.
   */
  detach(): Promise<void> {
    const ended = new Promise<void>((resolve) => this.channel.onClose(() => resolve()));
    this.channel.stdin.end();
    this.markGone('detached', false);
    return ended;
  }

  private request(
    msg: Record<string, unknown> & { id: string; op: keyof typeof ANSWERS },
    onOutput?: OutputListener,
    check: Pick<Pending, 'codeSha256' | 'sync'> = {},
  ): Promise<Record<string, unknown>> {
    if (this.gone) return Promise.reject(new RunnerGoneError(this.gone.reason));
    return new Promise((resolve, reject) => {
      this.pending.set(msg.id, {
        resolve,
        reject,
        onOutput,
        answer: ANSWERS[msg.op],
        frameLimit: frameLimitOf(msg),
        ...check,
      });
      this.send(msg);
    });
  }

  private send(msg: Record<string, unknown>): void {
    if (this.gone) return;
    const body = Buffer.from(JSON.stringify(msg));
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length);
    this.channel.stdin.write(Buffer.concat([head, body]));
  }

  private onData(chunk: Buffer): void {
    this.frames.push(chunk);
  }

  /**
   * Frames are accepted only as the answer to a request still pending, of the kind that
   * request expects; an exec's result must echo the sha256 of the code sent and may carry
   * workspace changes only when they were asked for. Anything else means the stream is not
   * the runner's own any more: the sandbox is ended rather than believed.
   */
  private dispatch(msg: Record<string, unknown>): void {
    const id = msg.ev === 'ready' ? 'ready' : msg.id;
    const p = typeof id === 'string' ? this.pending.get(id) : undefined;
    if (!p || typeof id !== 'string') {
      this.markGone(`the runner sent a ${String(msg.ev)} frame for no pending request`);
      return;
    }
    if (msg.ev === 'out' && p.answer === 'result') {
      p.onOutput?.(msg.stream as 'stdout' | 'stderr', msg.data as string);
      return;
    }
    const problem =
      msg.ev !== p.answer && msg.ev !== 'error'
        ? `answered a request expecting ${p.answer} with ${String(msg.ev)}`
        : msg.ev === 'result' && msg.code_sha256 !== p.codeSha256
          ? 'sent a result for code other than what was sent'
          : msg.ev === 'result' && msg.changes !== undefined && !p.sync
            ? 'sent workspace changes that were not asked for'
            : undefined;
    if (problem) {
      this.markGone(`the runner ${problem}`);
      return;
    }
    this.pending.delete(id);
    if (msg.ev === 'error') p.reject(new Error(msg.message as string));
    else p.resolve(msg);
  }

  private markGone(reason: string, destroy = true, as: 'node_lost' | 'runner_lost' = 'runner_lost'): void {
    if (this.gone) return;
    this.gone = { reason, as };
    this.frames.stop();
    for (const p of this.pending.values()) p.reject(new RunnerGoneError(reason));
    this.pending.clear();
    if (destroy) this.channel.destroy();
    for (const l of this.exitListeners.splice(0)) l(reason);
  }
}
