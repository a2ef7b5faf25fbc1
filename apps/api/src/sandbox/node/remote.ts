import http2, { type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { PassThrough } from 'node:stream';
import { checkServerIdentity, type PeerCertificate } from 'node:tls';
import { ApiError, type ErrorCode } from '../../lib/errors.ts';
import {
  type BackendCapabilities,
  type ContainerRequest,
  type EgressEvent,
  HostLost,
  ImageBuildFailed,
  type ImageBuilder,
  type ImageRecipe,
  type ListedContainer,
  type RunnerChannel,
  type RuntimeOffer,
  type SandboxBackend,
  type SandboxContainer,
  type Usage,
} from '../backend.ts';
import { sameShape } from '../docker/container-spec.ts';
import type { SandboxLimits } from '../limits.ts';
import { fileFrames, manifestOf, type TreeEntry } from '../tree-sync.ts';
import { peerName, type PeerCredentials } from './pki.ts';
import { type Call, Demux, readAll, STDOUT, type WireError } from './wire.ts';

/** An error the node answered: `gone` when it says the container no longer exists or runs. */
class NodeError extends Error {
  constructor(
    message: string,
    readonly gone: boolean,
  ) {
    super(message);
  }
}

/** How long a call may take before it fails (a create can wait on the engine under load). */
const CALL_TIMEOUT_MS = 300_000;
/** The longest line of a build's output stream the API holds while waiting for its end. */
const MAX_BUILD_LINE = 1024 * 1024;
/** The most template images a node's answer may list. */
const MAX_HELD_IMAGES = 10_000;
/** The longest answer line of a tree fill (the paths a node asks for). */
const MAX_TREE_LINE = 64 * 1024 * 1024;
/** How long the connection to a node may take to open (TCP and the TLS handshake). */
const CONNECT_TIMEOUT_MS = 5000;

/**
 * The API's side of one sandbox node (server.ts): a `SandboxBackend` whose containers live on
 * that node's host, reached over one HTTP/2 connection with mutual TLS (pki.ts), opened at the
 * first call and again after it drops. The node's certificate must name the node dialled.
 * Its sandboxes mount nothing of the API's host: the engine sends them the tree as a tar.
 */
export class RemoteBackend implements SandboxBackend {
  private session: ClientHttp2Session | undefined;
  /** Connections dropped because the node stopped answering, and the error their runners end with. */
  private readonly dropped = new WeakMap<object, HostLost>();
  readonly images: ImageBuilder;

  constructor(
    private readonly o: {
      /** `https://host:port` */
      url: string;
      /** The node's name, as its certificate carries it. */
      name: string;
      credentials: PeerCredentials;
    },
  ) {
    this.images = {
      idOf: (ref) => this.call('imageId', ref) as Promise<string | null>,
      remove: (ref) => this.call('imageRemove', ref) as Promise<void>,
      held: async () => {
        // What a node says it has decides where sandboxes go: a list of image names, bounded.
        const held = await this.call('imagesHeld');
        if (
          !Array.isArray(held) ||
          held.length > MAX_HELD_IMAGES ||
          !held.every((t) => typeof t === 'string' && t.length > 0 && t.length <= 512)
        )
          throw new NodeError(
            `node ${this.o.name}: its list of images is not a list of at most ${MAX_HELD_IMAGES} names`,
            false,
          );
        return held as string[];
      },
      build: (recipe, opts) => this.build(recipe, opts),
    };
  }

  private connect(): ClientHttp2Session {
    if (this.session && !this.session.closed && !this.session.destroyed) return this.session;
    const { credentials, name } = this.o;
    const session = http2.connect(this.o.url, {
      ca: credentials.ca,
      cert: credentials.cert,
      key: credentials.key,
      minVersion: 'TLSv1.3',
      checkServerIdentity: (host: string, cert: PeerCertificate) =>
        checkServerIdentity(host, cert) ??
        (peerName(cert.raw, 'node') === name
          ? undefined
          : new Error(`the node at ${host} is not node ${name} (its certificate names another)`)),
    });
    session.on('error', () => undefined);
    // A node that does not complete the handshake in time is not there: its calls fail now, not
    // after the kernel gives up on the connection (minutes, when packets are dropped).
    const slow = setTimeout(() => {
      if (session.connecting) session.destroy(new Error(`node ${name}: no connection within ${CONNECT_TIMEOUT_MS} ms`));
    }, CONNECT_TIMEOUT_MS);
    slow.unref();
    session.once('connect', () => clearTimeout(slow));
    session.once('close', () => clearTimeout(slow));
    session.on('close', () => {
      if (this.session === session) this.session = undefined;
    });
    // The connection stays open for the next call, but does not keep the process alive.
    session.unref();
    this.session = session;
    return session;
  }

  /** A request on the node's connection; rejects with the connection's error if it cannot be opened. */
  private request(path: string, headers: Record<string, string> = {}): ClientHttp2Stream {
    const session = this.connect();
    const stream = session.request({ ':method': 'POST', ':path': path, ...headers });
    // Each caller reads the error it waits for; one that comes later (a reset) is not a crash.
    stream.on('error', () => undefined);
    return stream;
  }

  private response(stream: ClientHttp2Stream): Promise<number> {
    return new Promise((resolve, reject) => {
      stream.once('response', (h) => resolve(Number(h[':status'])));
      stream.once('error', reject);
      stream.once('close', () =>
        reject(new NodeError(`node ${this.o.name}: the stream closed before an answer`, false)),
      );
    });
  }

  private fail(e: WireError): Error {
    if (e.code) return new ApiError(e.code as ErrorCode, e.message);
    if (e.build) return new ImageBuildFailed(e.message);
    return new NodeError(e.message, e.gone);
  }

  private async call(call: Call, ...args: unknown[]): Promise<unknown> {
    const stream = this.request(`/v1/call/${call}`, { 'content-type': 'application/json' });
    stream.setTimeout(CALL_TIMEOUT_MS, () => stream.close(http2.constants.NGHTTP2_CANCEL));
    stream.end(JSON.stringify(args));
    const [status, body] = await Promise.all([
      this.response(stream),
      readAll(stream).catch((err: Error) => {
        throw new NodeError(`node ${this.o.name}: ${err.message}`, false);
      }),
    ]);
    let answer: { value?: unknown; error?: WireError };
    try {
      answer = JSON.parse(body.toString('utf8'));
    } catch {
      throw new NodeError(`node ${this.o.name} answered ${status} with no JSON`, false);
    }
    if (answer.error) throw this.fail(answer.error);
    return answer.value;
  }

  create(req: ContainerRequest): Promise<SandboxContainer> {
    if (req.workspaceDir) throw new Error('a remote node mounts no directory of the API host');
    return this.call('create', req) as Promise<SandboxContainer>;
  }
  async start(container: SandboxContainer): Promise<void> {
    await this.call('start', container);
  }
  async update(container: SandboxContainer, limits: SandboxLimits): Promise<void> {
    await this.call('update', container, limits);
  }
  async remove(containerId: string): Promise<void> {
    await this.call('remove', containerId);
  }
  list(): Promise<ListedContainer[]> {
    return this.call('list') as Promise<ListedContainer[]>;
  }
  stats(containerId: string): Promise<Usage | null> {
    return this.call('stats', containerId) as Promise<Usage | null>;
  }
  /** Checkpointed on the node's host: the checkpoint stays there, and only that node can resume it. */
  pause(container: SandboxContainer): Promise<{ bytes: number | null }> {
    return this.call('pause', container) as Promise<{ bytes: number | null }>;
  }
  resume(container: SandboxContainer, lifetimeEndsAt: number): Promise<RunnerChannel> {
    return this.stdio('/v1/resume', container, { 'kiln-lifetime-ends': String(Math.round(lifetimeEndsAt)) });
  }
  reattach(container: SandboxContainer): Promise<RunnerChannel> {
    return this.stdio('/v1/reattach', container);
  }
  async capabilities(): Promise<BackendCapabilities> {
    const { runtimes, teamBound } = (await this.call('capabilities')) as {
      runtimes: RuntimeOffer[];
      teamBound?: boolean;
    };
    // A node runs Docker: what can change in place is what Docker can change.
    return { runtimes, hostWorkspaceMounts: false, resizable: sameShape, teamBound: teamBound === true };
  }
  capacity(): Promise<{ memoryMb: number; cpus: number }> {
    return this.call('capacity') as Promise<{ memoryMb: number; cpus: number }>;
  }
  async ping(timeoutMs = 2000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        this.call('ping', timeoutMs),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`node ${this.o.name}: no answer within ${timeoutMs} ms`)),
            timeoutMs,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }
  isGone(err: unknown): boolean {
    return err instanceof NodeError && err.gone;
  }
  async setAllow(container: SandboxContainer, allow: readonly string[]): Promise<void> {
    await this.call('setAllow', container, allow);
  }
  takeEgress(container: SandboxContainer): Promise<EgressEvent[]> {
    return this.call('takeEgress', container) as Promise<EgressEvent[]>;
  }
  async sweepEgress(instance: string, opts?: { all?: boolean }): Promise<void> {
    await this.call('sweepEgress', instance, opts);
  }

  /**
   * Fills a container's workspace mount on the node from the node's copy of the workspace,
   * sending the files that copy lacks (tree-sync.ts). A file that changed while it was sent makes
   * the node refuse the fill as stale: listed and sent again, twice at most.
   */
  async fillTree(container: SandboxContainer, workspaceId: string, dir: string): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      const entries = await manifestOf(dir);
      const byPath = new Map(entries.map((e) => [e.p, e]));
      const stream = this.request('/v1/tree', {
        'kiln-container': Buffer.from(JSON.stringify(container)).toString('base64url'),
        'kiln-tree': workspaceId,
      });
      stream.setTimeout(CALL_TIMEOUT_MS, () => stream.close(http2.constants.NGHTTP2_CANCEL));
      const manifest = Buffer.from(JSON.stringify(entries));
      const head = Buffer.allocUnsafe(4);
      head.writeUInt32BE(manifest.length);
      stream.write(Buffer.concat([head, manifest]));
      const status = await this.response(stream);
      const lines = jsonLines(stream, `node ${this.o.name}: an answer line`, MAX_TREE_LINE);
      const first = (await lines.next()).value as { wants?: string[]; error?: WireError } | undefined;
      if (status !== 200 || !first || first.error || !Array.isArray(first.wants)) {
        stream.close(http2.constants.NGHTTP2_CANCEL);
        throw this.fail(first?.error ?? { message: `node ${this.o.name} answered ${status} to a tree`, gone: false });
      }
      const wanted = first.wants.map((p) => byPath.get(p)).filter((e): e is TreeEntry => e !== undefined && !e.d);
      // The node may answer before it has read every file (a frame it refuses): then stop sending.
      const answered = lines.next();
      let early = false;
      const over = answered.then(
        () => {
          early = true;
        },
        () => {
          early = true;
        },
      );
      for await (const frame of fileFrames(dir, wanted)) {
        if (early) break;
        if (!stream.write(frame))
          await Promise.race([new Promise<void>((resolve) => stream.once('drain', resolve)), over]);
      }
      const sentAll = !early;
      if (sentAll) stream.end();
      const last = (await answered).value as { done?: unknown; stale?: string; error?: WireError } | undefined;
      if (!sentAll && !stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
      if (last?.done) return;
      if (last?.stale !== undefined) {
        if (attempt < 3) continue;
        // Changing faster than it can be sent: the caller's to try again, not a failure of Kiln's.
        throw new ApiError(
          'workspace_busy',
          `the workspace changed while it was being sent to sandbox node ${this.o.name} (${last.stale}); try again`,
        );
      }
      throw this.fail(
        last?.error ?? {
          message: `node ${this.o.name}: the workspace could not be sent (${last?.stale ?? 'no answer'})`,
          gone: false,
        },
      );
    }
  }

  attachRunner(container: SandboxContainer): Promise<RunnerChannel> {
    return this.stdio('/v1/runner', container);
  }

  /** A runner's stdio, as one stream of the node's (wire.ts): attached to (again), or resumed first. */
  private async stdio(
    path: '/v1/runner' | '/v1/resume' | '/v1/reattach',
    container: SandboxContainer,
    headers: Record<string, string> = {},
  ): Promise<RunnerChannel> {
    const stream = this.request(path, {
      'kiln-container': Buffer.from(JSON.stringify(container)).toString('base64url'),
      ...headers,
    });
    const status = await this.response(stream);
    if (status !== 200) {
      const body = await readAll(stream).catch(() => Buffer.alloc(0));
      const e = (() => {
        try {
          return (JSON.parse(body.toString('utf8')) as { error?: WireError }).error;
        } catch {
          return undefined;
        }
      })();
      throw this.fail(e ?? { message: `node ${this.o.name} answered ${status}`, gone: false });
    }
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let closed: { err?: Error } | undefined;
    const listeners: ((err?: Error) => void)[] = [];
    const session = stream.session;
    const close = (err?: Error) => {
      if (closed) return;
      // However the stream ended, when it was because the node stopped answering (dropped) or its
      // whole connection failed (the node's process or host died), the host is lost, not the runner.
      const lost =
        session &&
        (this.dropped.get(session) ??
          (err && session.destroyed
            ? new HostLost(`node ${this.o.name}: its connection failed (${err.message})`)
            : undefined));
      closed = { err: lost ?? err };
      stdout.end();
      stderr.end();
      for (const l of listeners.splice(0)) l(closed.err);
    };
    const demux = new Demux((kind, data) => (kind === STDOUT ? stdout : stderr).write(data));
    stream.pipe(demux);
    demux.on('error', (err) => {
      close(err);
      stream.close(http2.constants.NGHTTP2_PROTOCOL_ERROR);
    });
    demux.on('finish', () => close());
    demux.resume();
    stream.on('error', (err) => close(err));
    stream.on('close', () =>
      close(
        stream.rstCode === http2.constants.NGHTTP2_NO_ERROR
          ? undefined
          : new Error(`node ${this.o.name}: the runner's stream was reset (${stream.rstCode})`),
      ),
    );
    return {
      stdin: stream,
      stdout,
      stderr,
      destroy: () => stream.close(http2.constants.NGHTTP2_CANCEL),
      onClose(listener) {
        if (closed) listener(closed.err);
        else listeners.push(listener);
      },
    };
  }

  private async build(
    recipe: ImageRecipe,
    opts: { onLine: (line: string) => void; timeoutMs: number; signal: AbortSignal },
  ): Promise<undefined> {
    opts.signal.throwIfAborted();
    const stream = this.request('/v1/images/build', { 'content-type': 'application/json' });
    const onAbort = () => stream.close(http2.constants.NGHTTP2_CANCEL);
    opts.signal.addEventListener('abort', onAbort, { once: true });
    try {
      stream.end(JSON.stringify({ recipe, timeoutMs: opts.timeoutMs }));
      await this.response(stream);
      let end: { done?: true; error?: WireError } | undefined;
      // A build's output line is the tenant's packages' output: never held beyond a bound.
      for await (const v of jsonLines(stream, `node ${this.o.name}: a build output line`, MAX_BUILD_LINE)) {
        const msg = v as { line?: string; done?: true; error?: WireError };
        if (typeof msg.line === 'string') opts.onLine(msg.line);
        else end = msg;
      }
      opts.signal.throwIfAborted();
      if (end?.error) throw this.fail(end.error);
      if (!end?.done) throw new NodeError(`node ${this.o.name}: the build's stream ended without a result`, false);
    } finally {
      opts.signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Closes the connection to the node (calls after it open a new one). With `drop`, at once:
   * every stream on it (runners included) fails now instead of waiting on a node that is gone.
   */
  close(drop = false): void {
    if (drop && this.session) {
      const why = new HostLost(`node ${this.o.name} stopped answering`);
      this.dropped.set(this.session, why);
      this.session.destroy(why);
    } else this.session?.close();
    this.session = undefined;
  }
}

/** The JSON lines of a response, one at a time (each bounded: `what` names the line in the error). */
async function* jsonLines(stream: AsyncIterable<Buffer>, what: string, max: number): AsyncGenerator<unknown> {
  let parts: Buffer[] = [];
  let held = 0;
  for await (const chunk of stream) {
    let from = 0;
    // Only the new bytes are searched for the line's end: a long line costs one pass.
    for (let at = chunk.indexOf(10); at >= 0; at = chunk.indexOf(10, from)) {
      parts.push(chunk.subarray(from, at));
      yield JSON.parse(Buffer.concat(parts).toString('utf8'));
      parts = [];
      held = 0;
      from = at + 1;
    }
    if (from < chunk.length) {
      parts.push(chunk.subarray(from));
      held += chunk.length - from;
      if (held > max) throw new NodeError(`${what} over ${max} bytes`, false);
    }
  }
  const tail = Buffer.concat(parts).toString('utf8');
  if (tail.trim()) yield JSON.parse(tail);
}
