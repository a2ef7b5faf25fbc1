import { and, eq, inArray, or, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { rowsOf } from '../db/rows.ts';
import { templates } from '../db/schema/index.ts';
import { type JobRow, type JobRunner, ReleaseJob } from '../jobs/runner.ts';
import { ApiError } from '../lib/errors.ts';
import {
  type BuildShortfall,
  type ImageBuilder,
  ImageBuildFailed,
  type ImageRecipe,
  TEMPLATE_LABEL,
} from '../sandbox/backend.ts';
import type { TemplateOptions } from './service.ts';
import { imageTag, TEMPLATE_FILES_DIR, type BuildSources, type TemplateSpec } from './spec.ts';

export const TEMPLATE_BUILD_JOB = 'template.build';
/** A build interrupted (its process gone) more often than this is failed rather than tried again. */
const MAX_INTERRUPTIONS = 3;
/** How much of the end of the output a failed build's reason quotes. */
const REASON_LINES = 15;
const FLUSH_MS = 1000;
const PENDING = ['queued', 'building'] as const;
/**
 * When a fleet's build leaves the image on some hosts only, those it is missing on are tried again
 * after these waits (then at the next change of the fleet: a host that joins or comes back).
 */
const SHORTFALL_RETRY_MS = [60_000, 240_000, 960_000, 3_600_000, 3_600_000] as const;

export interface BuildPayload {
  hash: string;
  spec: TemplateSpec;
  sources: BuildSources;
  /** The team whose template queued the build: the build lane's per-team limit counts by it. */
  group?: string;
  /**
   * The image of templates already ready, to be built where it is missing (a host that joined
   * since): their rows are left as they are, whatever the build does.
   */
  catchUp?: boolean;
  /** How many times this image was built again where an earlier build left it missing (SHORTFALL_RETRY_MS). */
  retry?: number;
  /** Why it was queued, when no one saved a template (its base changed): the build's log says it first. */
  because?: string;
}

/** The templates waiting for this hash's build. */
const pendingFor = (hash: string) => and(eq(templates.specHash, hash), inArray(templates.status, [...PENDING]));

/**
 * What a failed step said of its own failure, to put before Docker's "returned a non-zero code":
 * pip's `ERROR:` lines (a package the index does not have, a version that does not exist) and
 * apt's `E:` lines (a package Debian does not have).
 */
function causeOf(lines: string[]): string[] {
  return lines.filter((l) => /^(?:ERROR: |E: )/.test(l)).slice(-5);
}

/** A build's output, keeping the newest `max` bytes (the end says why it failed). */
class BuildLog {
  private text = '';
  private cut = false;
  constructor(private readonly max: number) {}
  line(s: string): void {
    this.text += `${s}\n`;
    if (this.text.length > this.max) {
      this.text = this.text.slice(this.text.length - this.max);
      this.text = this.text.slice(this.text.indexOf('\n') + 1);
      this.cut = true;
    }
  }
  toString(): string {
    return this.cut ? `[earlier output cut: the log keeps its last ${this.max} bytes]\n${this.text}` : this.text;
  }
  lastLines(n: number): string[] {
    return this.text.trimEnd().split('\n').slice(-n);
  }
}

/**
 * The template builds, as durable jobs in a lane of their own: one build per definition hash at a
 * time, whichever replica runs it; every template waiting for that hash gets the image (or the
 * failure and its reason), its output kept as it comes. A build stopped by a shutdown goes back to
 * the queue, to be resumed by the next runner.
 */
export class TemplateBuilds {
  private readonly building = new Set<{ abort: AbortController; done: Promise<unknown> }>();
  /** Set by `stop`: no build starts any more (a job claimed now goes back to the queue). */
  stopped = false;

  constructor(
    private readonly db: Db,
    private readonly images: ImageBuilder | null,
    private readonly jobRunner: JobRunner,
    private readonly opts: Pick<
      TemplateOptions,
      'maxLogBytes' | 'buildTimeoutMs' | 'buildConcurrency' | 'buildTeamConcurrency'
    >,
    private readonly log: Logger,
    /** Told when an image is in service (the warm pool may keep some of it). */
    private readonly onReady: () => void,
  ) {
    // A lane of their own: a build (minutes, up to the build timeout) never holds up a review or a
    // dream, and one team's builds take at most buildTeamConcurrency of the lane's slots (counted
    // across replicas), so another team's build starts as soon as a slot is free.
    const lane = {
      name: 'templates',
      concurrency: opts.buildConcurrency ?? 1,
      groupLimit: opts.buildTeamConcurrency ?? 1,
    };
    jobRunner.handle(TEMPLATE_BUILD_JOB, (p: BuildPayload, job) => this.run(p, job), lane);
  }

  /**
   * Queues a build. One per hash at a time, whichever replica asks: the job's dedupe key is the
   * hash, freed once its job has finished, so templates that ask while it is pending are finished
   * by it. A retry where a build left the image missing (`retry`) is keyed apart, by its number:
   * it is queued by the job of the build before it, which still holds that one's key.
   */
  async enqueue(payload: BuildPayload, runAt?: Date): Promise<void> {
    const dedupeKey = `${TEMPLATE_BUILD_JOB}:${payload.hash}${payload.retry ? `:retry-${payload.retry}` : ''}`;
    await this.db.execute(sql`
      update jobs set dedupe_key = null where dedupe_key = ${dedupeKey} and status in ('succeeded', 'failed')`);
    await this.jobRunner.enqueue(TEMPLATE_BUILD_JOB, payload, { maxAttempts: 3, dedupeKey, runAt });
  }

  /**
   * Says where a build left the image missing and queues the next try there (a catch-up build),
   * unless it was tried as often as SHORTFALL_RETRY_MS allows, or (for a first shortfall: a build
   * of the template, or a catch-up the fleet's change asked for) a retry of that image is already
   * queued, whose schedule goes on. A line of it for the build's log.
   */
  private async shortfall(p: BuildPayload, tag: string, s: BuildShortfall, job: JobRow): Promise<string> {
    const retry = p.retry ?? 0;
    const where = s.missingOn.map((m) => m.host).join(', ');
    this.log.warn({ image: tag, missingOn: s.missingOn, retry }, 'a template’s image could not be built on every host');
    const said = `[kiln] not built on ${where}: its sandboxes go to the hosts that have it; `;
    const pending =
      !retry &&
      rowsOf(
        await this.db.execute(sql`
          select 1 from jobs where kind = ${TEMPLATE_BUILD_JOB} and status in ('queued', 'running')
            and payload->>'hash' = ${p.hash} and payload ? 'retry' and id <> ${job.id} limit 1`),
      ).length > 0;
    if (pending) return `${said}tried there again by the retry already queued`;
    const wait = SHORTFALL_RETRY_MS[retry];
    if (wait === undefined)
      return `${said}tried there again when a host joins or comes back, or when the template is saved again`;
    await this.enqueue({ ...p, catchUp: true, retry: retry + 1 }, new Date(Date.now() + wait));
    return `${said}tried there again in ${wait / 60_000} min`;
  }

  /** Stops builds in flight: their jobs go back to the queue. */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const b of this.building) b.abort.abort(new Error('shutdown'));
    await Promise.allSettled([...this.building].map((b) => b.done));
  }

  private need(): ImageBuilder {
    if (!this.images)
      throw new ApiError('unavailable', 'templates need a container runtime that builds images; this server has none');
    return this.images;
  }

  private async imageExists(ref: string): Promise<boolean> {
    return (await this.need().idOf(ref)) !== null;
  }

  /** Every template waiting for this hash's image has it now. */
  private async ready(hash: string, tag: string, log: BuildLog): Promise<void> {
    const replaced = await this.db.selectDistinct({ image: templates.image }).from(templates).where(pendingFor(hash));
    const n = await this.setPending(hash, {
      status: 'ready',
      image: tag,
      error: null,
      builtAt: new Date(),
      log: log.toString(),
    });
    // The images this one replaces, and this one if every template that wanted it was deleted or
    // changed meanwhile, go unless another template has them (or a running sandbox: Docker keeps those).
    for (const r of replaced) if (r.image && r.image !== tag) await this.removeUnused(r.image);
    if (n === 0) await this.removeUnused(tag);
    this.onReady();
  }

  /** Removes a template image no template of any team has (as its image or its pending build). */
  async removeUnused(image: string): Promise<void> {
    const hash = image.slice(image.indexOf(':') + 1);
    const others = await this.db
      .select({ id: templates.id })
      .from(templates)
      .where(or(eq(templates.image, image), eq(templates.specHash, hash)))
      .limit(1);
    // An image a running sandbox still uses stays (Docker refuses); the next delete or a prune takes it.
    if (!others.length && this.images) await this.images.remove(image);
  }

  /** Starts building `p`'s image as `tag`, its output into `log`; `stop()` aborts it until `finish`. */
  private launch(p: BuildPayload, tag: string, log: BuildLog) {
    const abort = new AbortController();
    const done = this.need().build(recipeOf(p, tag), {
      onLine: (l: string) => log.line(l),
      timeoutMs: this.opts.buildTimeoutMs,
      signal: abort.signal,
    });
    const entry = { abort, done: done.catch(() => undefined) };
    this.building.add(entry);
    return { abort, done, finish: () => this.building.delete(entry) };
  }

  /**
   * Builds a ready template's image where it is missing (the builder skips where it is), its
   * templates untouched: they stay ready for the hosts that have it. A failure is logged; one that
   * is not the build's own (a host that did not answer) is tried again as the job allows.
   */
  private async catchUp(p: BuildPayload, tag: string, job: JobRow): Promise<void> {
    const [inUse] = await this.db
      .select({ id: templates.id })
      .from(templates)
      .where(and(eq(templates.image, tag), eq(templates.status, 'ready')))
      .limit(1);
    if (!inUse || (await this.imageExists(tag))) return;
    const log = new BuildLog(this.opts.maxLogBytes);
    const { abort, done, finish } = this.launch(p, tag, log);
    try {
      const short = await done;
      if (short) await this.shortfall(p, tag, short, job);
      else this.log.info({ image: tag }, 'built a ready template’s image where it was missing');
      this.onReady();
    } catch (err) {
      if (abort.signal.aborted && !(err instanceof ImageBuildFailed)) throw new ReleaseJob();
      this.log.warn(
        { err, image: tag, output: log.lastLines(REASON_LINES) },
        'could not build a ready template’s image where it was missing',
      );
      if (!(err instanceof ImageBuildFailed) && job.attempts < job.maxAttempts) throw err;
    } finally {
      finish();
    }
  }

  private async setPending(hash: string, fields: Partial<typeof templates.$inferInsert>): Promise<number> {
    const rows = await this.db
      .update(templates)
      .set({ ...fields, updatedAt: new Date() })
      .where(pendingFor(hash))
      .returning({ id: templates.id });
    return rows.length;
  }

  private async run(p: BuildPayload, job: JobRow): Promise<void> {
    if (this.stopped) throw new ReleaseJob();
    const waiting = await this.db
      .select({ id: templates.id, log: templates.log })
      .from(templates)
      .where(pendingFor(p.hash))
      .orderBy(templates.id);
    const tag = imageTag(p.hash);
    if (!waiting.length) {
      if (p.catchUp) await this.catchUp(p, tag, job);
      return;
    }
    // What an interrupted attempt wrote stays at the top of the log.
    const log = new BuildLog(this.opts.maxLogBytes);
    const previous = waiting.find((w) => w.log)?.log;
    if (previous) {
      for (const line of previous.trimEnd().split('\n')) log.line(line);
      log.line('[kiln] resuming the build (the previous attempt was interrupted)');
    } else if (p.because) log.line(p.because);
    if (await this.imageExists(tag)) {
      log.line(`[kiln] cached: ${tag} exists`);
      await this.ready(p.hash, tag, log);
      return;
    }
    if (job.attempts > MAX_INTERRUPTIONS) {
      await this.setPending(p.hash, {
        status: 'failed',
        error: `the build was interrupted ${job.attempts - 1} times (the server stopped while it ran); PUT the template again to retry`,
      });
      return;
    }
    log.line(`[kiln] building ${tag} on ${p.sources.baseImageId}`);
    await this.setPending(p.hash, { status: 'building', error: null, log: log.toString() });
    let flushing: Promise<unknown> = Promise.resolve();
    const flush = () => {
      flushing = flushing.then(() =>
        this.db
          .update(templates)
          .set({ log: log.toString() })
          .where(and(eq(templates.specHash, p.hash), eq(templates.status, 'building')))
          .catch((err) => this.log.warn({ err }, 'could not save a template build log')),
      );
    };
    const timer = setInterval(flush, FLUSH_MS);
    const { abort, done, finish } = this.launch(p, tag, log);
    try {
      const short = await done;
      clearInterval(timer);
      await flushing;
      log.line(`[kiln] built ${tag}`);
      if (short) log.line(await this.shortfall(p, tag, short, job));
      await this.ready(p.hash, tag, log);
    } catch (err) {
      clearInterval(timer);
      await flushing;
      if (abort.signal.aborted && !(err instanceof ImageBuildFailed)) {
        log.line('[kiln] the server is stopping: the build resumes when a server takes its job again');
        await this.setPending(p.hash, { status: 'queued', log: log.toString() });
        throw new ReleaseJob();
      }
      if (!(err instanceof ImageBuildFailed) && job.attempts < job.maxAttempts) {
        log.line(`[kiln] the build could not run (${(err as Error).message}); it is tried again`);
        await this.setPending(p.hash, { status: 'queued', log: log.toString() });
        throw err;
      }
      const reason =
        err instanceof ImageBuildFailed
          ? [...causeOf(log.lastLines(REASON_LINES)), err.message, '', ...log.lastLines(REASON_LINES)].join('\n')
          : `the build could not run: ${(err as Error).message}`;
      log.line(`[kiln] failed: ${(err as Error).message}`);
      await this.setPending(p.hash, { status: 'failed', error: reason.slice(0, 8000), log: log.toString() });
    } finally {
      finish();
    }
  }
}

/** What a build job builds: its definition on its base, tagged and labelled with its hash. */
function recipeOf(p: BuildPayload, tag: string): ImageRecipe {
  return {
    base: p.sources.baseImageId,
    baseRef: p.sources.baseRef,
    tag,
    labels: { [TEMPLATE_LABEL]: p.hash },
    apt: p.spec.apt,
    pip: p.spec.pip,
    pipIndexUrl: p.sources.pipIndexUrl,
    debianMirror: p.sources.debianMirror,
    files: p.spec.files,
    filesDir: TEMPLATE_FILES_DIR,
    aptDay: new Date().toISOString().slice(0, 10),
  };
}
