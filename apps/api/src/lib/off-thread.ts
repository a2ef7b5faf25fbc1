import { Worker } from 'node:worker_threads';

/**
 * A worker thread for CPU-bound work on untrusted input (tokenizing a sandbox's output, parsing
 * a runner's large frames), so that work never holds the event loop that answers every team.
 *
 * The worker file is plain JavaScript (`.mjs`) beside the module that names it, located by
 * `import.meta.url`: Node starts workers itself, outside tsx's or vitest's TypeScript loaders,
 * so the same file works under tsx, vitest and plain node. It answers `{ id, ...request }` with
 * `{ id, ok }` or `{ id, error }`.
 *
 * The thread starts on first use and keeps the process alive only while a request is pending.
 * If it dies, what was pending fails and the next request starts a new thread.
 */
/** A request that did not finish within its deadline of work (its thread was then replaced). */
export class DeadlineExceeded extends Error {}

export class OffThread<Request extends object, Result> {
  private worker: Worker | undefined;
  private readonly pending = new Map<
    number,
    { resolve: (v: Result) => void; reject: (e: Error) => void; started: () => void }
  >();
  private nextId = 1;

  constructor(
    private readonly file: URL,
    private readonly name: string,
  ) {}

  /**
   * With `deadlineMs`, a request still running that long after the thread began working on it is
   * rejected with `DeadlineExceeded` and the thread is replaced: the other requests it had fail
   * with an ordinary error (safe to retry). The clock starts when the thread says it has begun
   * the request (serve-thread.mjs), not when it is sent: a thread still loading its modules
   * (a new one, after a replacement, on a busy host) or busy with the requests queued before
   * this one, another tenant's among them, costs this request nothing of its deadline.
   */
  run(request: Request, transfer: ArrayBuffer[] = [], deadlineMs?: number): Promise<Result> {
    const worker = this.start();
    const id = this.nextId++;
    return new Promise<Result>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle =
        <T>(fn: (v: T) => void) =>
        (v: T) => {
          clearTimeout(timer);
          fn(v);
        };
      const started = () => {
        if (deadlineMs === undefined || timer) return;
        timer = setTimeout(() => {
          this.pending.delete(id);
          reject(new DeadlineExceeded(`it did not finish within ${deadlineMs / 1000} s`));
          if (this.worker === worker) {
            this.worker = undefined;
            this.fail(new Error(`the ${this.name} thread was restarted after a request ran past its deadline`));
          }
          void worker.terminate();
        }, deadlineMs);
      };
      this.pending.set(id, { resolve: settle(resolve), reject: settle(reject), started });
      if (this.pending.size === 1) worker.ref();
      worker.postMessage({ id, ...request }, transfer);
    });
  }

  /** Stops the thread; what is pending fails. */
  async close(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    this.fail(new Error(`the ${this.name} thread was closed`));
    await worker?.terminate();
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    const worker = new Worker(this.file, { name: this.name });
    worker.unref();
    worker.on('message', (msg: { id: number; started?: true; ok?: Result; error?: string }) => {
      const waiting = this.pending.get(msg.id);
      if (!waiting) return;
      if (msg.started) {
        waiting.started();
        return;
      }
      this.pending.delete(msg.id);
      if (this.pending.size === 0) worker.unref();
      if (msg.error !== undefined) waiting.reject(new Error(msg.error));
      else waiting.resolve(msg.ok as Result);
    });
    const gone = (err: Error) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.fail(err);
    };
    worker.on('error', gone);
    worker.on('exit', (code) => gone(new Error(`the ${this.name} thread exited (code ${code})`)));
    this.worker = worker;
    return worker;
  }

  private fail(err: Error): void {
    for (const waiting of this.pending.values()) waiting.reject(err);
    this.pending.clear();
  }
}
