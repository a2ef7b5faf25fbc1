import { and, eq, isNull, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { isUniqueViolation } from '../db/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { rowsOf } from '../db/rows.ts';
import { templates, workspaces } from '../db/schema/index.ts';
import type { JobRunner } from '../jobs/runner.ts';
import { withTeamLocked } from '../auth/teams.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { ImageBuilder } from '../sandbox/backend.ts';
import type { TemplateImages } from '../sandbox/live.ts';
import { type BuildPayload, TEMPLATE_BUILD_JOB, TemplateBuilds } from './build.ts';
import { canonicalSpec, imageTag, specHash, type BuildSources, type TemplateSpec } from './spec.ts';

export type TemplateRow = typeof templates.$inferSelect & { spec: TemplateSpec };

/** Lines of the build's output in GET /v1/templates/{template}; the whole (bounded) log is at …/log. */
const LOG_TAIL_LINES = 20;
const POOL_REFRESH_MS = 60_000;

export interface TemplateOptions {
  /** The base sandbox image (KILN_SANDBOX_IMAGE); templates are built on its id. */
  baseImage: string;
  pipIndexUrl: string;
  debianMirror?: string;
  buildTimeoutMs: number;
  maxLogBytes: number;
  /** The build lane (default one build at a time, one per team). */
  buildConcurrency?: number;
  buildTeamConcurrency?: number;
  /** Per team: templates, and templates queued or building (default: no cap). */
  maxPerTeam?: number;
  maxQueuedPerTeam?: number;
  /** Told the images of the templates workspaces use, whenever that may have changed (the warm pool keeps a few of each). */
  onPoolImages?: (images: string[]) => void;
}

const nameTaken = (name: string) =>
  new ApiError('conflict', `a template named ${JSON.stringify(name)} already exists in this team`);

/**
 * Sandbox templates: a team's definition (apt and pip packages, small files) built into an
 * image on the base sandbox image as a durable job, content-addressed so that the same inputs
 * (from any team) are built once. A rebuild replaces a template's image in service only once
 * it succeeds.
 */
export class TemplateService implements TemplateImages {
  private poolTimer: NodeJS.Timeout | undefined;
  /** The builds: the jobs that do the work (build.ts). */
  private readonly builds: TemplateBuilds;

  constructor(
    private readonly db: Db,
    private readonly images: ImageBuilder | null,
    jobRunner: JobRunner,
    private readonly opts: TemplateOptions,
    private readonly log: Logger,
  ) {
    this.builds = new TemplateBuilds(db, images, jobRunner, opts, log, () => void this.refreshPool());
    // A fleet's host that joins (or takes sandboxes again) gets the images of the templates built before.
    images?.onChange?.(() => void this.catchUp());
  }

  private catching: Promise<void> | undefined;
  /** Set while a catch-up runs and another was asked for meanwhile: it runs again once. */
  private catchAgain = false;

  /**
   * Brings every ready template's image up to date where sandboxes run (at start, and when a
   * fleet's hosts change): one built on a base sandbox image that is no longer the base is rebuilt
   * on the new one (`rebase`); one the builder lacks somewhere (a fleet's host that joined after the
   * build; an image removed by hand) is built there, by a job per image deduplicated with its
   * ordinary builds, which leaves the templates ready.
   */
  catchUp(): Promise<void> {
    if (this.catching) {
      this.catchAgain = true;
      return this.catching;
    }
    this.catching = this.queueMissing()
      .catch((err) => this.log.warn({ err }, 'could not queue the builds of template images a host lacks'))
      .finally(() => {
        this.catching = undefined;
        if (this.catchAgain) {
          this.catchAgain = false;
          void this.catchUp();
        }
      });
    return this.catching;
  }

  private async queueMissing(): Promise<void> {
    const images = this.images;
    if (!images) return;
    const ready = rowsOf<{ spec_hash: string; image: string; spec: TemplateSpec; team_id: string }>(
      await this.db.execute(sql`
        select distinct on (spec_hash) spec_hash, image, spec, team_id from templates
        where status = 'ready' and image is not null order by spec_hash, created_at`),
    ).filter((r) => r.image === imageTag(r.spec_hash));
    // Nowhere to build yet (a fleet none of whose hosts has been heard): the next change asks again.
    const baseImageId = ready.length ? await images.idOf(this.opts.baseImage) : null;
    if (!baseImageId) return;
    const sources = this.sourcesOn(baseImageId);
    // The builder's list when it keeps one (a fleet: what its members said at their heartbeat), else one image at a time.
    const held = images.held ? new Set(await images.held()) : null;
    for (const r of ready) {
      // Made on another base (or index, or mirror) than this server's now. (A fleet's hosts each
      // build on a base of their own, by name: its hashes name one host's.)
      if (!images.basePerHost && specHash(r.spec, sources) !== r.spec_hash) {
        await this.rebase(r, sources);
        continue;
      }
      if (held ? held.has(r.image) : await images.idOf(r.image)) continue;
      this.log.info({ image: r.image }, 'a template’s image is missing where sandboxes run: it is built there');
      await this.enqueue({ hash: r.spec_hash, spec: r.spec, sources, group: r.team_id, catchUp: true });
    }
  }

  /**
   * Rebuilds the templates of an image made from what this server no longer builds on (the base
   * sandbox image changed: an upgrade, `npm run sandbox:build`; or the package index or Debian
   * mirror it is configured with): as a save of the same definition would, the image they have
   * serving their sessions until the new one is ready. Once, whichever replica gets there first.
   */
  private async rebase(r: { spec_hash: string; image: string; spec: TemplateSpec }, sources: BuildSources) {
    const p = await this.plan(r.spec, sources);
    const why =
      `[kiln] what templates are built from changed (${this.opts.baseImage} is ${sources.baseImageId} now, ` +
      `packages from ${sources.pipIndexUrl}): built again on it`;
    const moved = await this.db
      .update(templates)
      .set({ specHash: p.hash, ...p.fields, ...(p.cached ? { log: `${why}\n${p.fields.log}` } : {}) })
      .where(and(eq(templates.specHash, r.spec_hash), eq(templates.status, 'ready'), eq(templates.image, r.image)))
      .returning({ teamId: templates.teamId });
    if (!moved.length) return;
    this.log.info(
      { image: r.image, now: imageTag(p.hash), templates: moved.length },
      'a template’s base changed: it is rebuilt on the new one',
    );
    if (!p.cached)
      return this.enqueue({
        hash: p.hash,
        spec: r.spec,
        sources,
        group: moved[0]!.teamId,
        because: `${why}; ${r.image} serves its sessions until then`,
      });
    await this.builds.removeUnused(r.image);
    void this.refreshPool();
  }

  private need(): ImageBuilder {
    if (!this.images)
      throw new ApiError('unavailable', 'templates need a container runtime that builds images; this server has none');
    return this.images;
  }

  private async sources(): Promise<BuildSources> {
    const baseImageId = await this.need().idOf(this.opts.baseImage);
    if (!baseImageId)
      throw new ApiError(
        'unavailable',
        `the base sandbox image ${this.opts.baseImage} is not built (npm run sandbox:build)`,
      );
    return this.sourcesOn(baseImageId);
  }

  /** What templates are built from, on the base image of this id. */
  private sourcesOn(baseImageId: string): BuildSources {
    return {
      baseImageId,
      baseRef: this.opts.baseImage,
      pipIndexUrl: this.opts.pipIndexUrl,
      debianMirror: this.opts.debianMirror,
    };
  }

  /** Writes the definition's hash on the row and either takes the image already built for it, or queues its build. */
  private async plan(spec: TemplateSpec, on?: BuildSources) {
    const sources = on ?? (await this.sources());
    const hash = specHash(spec, sources);
    const tag = imageTag(hash);
    const cached = (await this.need().idOf(tag)) !== null;
    const fields = cached
      ? {
          status: 'ready' as const,
          image: tag,
          error: null,
          log: `cached: ${tag} was built from these inputs before\n`,
          builtAt: new Date(),
        }
      : { status: 'queued' as const, error: null, log: '' };
    return { hash, sources, cached, fields };
  }

  private enqueue(payload: BuildPayload): Promise<void> {
    return this.builds.enqueue(payload);
  }

  /**
   * Runs `write` with the team's row locked, after checking the team's caps: its number of
   * templates (`adding` one) and of templates waiting for a build (when this one needs one, besides
   * `except`). Two requests at once, on any replica, are checked one after the other.
   */
  private withinCaps<T>(
    teamId: string,
    need: { adding: boolean; building: boolean; except?: string },
    write: (tx: Db) => Promise<T>,
  ): Promise<T> {
    return withTeamLocked(this.db, teamId, async (tx) => {
      const [held] = rowsOf<{ total: number; pending: number }>(
        await tx.execute(sql`select count(*)::int as total,
            count(*) filter (where status in ('queued', 'building') and id <> ${need.except ?? ''})::int as pending
          from templates where team_id = ${teamId}`),
      );
      const max = this.opts.maxPerTeam ?? Number.POSITIVE_INFINITY;
      if (need.adding && Number(held!.total) >= max)
        throw new ApiError(
          'conflict',
          `this team has ${held!.total} templates, the most this server allows a team (KILN_TEMPLATES_MAX_PER_TEAM=${max}): delete one first`,
        );
      const queued = this.opts.maxQueuedPerTeam ?? Number.POSITIVE_INFINITY;
      if (need.building && Number(held!.pending) >= queued)
        throw new ApiError(
          'rate_limited',
          `this team has ${held!.pending} template builds queued or running, the most it may have at once ` +
            `(KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM=${queued}): try again when one is ready or failed`,
          undefined,
          { 'retry-after': '30' },
        );
      return write(tx);
    });
  }

  async create(teamId: string, input: { name: string } & TemplateSpec): Promise<{ row: TemplateRow; cached: boolean }> {
    const { name, ...rest } = input;
    const spec = canonicalSpec(rest);
    const p = await this.plan(spec);
    const row = await this.withinCaps(teamId, { adding: true, building: !p.cached }, async (tx) => {
      const [made] = await tx
        .insert(templates)
        .values({
          id: newId('tpl'),
          teamId,
          name,
          spec,
          specHash: p.hash,
          ...p.fields,
          image: p.cached ? p.fields.image : null,
        })
        .onConflictDoNothing()
        .returning();
      if (!made) throw nameTaken(name);
      return made;
    });
    if (!p.cached) await this.enqueue({ hash: p.hash, spec, sources: p.sources, group: teamId });
    return { row: row as TemplateRow, cached: p.cached };
  }

  /** A new definition: the template is rebuilt; its image in service stays until the new one is ready. */
  async update(teamId: string, id: string, input: { name?: string } & TemplateSpec) {
    const before = await this.get(teamId, id);
    const { name, ...rest } = input;
    const spec = canonicalSpec(rest);
    const p = await this.plan(spec);
    const [after] = await this.withinCaps(teamId, { adding: false, building: !p.cached, except: id }, (tx) =>
      tx
        .update(templates)
        .set({ name: name ?? before.name, spec, specHash: p.hash, ...p.fields, updatedAt: new Date() })
        .where(and(eq(templates.id, id), eq(templates.teamId, teamId)))
        .returning()
        .catch((err: unknown) => {
          if (isUniqueViolation(err)) throw nameTaken(name!);
          throw err;
        }),
    );
    if (!after) throw ApiError.notFound('template');
    if (!p.cached) await this.enqueue({ hash: p.hash, spec, sources: p.sources, group: teamId });
    else void this.refreshPool();
    return { before, after: after as TemplateRow, cached: p.cached };
  }

  async get(teamId: string, id: string): Promise<TemplateRow> {
    const [row] = await this.db
      .select()
      .from(templates)
      .where(and(eq(templates.id, id), eq(templates.teamId, teamId)));
    if (!row) throw ApiError.notFound('template');
    return row as TemplateRow;
  }

  async list(teamId: string, p: ListParams): Promise<TemplateRow[]> {
    const c = cursorOn(templates.id, p);
    const rows = await this.db
      .select()
      .from(templates)
      .where(and(eq(templates.teamId, teamId), c.where))
      .orderBy(c.orderBy)
      .limit(c.limit);
    return rows as TemplateRow[];
  }

  /** The team's workspaces (not deleted) whose sandbox.template is this template. */
  private async usersOf(teamId: string, id: string): Promise<string[]> {
    const rows = await this.db
      .select({ id: workspaces.id })
      .from(workspaces)
      .where(
        and(
          eq(workspaces.teamId, teamId),
          isNull(workspaces.deletedAt),
          sql`${workspaces.settings}->'sandbox'->>'template' = ${id}`,
        ),
      )
      .limit(5);
    return rows.map((r) => r.id);
  }

  /** Deletes a template no workspace uses (409 otherwise); its image goes once no other template has it. */
  async remove(teamId: string, id: string): Promise<TemplateRow> {
    const before = await this.get(teamId, id);
    const users = await this.usersOf(teamId, id);
    if (users.length)
      throw new ApiError(
        'conflict',
        `template ${id} is the sandbox.template of ${users.join(', ')}; set theirs to another template or null first`,
      );
    await this.db.delete(templates).where(and(eq(templates.id, id), eq(templates.teamId, teamId)));
    for (const image of new Set([before.image, imageTag(before.specHash)]))
      if (image) await this.builds.removeUnused(image);
    void this.refreshPool();
    return before;
  }

  /** Refuses a workspace's `sandbox.template` that is not this team's (400) or has no image yet (409). */
  async checkUsable(teamId: string, id: string | null | undefined): Promise<void> {
    if (!id) return;
    const [row] = await this.db
      .select({ status: templates.status, image: templates.image })
      .from(templates)
      .where(and(eq(templates.id, id), eq(templates.teamId, teamId)));
    if (!row) {
      const message = `no template ${id} in this team`;
      throw new ApiError('invalid_request', `body.settings.sandbox.template: ${message}`, {
        details: [{ path: 'body.settings.sandbox.template', message }],
      });
    }
    if (!row.image)
      throw new ApiError(
        'conflict',
        row.status === 'failed'
          ? `template ${id} failed to build and has no image: read its error (GET /v1/templates/${id}), ` +
              `fix its definition with PUT /v1/templates/${id} (a rebuild), and use it once it is ready`
          : `template ${id} is ${row.status} and has no image yet; use it once GET /v1/templates/${id} says ready`,
      );
  }

  async imageOf(teamId: string, id: string): Promise<string> {
    const [row] = await this.db
      .select({ image: templates.image })
      .from(templates)
      .where(and(eq(templates.id, id), eq(templates.teamId, teamId)));
    if (!row)
      throw new ApiError(
        'conflict',
        `the workspace's template ${id} no longer exists; set sandbox.template to another or null`,
      );
    if (!row.image) throw new ApiError('conflict', `the workspace's template ${id} has no image yet`);
    return row.image;
  }

  /** The images of templates some workspace uses: the warm pool keeps a container or two of each. */
  async imagesInUse(): Promise<string[]> {
    const result = await this.db.execute(sql`
      select distinct t.image from templates t
      join workspaces w on w.team_id = t.team_id and w.settings->'sandbox'->>'template' = t.id
      where w.deleted_at is null and t.image is not null
      order by t.image`);
    return rowsOf<{ image: string }>(result).map((r) => r.image);
  }

  /** Tells the pool which template images are in use now (after a build, a delete, a workspace change). */
  refreshPool(): Promise<void> {
    const listener = this.opts.onPoolImages;
    if (!listener) return Promise.resolve();
    return this.imagesInUse().then(listener, (err) => this.log.warn({ err }, 'could not list the templates in use'));
  }

  /**
   * A template left queued or building with no build job to finish it (its job gone) is failed
   * with the reason; an interrupted build whose job remains is resumed by the job runner. (A
   * minute's grace: a template is written just before its job is queued.)
   */
  async start(): Promise<void> {
    this.builds.stopped = false;
    // Other replicas change which templates are in use too: the pool catches up at least this often.
    this.poolTimer = setInterval(() => void this.refreshPool(), POOL_REFRESH_MS);
    this.poolTimer.unref();
    await this.db.execute(sql`
      update templates set status = 'failed', updated_at = now(),
        error = 'the build was lost (its job no longer exists); PUT the template again to rebuild it'
      where status in ('queued', 'building') and updated_at < now() - interval '1 minute' and not exists (
        select 1 from jobs j where j.kind = ${TEMPLATE_BUILD_JOB} and j.status in ('queued', 'running')
          and j.payload->>'hash' = templates.spec_hash)`);
    await this.refreshPool();
    await this.catchUp();
  }

  /** Stops builds in flight: their jobs go back to the queue, to be resumed by the next runner. */
  async stop(): Promise<void> {
    clearInterval(this.poolTimer);
    await this.builds.stop();
  }
}

export const logTail = (log: string) => log.trimEnd().split('\n').filter(Boolean).slice(-LOG_TAIL_LINES);
