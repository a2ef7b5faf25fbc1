import { createHash, createHmac } from 'node:crypto';
import { PassThrough } from 'node:stream';
import type {
  BackendCapabilities,
  ContainerRequest,
  ListedContainer,
  RunnerChannel,
  SandboxBackend,
  SandboxContainer,
  Usage,
} from '../../apps/api/src/sandbox/backend.ts';
import type { SandboxLimits } from '../../apps/api/src/sandbox/limits.ts';
import { SANDBOX_UID_COUNT, SANDBOX_UID_MIN } from '../../apps/api/src/sandbox/docker/container-spec.ts';
import { RUNNER_PROTOCOL } from '../../apps/api/src/sandbox/runner-client.ts';

/**
 * A second implementation of Kiln's own `SandboxBackend`, in process: containers are records,
 * and each runner is a small interpreter that speaks the real runner's frame protocol (length-
 * prefixed JSON, HMAC-signed after the host's key, results that echo the code's sha256). It is
 * honest about what a real backend refuses: an image it does not have, a container that is gone
 * (`isGone`: 404), a start of a removed container, a uid already taken. The same contract suite
 * (tests/support/backend-contract.ts) runs against it and the Docker backend.
 *
 * Its interpreter runs only what it understands: lines `name = <int or 'string'>` and
 * `print(<int, 'string' or name>)`, `raise <Name>`; any other line is a `FakeUnsupported` error.
 */
export class FakeBackend implements SandboxBackend {
  readonly containers = new Map<string, FakeContainer>();
  /** Every container ever created, in order (tests count them). */
  readonly created: string[] = [];
  /** Images this backend has; creating a container of another is refused, as the engine refuses an unknown image. */
  readonly imageRefs = new Set<string>();
  private seq = 0;
  /** Set to make `ping` fail (an engine that stopped answering). */
  down = false;
  /** Set to make `start` fail with this reason, as an engine whose runtime cannot start a container answers (500). */
  refuseStart: string | null = null;

  constructor(
    images: string[],
    private readonly caps: Partial<BackendCapabilities> = {},
  ) {
    for (const i of images) this.imageRefs.add(i);
  }

  async capabilities(): Promise<BackendCapabilities> {
    return {
      runtimes: [{ runtime: 'runc', egress: false }],
      hostWorkspaceMounts: false,
      // Memory, CPU and pids change in place; the disk (tmpfs sizes) only at creation.
      resizable: (from: SandboxLimits, to: SandboxLimits) => from.diskMb === to.diskMb,
      teamBound: false,
      ...this.caps,
    };
  }

  async create(req: ContainerRequest): Promise<SandboxContainer> {
    if (!this.imageRefs.has(req.image)) throw gone(`No such image: ${req.image}`);
    if (req.network?.mode === 'allowlist') throw new Error('the fake backend has no egress');
    const taken = new Set([...this.containers.values()].map((c) => c.uid));
    let uid: number;
    do uid = SANDBOX_UID_MIN + Math.floor(Math.random() * SANDBOX_UID_COUNT);
    while (taken.has(uid));
    const id = `fake${(++this.seq).toString(16).padStart(12, '0')}`;
    this.containers.set(id, new FakeContainer(id, uid, req));
    this.created.push(id);
    return { id, uid, runtime: req.runtime };
  }

  private get(id: string): FakeContainer {
    const c = this.containers.get(id);
    if (!c) throw gone(`No such container: ${id}`);
    return c;
  }

  async start(container: SandboxContainer): Promise<void> {
    const c = this.get(container.id);
    if (this.refuseStart)
      throw Object.assign(new Error(`(HTTP code 500) server error - ${this.refuseStart}`), { statusCode: 500 });
    c.running = true;
  }

  async attachRunner(container: SandboxContainer): Promise<RunnerChannel> {
    const c = this.get(container.id);
    if (!c.running) throw Object.assign(new Error(`container ${container.id} is not running`), { statusCode: 409 });
    return c.attach();
  }

  async update(container: SandboxContainer, limits: SandboxLimits): Promise<void> {
    this.get(container.id).req.limits = limits;
  }

  async remove(containerId: string): Promise<void> {
    const c = this.containers.get(containerId);
    if (!c) return;
    this.containers.delete(containerId);
    c.kill();
  }

  async list(): Promise<ListedContainer[]> {
    return [...this.containers.values()].map((c) => ({
      id: c.id,
      sandboxId: c.req.sandboxId,
      instance: c.req.instance,
      expiresAt: c.req.expiresAt.getTime(),
    }));
  }

  async stats(containerId: string): Promise<Usage | null> {
    const c = this.containers.get(containerId);
    return c?.running ? { memoryBytes: 20 * 1024 * 1024 + c.vars.size * 64, cpuPercent: 0 } : null;
  }

  async ping(): Promise<void> {
    if (this.down) throw new Error('the fake engine is down');
  }

  isGone(err: unknown): boolean {
    return [404, 409].includes((err as { statusCode?: number } | undefined)?.statusCode ?? 0);
  }
}

const gone = (message: string) => Object.assign(new Error(message), { statusCode: 404 });

/** One fake container: its request, state and (at most one) runner. */
class FakeContainer {
  running = false;
  readonly vars = new Map<string, string | number>();
  readonly files = new Map<string, Buffer>();
  private runner: FakeRunner | undefined;

  constructor(
    readonly id: string,
    readonly uid: number,
    readonly req: ContainerRequest,
  ) {}

  attach(): RunnerChannel {
    this.runner?.end();
    this.runner = new FakeRunner(this);
    return this.runner.channel;
  }

  kill(): void {
    this.running = false;
    this.runner?.end();
  }
}

/** The runner's frame protocol over in-process streams (see sandbox-image/runner/kiln_runner.py). */
class FakeRunner {
  private readonly stdin = new PassThrough();
  private readonly stdout = new PassThrough();
  private readonly stderr = new PassThrough();
  private buf = Buffer.alloc(0);
  private key: Buffer | undefined;
  private closed: { err?: Error } | undefined;
  private readonly closeListeners: ((err?: Error) => void)[] = [];
  private tar: Buffer[] = [];
  readonly channel: RunnerChannel;

  constructor(private readonly c: FakeContainer) {
    this.stdin.on('data', (chunk: Buffer) => this.onData(chunk));
    this.stdin.on('finish', () => this.end());
    this.channel = {
      stdin: this.stdin,
      stdout: this.stdout,
      stderr: this.stderr,
      destroy: () => this.end(),
      onClose: (listener) => {
        if (this.closed) listener(this.closed.err);
        else this.closeListeners.push(listener);
      },
    };
    queueMicrotask(() => this.send({ ev: 'ready', protocol: RUNNER_PROTOCOL }));
  }

  end(): void {
    if (this.closed) return;
    this.closed = {};
    this.stdout.end();
    this.stderr.end();
    for (const l of this.closeListeners.splice(0)) l();
  }

  private send(msg: Record<string, unknown>): void {
    if (this.closed) return;
    const json = Buffer.from(JSON.stringify(msg));
    const body = this.key ? Buffer.concat([createHmac('sha256', this.key).update(json).digest(), json]) : json;
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length);
    this.stdout.write(Buffer.concat([head, body]));
  }

  private onData(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    while (this.buf.length >= 4) {
      const len = this.buf.readUInt32BE(0);
      if (this.buf.length < 4 + len) return;
      const msg = JSON.parse(this.buf.subarray(4, 4 + len).toString('utf8')) as Record<string, unknown>;
      this.buf = this.buf.subarray(4 + len);
      const answer = this.handle(msg);
      if (answer) this.send(answer);
    }
  }

  /** The frame that answers a request (an exec sends its own output and result). */
  private handle(msg: Record<string, unknown>): Record<string, unknown> | undefined {
    const id = msg.id as string;
    const ok = (extra: Record<string, unknown> = {}) => ({ ev: 'ok', id, ...extra });
    const fail = (message: string) => ({ ev: 'error', id, message });
    switch (msg.op) {
      case 'key':
        // Only the first key counts, as with the real runner.
        this.key ??= Buffer.from(msg.key as string, 'base64');
        return undefined;
      case 'ping':
        return ok({ busy: false });
      case 'put': {
        const data = Buffer.from(msg.data as string, 'base64');
        this.c.files.set(msg.path as string, data);
        return ok({ size: data.length });
      }
      case 'get': {
        const data = this.c.files.get(msg.path as string);
        if (!data) return fail(`no such file: ${msg.path}`);
        return { ev: 'file', id, data: data.toString('base64'), size: data.length };
      }
      case 'delete':
        this.c.files.delete(msg.path as string);
        return ok();
      case 'sync_in':
        return ok({ files: 0 });
      case 'sync_begin':
        this.tar = [];
        return ok();
      case 'sync_chunk':
        this.tar.push(Buffer.from(msg.data as string, 'base64'));
        return ok();
      case 'sync_end':
        return ok({ files: this.untar(Buffer.concat(this.tar.splice(0))) });
      case 'cancel':
        return undefined;
      case 'exec':
        this.exec(msg);
        return undefined;
      default:
        return fail(`unknown op ${String(msg.op)}`);
    }
  }

  /** Unpacks regular files of a ustar archive into /workspace; returns how many. */
  private untar(tar: Buffer): number {
    let n = 0;
    for (let at = 0; at + 512 <= tar.length; ) {
      const header = tar.subarray(at, at + 512);
      if (header.every((b) => b === 0)) break;
      const field = (from: number, len: number) =>
        header
          .subarray(from, from + len)
          .toString('utf8')
          .replace(/\0.*$/s, '');
      const name = (field(345, 155) ? `${field(345, 155)}/` : '') + field(0, 100);
      const size = Number.parseInt(field(124, 12).trim() || '0', 8);
      const type = field(156, 1);
      if (type === '0' || type === '') {
        this.c.files.set(
          `/workspace/${name.replace(/^\.\//, '')}`,
          Buffer.from(tar.subarray(at + 512, at + 512 + size)),
        );
        n++;
      }
      at += 512 + Math.ceil(size / 512) * 512;
    }
    return n;
  }

  private exec(msg: Record<string, unknown>): void {
    const code = msg.code as string;
    const started = performance.now();
    let stdout = '';
    let error: { type: string; message: string } | null = null;
    const value = (expr: string): string | number => {
      const e = expr.trim();
      if (/^-?\d+$/.test(e)) return Number(e);
      const s = /^'([^']*)'$|^"([^"]*)"$/.exec(e);
      if (s) return s[1] ?? s[2]!;
      if (this.c.vars.has(e)) return this.c.vars.get(e)!;
      throw { type: 'NameError', message: `name '${e}' is not defined` };
    };
    try {
      for (const line of code.split('\n')) {
        const l = line.trim();
        if (!l || l.startsWith('#')) continue;
        const assign = /^([A-Za-z_]\w*)\s*=\s*(.+)$/.exec(l);
        const print = /^print\((.*)\)$/.exec(l);
        const raise = /^raise\s+([A-Za-z_]\w*)/.exec(l);
        if (assign) this.c.vars.set(assign[1]!, value(assign[2]!));
        else if (print) {
          const out = `${value(print[1]!)}\n`;
          stdout += out;
          this.send({ ev: 'out', id: msg.id, stream: 'stdout', data: out });
        } else if (raise) throw { type: raise[1], message: '' };
        else throw { type: 'FakeUnsupported', message: `the fake runner cannot run: ${l.slice(0, 80)}` };
      }
    } catch (e) {
      error = e as { type: string; message: string };
    }
    this.send({
      ev: 'result',
      id: msg.id,
      code_sha256: createHash('sha256').update(code, 'utf8').digest('hex'),
      ok: error === null,
      exit_code: error ? 1 : 0,
      error,
      stdout,
      stderr: '',
      stdout_bytes: Buffer.byteLength(stdout),
      stderr_bytes: 0,
      truncated: false,
      duration_ms: Math.round(performance.now() - started),
      artifacts: [],
      restarted: false,
      ...(msg.sync ? { changes: { changed: [], deleted: [], skipped: [] } } : {}),
    });
  }
}
