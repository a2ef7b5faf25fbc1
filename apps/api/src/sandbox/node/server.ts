import http2, { type Http2Server, type ServerHttp2Stream, type IncomingHttpHeaders } from 'node:http2';
import type { TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { z } from 'zod';
import { ApiError } from '../../lib/errors.ts';
import { ImageBuildFailed, type RunnerChannel, type SandboxBackend, type SandboxContainer } from '../backend.ts';
import { SANDBOX_UID_COUNT, SANDBOX_UID_MIN } from '../docker/container-spec.ts';
import { tmpfsSizes } from '../limits.ts';
import { MAX_TREE_ENTRIES, MAX_TREE_PATH } from '../tree-sync.ts';
import type { WorkspaceMounts } from '../workspace-mounts.ts';
import { peerName, type PeerCredentials } from './pki.ts';
import { StaleTree, type TreeStore } from './tree-store.ts';
import { CALLS, type Call, frame, readAll, STDERR, STDOUT, type WireError } from './wire.ts';

/**
 * A sandbox node: the one process on a sandbox host that holds its Docker Engine, serving the
 * host's `SandboxBackend` to the installation's API replicas over HTTP/2 with mutual TLS
 * (wire.ts, pki.ts). It has no database, no secrets key and no workspace repository: each call
 * brings what one sandbox needs, and a runner's output goes back raw (the API masks it).
 * Peers whose certificate is not an API replica's of this installation are refused at the
 * connection, and every call is checked here before it reaches the backend.
 */
export interface NodeServerOptions {
  backend: SandboxBackend;
  credentials: PeerCredentials;
  host: string;
  port: number;
  /** What of the host's memory and CPUs sandboxes may be given (less than all: the host keeps the rest). */
  reserve?: { memoryMb?: number; cpus?: number };
  /** How often the node removes its containers past their hard lifetime by itself (default 60 s). */
  reapMs?: number;
  /**
   * How long past its hard lifetime a paused container may wait on this host for an API replica
   * to resume or remove it (KILN_SANDBOX_MAX_PAUSED_TTL_S, default 30 days): the replicas keep each
   * one's own paused time; this bounds what is left when none is.
   */
  maxPausedMs?: number;
  /**
   * Workspace mounts of this host and the copies of workspace trees they are filled from
   * (tree-store.ts): a request with `treeMount` gets one, and `/v1/tree` fills it with only what
   * changed. Unset: every sandbox gets its tree through its runner, as a tar.
   */
  trees?: { mounts: WorkspaceMounts; store: TreeStore };
  log?: Logger;
}

export interface RunningNode {
  /** `https://host:port` */
  url: string;
  port: number;
  /** Removes this node's containers past their hard lifetime (and mounts whose container is gone) now; resolves with how many containers. */
  reap(): Promise<number>;
  close(): Promise<void>;
}

const id = z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/);
const runtime = z.enum(['runc', 'gvisor']);
const limits = z.object({
  memoryMb: z.number().positive(),
  cpus: z.number().positive(),
  pids: z.number().int().positive(),
  timeoutS: z.number().positive(),
  diskMb: z.number().positive(),
});
const container = z.object({
  id,
  // Only a sandbox uid: no call can make the node start a runner as root or a system user.
  uid: z
    .number()
    .int()
    .min(SANDBOX_UID_MIN)
    .max(SANDBOX_UID_MIN + SANDBOX_UID_COUNT - 1),
  runtime,
  pausable: z.boolean().optional(),
  proxyUrl: z.string().max(2048).optional(),
  treeMount: z.boolean().optional(),
});
const allow = z.array(z.string().max(512)).max(1024);
const request = z.object({
  image: z.string().min(1).max(512),
  sandboxId: z.string().max(128),
  instance: z.string().max(256),
  teamId: z.string().max(128),
  sessionId: z.string().max(128),
  expiresAt: z.iso.datetime().transform((s) => new Date(s)),
  limits,
  runtime,
  // A node mounts no path an API names: its sandboxes get the tree as a tar, or in a mount of its own.
  workspaceDir: z.undefined().optional(),
  treeMount: z.boolean().optional(),
  network: z
    .discriminatedUnion('mode', [
      z.object({ mode: z.literal('none') }),
      z.object({ mode: z.literal('allowlist'), allow }),
    ])
    .optional(),
  pausable: z.boolean().optional(),
});
const recipe = z.object({
  base: z.string().min(1).max(512),
  baseRef: z.string().min(1).max(512).optional(),
  tag: z.string().min(1).max(512),
  labels: z.record(z.string().max(256), z.string().max(1024)),
  apt: z.array(z.string().max(256)).max(512),
  pip: z.array(z.string().max(512)).max(512),
  pipIndexUrl: z.string().max(2048),
  debianMirror: z.string().max(2048).optional(),
  files: z.array(z.object({ path: z.string().max(1024), content: z.string() })).max(256),
  filesDir: z.string().max(1024),
  aptDay: z.string().max(32),
});

const treeEntry = z.strictObject({
  p: z.string().min(1).max(MAX_TREE_PATH),
  d: z.literal(true).optional(),
  s: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
  h: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
  m: z.number().int().min(0).max(0o755),
});
const treeManifest = z.array(treeEntry).max(MAX_TREE_ENTRIES);
/** The largest manifest a `/v1/tree` stream may start with. */
const MAX_MANIFEST_BYTES = 64 * 1024 * 1024;

/** Each call's arguments, as the node accepts them. */
const ARGS: Record<Call, z.ZodType<unknown[]>> = {
  create: z.tuple([request]),
  start: z.tuple([container]),
  update: z.tuple([container, limits]),
  remove: z.tuple([id]),
  list: z.tuple([]),
  stats: z.tuple([id]),
  pause: z.tuple([container]),
  capabilities: z.tuple([]),
  capacity: z.tuple([]),
  ping: z.tuple([z.number().int().positive().max(60_000).optional()]),
  setAllow: z.tuple([container, allow]),
  takeEgress: z.tuple([container]),
  sweepEgress: z.tuple([z.string().max(256), z.object({ all: z.boolean().optional() }).optional()]),
  imageId: z.tuple([z.string().min(1).max(512)]),
  imageRemove: z.tuple([z.string().min(1).max(512)]),
  imagesHeld: z.tuple([]),
};

function wireError(backend: SandboxBackend, err: unknown): WireError {
  const e = err instanceof Error ? err : new Error(String(err));
  return {
    message: e.message,
    gone: backend.isGone(err),
    ...(err instanceof ApiError ? { code: err.code } : {}),
    ...(err instanceof ImageBuildFailed ? { build: true } : {}),
  };
}

async function callBackend(
  b: SandboxBackend,
  call: Call,
  args: unknown[],
  reserve: NodeServerOptions['reserve'] = {},
  own: Pick<SandboxBackend, 'create' | 'remove'> = b,
): Promise<unknown> {
  const a = args as never[];
  switch (call) {
    case 'create':
      return own.create(a[0]!);
    case 'start':
      return b.start(a[0]!);
    case 'update':
      return b.update(a[0]!, a[1]!);
    case 'remove':
      return own.remove(a[0]!);
    case 'list':
      return b.list();
    case 'stats':
      return b.stats(a[0]!);
    case 'pause':
      if (!b.pause) throw new ApiError('unavailable', 'this node cannot pause sandboxes');
      return b.pause(a[0]!);
    case 'capabilities': {
      const { runtimes, teamBound } = await b.capabilities();
      return { runtimes, teamBound };
    }
    case 'capacity': {
      if (!b.capacity) throw new Error('this node cannot say its capacity');
      const host = await b.capacity();
      return {
        memoryMb: Math.min(host.memoryMb, reserve.memoryMb ?? Number.POSITIVE_INFINITY),
        cpus: Math.min(host.cpus, reserve.cpus ?? Number.POSITIVE_INFINITY),
      };
    }
    case 'ping':
      return b.ping(a[0]);
    case 'setAllow':
      if (!b.setAllow) throw new ApiError('unavailable', 'this node has no egress proxy');
      return b.setAllow(a[0]!, a[1]!);
    case 'takeEgress':
      return b.takeEgress ? b.takeEgress(a[0]!) : [];
    case 'sweepEgress':
      return b.sweepEgress?.(a[0]!, a[1]);
    case 'imageId':
      return b.images ? b.images.idOf(a[0]!) : null;
    case 'imageRemove':
      return b.images?.remove(a[0]!);
    case 'imagesHeld':
      return b.images?.held ? b.images.held() : [];
  }
}

export async function startNode(o: NodeServerOptions): Promise<RunningNode> {
  const { backend, log } = o;
  /** The hard lifetimes resumes moved on (by container), which this host's reaper keeps. */
  const moved = new Map<string, number>();
  const maxPausedMs = o.maxPausedMs ?? 30 * 86_400_000;
  const trees = o.trees;
  /** Container id -> sandbox id of the containers whose /workspace is a mount of this host. */
  const treeMounts = new Map<string, string>();
  /** Sandbox ids whose container is being created with a mount: never swept. */
  const mounting = new Set<string>();
  /** create and remove, with this host's workspace mounts (when the node keeps trees). */
  const own: Pick<SandboxBackend, 'create' | 'remove'> = {
    async create(req) {
      if (!req.treeMount || !trees) return backend.create({ ...req, treeMount: undefined });
      mounting.add(req.sandboxId);
      let dir: string | undefined;
      try {
        // Undefined past the mounts' budget: the container gets its own tmpfs and the tar path.
        dir = await trees.mounts.create(req.sandboxId, tmpfsSizes(req.limits).workspace);
        const c = await backend.create({ ...req, treeMount: undefined, workspaceDir: dir });
        if (!dir) return c;
        try {
          await trees.mounts.own(dir, c.uid);
        } catch (err) {
          await backend.remove(c.id).catch(() => undefined);
          throw err;
        }
        treeMounts.set(c.id, req.sandboxId);
        return { ...c, treeMount: true };
      } catch (err) {
        if (dir) await trees.mounts.remove(req.sandboxId).catch(() => undefined);
        throw err;
      } finally {
        mounting.delete(req.sandboxId);
      }
    },
    async remove(containerId) {
      await backend.remove(containerId);
      const sandboxId = treeMounts.get(containerId);
      if (sandboxId === undefined || !trees) return;
      treeMounts.delete(containerId);
      await trees.mounts.remove(sandboxId);
    },
  };
  const server: Http2Server = http2.createSecureServer({
    cert: o.credentials.cert,
    key: o.credentials.key,
    ca: o.credentials.ca,
    requestCert: true,
    rejectUnauthorized: true,
    minVersion: 'TLSv1.3',
    allowHTTP1: false,
  });
  // The handshake checked the chain; the name must also say API replica (a node's certificate is refused).
  server.on('secureConnection', (socket: TLSSocket) => {
    if (!peerName(socket.getPeerCertificate().raw, 'api')) {
      log?.warn({ remote: socket.remoteAddress }, 'node: refused a peer that is not an API replica');
      socket.destroy();
    }
  });
  server.on('tlsClientError', (err) => log?.info({ err }, 'node: a TLS handshake failed'));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (s) => {
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
    // A replica that goes away (or a network that does) ends its session with an error: expected.
    s.on('error', (err) => log?.debug({ err }, 'node: a replica session ended with an error'));
  });
  server.on('stream', (stream, headers) => {
    // Likewise each stream: a reset from the replica must never take the node down.
    stream.on('error', (err) => log?.debug({ err }, 'node: a stream ended with an error'));
    const socket = stream.session?.socket as TLSSocket | undefined;
    if (!socket || !peerName(socket.getPeerCertificate().raw, 'api')) {
      stream.respond({ ':status': 403 });
      stream.end();
      return;
    }
    handle(stream, headers).catch((err: Error) => {
      log?.error({ err }, 'node: a request failed');
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    });
  });
  const answer = (stream: ServerHttp2Stream, status: number, body: unknown) => {
    if (stream.destroyed) return;
    stream.respond({ ':status': status, 'content-type': 'application/json' });
    stream.end(JSON.stringify(body));
  };

  async function handle(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): Promise<void> {
    const path = String(headers[':path'] ?? '');
    if (headers[':method'] !== 'POST') return answer(stream, 405, { error: { message: 'POST only', gone: false } });
    const callName = /^\/v1\/call\/([A-Za-z]+)$/.exec(path)?.[1];
    if (callName) {
      if (!(CALLS as readonly string[]).includes(callName))
        return answer(stream, 404, { error: { message: `no call ${callName}`, gone: false } });
      const call = callName as Call;
      const parsed = ARGS[call].safeParse(
        await readAll(stream)
          .then((b) => JSON.parse(b.toString('utf8')))
          .catch(() => undefined),
      );
      if (!parsed.success)
        return answer(stream, 400, {
          error: {
            message: `bad arguments for ${call}: ${parsed.error.issues[0]?.message ?? 'not JSON'}`,
            gone: false,
          },
        });
      try {
        const value = await callBackend(backend, call, parsed.data, o.reserve, own);
        return answer(stream, 200, { value: value ?? null });
      } catch (err) {
        return answer(stream, 200, { error: wireError(backend, err) });
      }
    }
    if (path === '/v1/runner') return runner(stream, headers, (c) => backend.attachRunner(c));
    if (path === '/v1/resume') {
      const ends = Number(headers['kiln-lifetime-ends']);
      if (!backend.resume || !Number.isSafeInteger(ends) || ends <= 0)
        return answer(stream, 400, { error: { message: 'bad resume request', gone: false } });
      return runner(stream, headers, async (c) => {
        const channel = await backend.resume!(c, ends);
        // Its hard lifetime moved on by its time paused: this host's own reaper waits for it too.
        moved.set(c.id, ends);
        return channel;
      });
    }
    if (path === '/v1/reattach') {
      if (!backend.reattach)
        return answer(stream, 400, { error: { message: 'this node cannot reattach', gone: false } });
      return runner(stream, headers, (c) => backend.reattach!(c));
    }
    if (path === '/v1/images/build') return build(stream);
    if (path === '/v1/tree') return tree(stream, headers);
    return answer(stream, 404, { error: { message: `no route ${path}`, gone: false } });
  }

  /** The container a stream's `kiln-container` header names (base64url JSON), checked. */
  const containerOf = (headers: IncomingHttpHeaders) =>
    container.safeParse(
      (() => {
        try {
          return JSON.parse(Buffer.from(String(headers['kiln-container'] ?? ''), 'base64url').toString('utf8'));
        } catch {
          return undefined;
        }
      })(),
    );

  /**
   * Fills a new container's workspace mount from this node's copy of the workspace (tree-store.ts):
   * the request starts with the manifest (`[4 bytes: length][JSON]`); the node answers a first JSON
   * line `{ wants }`, the paths it lacks; the rest of the request is those files' frames; the last
   * line is `{ done }`, `{ stale }` (send again from a new listing) or `{ error }`.
   */
  async function tree(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): Promise<void> {
    const parsed = containerOf(headers);
    const key = String(headers['kiln-tree'] ?? '');
    if (!parsed.success || !/^[A-Za-z0-9_-]{1,128}$/.test(key))
      return answer(stream, 400, { error: { message: 'bad tree request', gone: false } });
    if (!trees) return answer(stream, 404, { error: { message: 'this node keeps no workspace trees', gone: false } });
    const c = parsed.data as SandboxContainer;
    let sandboxId = treeMounts.get(c.id);
    // A node restarted since the create: its listing still says which sandbox the container is.
    if (sandboxId === undefined && c.treeMount)
      sandboxId = (await backend.list()).find((l) => l.id === c.id)?.sandboxId;
    if (!sandboxId)
      return answer(stream, 409, {
        error: { message: 'the container has no workspace mount of this node', gone: false },
      });
    const input = chunks(stream);
    let manifest: ReturnType<typeof treeManifest.safeParse>;
    try {
      const head = await input.take(4);
      const len = head.readUInt32BE(0);
      if (len > MAX_MANIFEST_BYTES) throw new Error('manifest too large');
      manifest = treeManifest.safeParse(JSON.parse((await input.take(len)).toString('utf8')));
    } catch {
      return answer(stream, 400, { error: { message: 'bad tree manifest', gone: false } });
    }
    if (!manifest.success)
      return answer(stream, 400, {
        error: { message: `bad tree manifest: ${manifest.error.issues[0]?.message ?? ''}`, gone: false },
      });
    const entries = manifest.data;
    const line = (v: unknown) => {
      if (!stream.destroyed) stream.write(`${JSON.stringify(v)}\n`);
    };
    try {
      const wants = await trees.store.wants(key, entries);
      stream.respond({ ':status': 200, 'content-type': 'application/x-ndjson' });
      line({ wants });
      const got = await trees.store.fill(key, entries, input.rest(), {
        dir: trees.mounts.dirOf(sandboxId),
        uid: c.uid,
      });
      line({ done: got });
    } catch (err) {
      if (!stream.headersSent) return answer(stream, 200, { error: wireError(backend, err) });
      line(err instanceof StaleTree ? { stale: err.message } : { error: wireError(backend, err) });
    }
    if (!stream.destroyed) stream.end();
  }

  /**
   * A runner's stdio as one stream: request body → stdin; stdout and stderr → framed response.
   * `open` reaches the runner (attaches to it, or resumes its container first).
   */
  async function runner(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    open: (c: SandboxContainer) => Promise<RunnerChannel>,
  ): Promise<void> {
    const parsed = containerOf(headers);
    if (!parsed.success) return answer(stream, 400, { error: { message: 'bad kiln-container header', gone: false } });
    let channel: RunnerChannel;
    try {
      channel = await open(parsed.data as SandboxContainer);
    } catch (err) {
      return answer(stream, 409, { error: wireError(backend, err) });
    }
    if (stream.destroyed) return channel.destroy();
    stream.respond({ ':status': 200, 'content-type': 'application/x-kiln-stdio' });
    const send = (kind: number) => (chunk: Buffer) => {
      for (let at = 0; at < chunk.length; at += 65_536) {
        if (!stream.write(frame(kind, chunk.subarray(at, at + 65_536)))) {
          channel.stdout.pause();
          channel.stderr.pause();
        }
      }
    };
    stream.on('drain', () => {
      channel.stdout.resume();
      channel.stderr.resume();
    });
    channel.stdout.on('data', send(STDOUT));
    channel.stderr.on('data', send(STDERR));
    // stdin: the API's end of the request is the runner's end of input (it cleans up and exits).
    stream.pipe(channel.stdin);
    channel.stdin.on('error', (err) => log?.debug({ err }, 'node: a runner connection failed'));
    channel.onClose(() => {
      if (!stream.destroyed) stream.end();
    });
    stream.on('close', () => {
      // The API dropped the stream (not a clean end of input): drop the runner's connection too.
      if (stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR) channel.destroy();
    });
  }

  /** A template build: output lines as JSON lines; the stream's cancellation aborts it. */
  async function build(stream: ServerHttp2Stream): Promise<void> {
    const parsed = z
      .object({
        recipe,
        timeoutMs: z
          .number()
          .int()
          .positive()
          .max(24 * 3600 * 1000),
      })
      .safeParse(
        await readAll(stream)
          .then((b) => JSON.parse(b.toString('utf8')))
          .catch(() => undefined),
      );
    if (!parsed.success) return answer(stream, 400, { error: { message: 'bad build request', gone: false } });
    if (!backend.images) return answer(stream, 200, { error: { message: 'this node builds no images', gone: false } });
    stream.respond({ ':status': 200, 'content-type': 'application/x-ndjson' });
    const abort = new AbortController();
    stream.on('close', () => abort.abort(new Error('the API cancelled the build')));
    const line = (v: unknown) => {
      if (!stream.destroyed) stream.write(`${JSON.stringify(v)}\n`);
    };
    try {
      await backend.images.build(parsed.data.recipe, {
        timeoutMs: parsed.data.timeoutMs,
        signal: abort.signal,
        onLine: (text) => line({ line: text }),
      });
      line({ done: true });
    } catch (err) {
      line({ error: wireError(backend, err) });
    }
    if (!stream.destroyed) stream.end();
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(o.port, o.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as { port: number }).port;
  // A container's hard lifetime holds on its host even when no API replica is left to reap it:
  // a resumed one's as the resume moved it on; a paused one's (stopped, its checkpoint beside it)
  // up to the longest paused time past it, since only the replicas know each one's.
  const reap = async () => {
    let removed = 0;
    const listed = await backend.list();
    const gone = new Set<string>();
    const ids = new Set(listed.map((c) => c.id));
    for (const id of moved.keys()) if (!ids.has(id)) moved.delete(id);
    for (const c of listed) {
      const ends = moved.get(c.id) ?? c.expiresAt;
      if (ends === undefined || ends + (c.stopped ? maxPausedMs : 0) >= Date.now()) continue;
      await own.remove(c.id);
      moved.delete(c.id);
      gone.add(c.id);
      removed++;
    }
    if (removed) log?.info({ removed }, 'node: removed containers past their lifetime');
    // Workspace mounts whose container is gone (removed past the node's back, or before a restart).
    if (trees) await sweepMounts(listed.filter((c) => !gone.has(c.id)));
    return removed;
  };
  async function sweepMounts(live: { sandboxId: string }[]): Promise<void> {
    const ids = new Set(live.map((c) => c.sandboxId));
    await trees!.mounts.sweep((id) => ids.has(id) || mounting.has(id));
  }
  // What an earlier life of the node left: mounts of containers gone since, the sizes of the others.
  if (trees) await sweepMounts(await backend.list());
  const reaper = setInterval(
    () => void reap().catch((err) => log?.warn({ err }, 'node: the lifetime reaper failed')),
    o.reapMs ?? 60_000,
  );
  reaper.unref();
  return {
    url: `https://${o.host.includes(':') ? `[${o.host}]` : o.host}:${port}`,
    port,
    reap,
    close: () =>
      new Promise<void>((resolve) => {
        clearInterval(reaper);
        for (const s of sessions) s.close();
        server.close(() => resolve());
        for (const s of sessions) s.destroy();
      }),
  };
}

/** A stream's bytes, read as a head of known sizes and then the rest. */
function chunks(stream: AsyncIterable<Buffer>): { take(n: number): Promise<Buffer>; rest(): AsyncIterable<Buffer> } {
  const it = stream[Symbol.asyncIterator]();
  let held: Buffer = Buffer.alloc(0);
  return {
    async take(n) {
      const parts = [held];
      let have = held.length;
      while (have < n) {
        const next = await it.next();
        if (next.done) throw new Error('the stream ended early');
        parts.push(next.value);
        have += next.value.length;
      }
      const all = parts.length === 1 ? held : Buffer.concat(parts, have);
      held = all.subarray(n);
      return all.subarray(0, n);
    },
    async *rest() {
      if (held.length) yield held;
      held = Buffer.alloc(0);
      for (let next = await it.next(); !next.done; next = await it.next()) yield next.value;
    },
  };
}
