import { OffThread } from '../lib/off-thread.ts';
import { maskFiles } from './mask-job.mjs';
import { Masker, patternsOf } from './masker.mjs';
import { ApiError } from '../lib/errors.ts';
import { type OpenSecret, type SecretSource, SecretUnreadable } from './store.ts';

/** A live output listener (as the sandbox's runner client calls it). */
type OutputListener = (stream: 'stdout' | 'stderr', data: string) => void;

/**
 * What `result` masks in an execution's result (the runner's, sandbox/runner-client.ts, which
 * carries more: every other field is kept as it is).
 */
interface MaskableResult {
  stdout: string;
  stderr: string;
  error: { message: string; traceback?: string } | null;
  artifacts: { name: string; mime: string; base64: string }[];
  changes?: {
    changed: { path: string; data: string }[];
    deleted: string[];
    skipped: { path: string; reason: string }[];
  };
}

/** Results up to this many characters are masked on the event loop; larger ones in the mask thread. */
const INLINE_CHARS = 256 * 1024;

const thread = new OffThread<
  { secrets: OpenSecret[]; texts: string[]; files: string[] },
  { texts: string[]; files: string[] }
>(new URL('./mask.worker.mjs', import.meta.url), 'secret masking');

/**
 * One execution's secrets: what the interpreter gets as its environment, and the masking of
 * everything that comes back from the sandbox, done here on the host (the sandbox is not
 * trusted to hide them). A value is masked as `[secret:NAME]`, and so are its base64 forms.
 */
export class SecretMask {
  private readonly masker: Masker;

  constructor(private readonly secrets: OpenSecret[]) {
    this.masker = new Masker(patternsOf(secrets));
  }

  get empty(): boolean {
    return this.secrets.length === 0;
  }

  /** The interpreter's environment variables for this execution. */
  env(): Record<string, string> {
    return Object.fromEntries(this.secrets.map((s) => [s.name, s.value]));
  }

  /** Masks a short text (a log line, a reason). */
  text(s: string): string {
    return this.masker.mask(s);
  }

  /**
   * Wraps a live output listener: each stream is masked as it comes, holding back only what may
   * still be the start of a value split across writes; `flush` passes that on once the
   * execution is over.
   */
  listener(onOutput: OutputListener | undefined): { onOutput?: OutputListener; flush(): void } {
    if (!onOutput || this.empty) return { onOutput, flush: () => undefined };
    const streams = { stdout: this.masker.stream(), stderr: this.masker.stream() };
    return {
      onOutput: (stream, data) => {
        const out = streams[stream]?.push(data);
        if (out) onOutput(stream, out);
      },
      flush: () => {
        for (const stream of ['stdout', 'stderr'] as const) {
          const rest = streams[stream].end();
          if (rest) onOutput(stream, rest);
        }
      },
    };
  }

  /**
   * A file's bytes with every value masked (and its base64 forms), every other byte kept: what
   * a sandbox hands back as a file is the sandbox's, as untrusted as its output. Large files are
   * masked off the event loop.
   */
  async bytes(data: Buffer): Promise<Buffer> {
    if (this.empty || data.length === 0) return data;
    const b64 = data.toString('base64');
    const [masked] =
      b64.length <= INLINE_CHARS
        ? maskFiles(this.secrets, [b64])
        : (await thread.run({ secrets: this.secrets, texts: [], files: [b64] })).files;
    return masked === b64 ? data : Buffer.from(masked!, 'base64');
  }

  /**
   * The result with every value masked: output, error, the artifacts (their bytes too: code runs
   * in the same interpreter as the runner's figure export and can put any bytes in them), and
   * the workspace changes it carries (file contents as bytes, paths and reasons as text). Large
   * results are masked off the event loop.
   */
  async result<R extends MaskableResult>(r: R): Promise<R> {
    if (this.empty) return r;
    const c = r.changes;
    const texts = [
      r.stdout,
      r.stderr,
      r.error?.message ?? '',
      r.error?.traceback ?? '',
      ...(c?.changed.map((f) => f.path) ?? []),
      ...(c?.deleted ?? []),
      ...(c?.skipped.flatMap((s) => [s.path, s.reason]) ?? []),
      ...r.artifacts.flatMap((a) => [a.name, a.mime]),
    ];
    const files = [...(c?.changed.map((f) => f.data) ?? []), ...r.artifacts.map((a) => a.base64)];
    const size = texts.reduce((n, t) => n + t.length, 0) + files.reduce((n, f) => n + f.length, 0);
    const masked =
      size <= INLINE_CHARS
        ? { texts: texts.map((x) => this.masker.mask(x)), files: maskFiles(this.secrets, files) }
        : await thread.run({ secrets: this.secrets, texts, files });
    const t = masked.texts;
    let i = 4;
    const next = () => t[i++]!;
    const out: R = { ...r, stdout: t[0]!, stderr: t[1]! };
    if (r.error)
      out.error = { ...r.error, message: t[2]!, ...(r.error.traceback !== undefined ? { traceback: t[3]! } : {}) };
    let k = 0;
    if (c) {
      const changed = c.changed.map(() => ({ path: next(), data: masked.files[k++]! }));
      const deleted = c.deleted.map(() => next());
      const skipped = c.skipped.map(() => ({ path: next(), reason: next() }));
      out.changes = { ...c, changed, deleted, skipped };
    }
    out.artifacts = r.artifacts.map(() => ({ name: next(), mime: next(), base64: masked.files[k++]! }));
    return out;
  }
}

/**
 * The mask of a workspace's secret values, for files and names on their way to a person or the
 * model: a file code wrote may hold what the code was given, as its output may. Without the
 * workspace's secrets (sealed with another key) nothing can be masked, so nothing is given.
 */
export async function workspaceMask(source: SecretSource, workspaceId: string): Promise<SecretMask> {
  try {
    return new SecretMask(await source.openAll(workspaceId));
  } catch (err) {
    if (err instanceof SecretUnreadable)
      throw new ApiError('conflict', `the workspace's secrets cannot be read to mask what it holds: ${err.message}`);
    throw err;
  }
}
