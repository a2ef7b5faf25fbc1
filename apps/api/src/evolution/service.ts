import { Cron } from 'croner';
import { and, desc, eq, inArray, isNull, sql } from 'drizzle-orm';
import { ModelError } from '../agent/llm.ts';
import { rowsOf } from '../db/rows.ts';
import { commits, evolutions, messages, runs, sessions, workspaces } from '../db/schema/index.ts';
import { ACTIVE_RUN_STATUSES } from '../db/schema/runs.ts';
import { ApiError } from '../lib/errors.ts';
import { ReleaseJob, type JobRow, type JobRunner } from '../jobs/runner.ts';
import { newId } from '../lib/ids.ts';
import type { Provenance } from '../workspace/git-repos.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { InvalidDream, runDream } from './dream.ts';
import { endEvolution, startEvolution, type EvolutionKind, type EvolutionRow } from '../evolution-log/evolutions.ts';
import { finishCommittedReview, runReview, type EvolutionDeps } from './review.ts';
import { undoEvolution } from '../evolution-log/undo.ts';

const REVIEW_JOB = 'evolution.review';
const DREAM_JOB = 'evolution.dream';
/** After a restart, scheduled dreams missed within this window still run (once). */
const CATCH_UP_MS = 24 * 3600_000;

type Payload = { evolution_id: string; days?: number };

export interface EvolutionOptions {
  /** How often idle sessions and dream schedules are checked. */
  tickMs: number;
}

/**
 * Self-evolution as durable jobs (review and dream): reviews of idle sessions and
 * nightly dreams are rows in `jobs`, each with its `evolutions` row created in the same
 * statement; any replica's runner may take them, none runs one twice, and a restart loses none.
 */
export class EvolutionService {
  private timer: NodeJS.Timeout | undefined;
  private lastDreamCheck: number | undefined;
  private readonly aborts = new Set<AbortController>();

  constructor(
    private readonly deps: EvolutionDeps,
    readonly jobs: JobRunner,
    private readonly opts: EvolutionOptions,
  ) {
    jobs.handle(REVIEW_JOB, (p: Payload, job) => this.execute('review', p, job));
    jobs.handle(DREAM_JOB, (p: Payload, job) => this.execute('dream', p, job));
  }

  /** Schedules reviews and dreams from now on (the job runner that runs them is started by compose). */
  async start(): Promise<void> {
    this.timer = setInterval(
      () => void this.tick().catch((err) => this.deps.log.error({ err }, 'evolution tick failed')),
      this.opts.tickMs,
    );
    this.timer.unref();
    void this.tick().catch((err) => this.deps.log.error({ err }, 'evolution tick failed'));
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    for (const a of this.aborts) a.abort(new Error('shutdown'));
  }

  // ---- requests ------------------------------------------------------------------------

  /** POST …/review: the named session, or the workspace's most recently active one. */
  async requestReview(ws: WorkspaceRow, sessionId?: string): Promise<EvolutionRow> {
    const [session] = await this.deps.db
      .select()
      .from(sessions)
      .where(and(eq(sessions.workspaceId, ws.id), sessionId ? eq(sessions.id, sessionId) : undefined))
      .orderBy(desc(sessions.lastActivityAt))
      .limit(1);
    if (!session)
      throw sessionId
        ? ApiError.notFound('session')
        : new ApiError('conflict', 'this workspace has no session to review');
    const [active] = await this.deps.db
      .select({ id: runs.id })
      .from(runs)
      .where(and(eq(runs.sessionId, session.id), inArray(runs.status, ACTIVE_RUN_STATUSES)));
    if (active)
      throw new ApiError(
        'session_busy',
        'the session has a run that has not finished; it is reviewed once it is idle',
        { run_id: active.id },
      );
    return (await this.enqueue(ws, 'review', session.id, {}))!;
  }

  /** POST …/dream: consolidate the last `days` days now. */
  async requestDream(ws: WorkspaceRow, days: number): Promise<EvolutionRow> {
    return (await this.enqueue(ws, 'dream', null, { days }))!;
  }

  /**
   * The job and its evolution row in one statement; with a `dedupeKey` already used, neither is
   * written and the answer is null (a scheduled review or dream already queued by any replica).
   */
  private async enqueue(
    ws: { id: string; teamId: string },
    kind: EvolutionKind,
    sessionId: string | null,
    extra: { days?: number },
    dedupeKey?: string,
  ): Promise<EvolutionRow | null> {
    const id = newId('evo');
    const payload: Payload = { evolution_id: id, ...extra };
    const result = await this.deps.db.execute(sql`
      with job as (
        insert into jobs (id, kind, payload, dedupe_key, run_at, max_attempts)
        values (${newId('job')}, ${kind === 'review' ? REVIEW_JOB : DREAM_JOB}, ${JSON.stringify(payload)}::jsonb, ${dedupeKey ?? null}, now(), 3)
        on conflict do nothing
        returning id)
      insert into evolutions (id, team_id, workspace_id, session_id, kind, status)
      select ${id}, ${ws.teamId}, ${ws.id}, ${sessionId}, ${kind}, 'queued' from job
      returning id`);
    if (!rowsOf<{ id: string }>(result).length) return null;
    this.jobs.wake();
    const [row] = await this.deps.db.select().from(evolutions).where(eq(evolutions.id, id));
    return row!;
  }

  // ---- the scheduler -------------------------------------------------------------------

  /**
   * Queues what is due: a review for every session idle for `review_idle_minutes` with at least
   * `review_min_turns` turns since its last review and no run going; a dream for every workspace
   * whose `dream_cron` (in its time zone) fired since the last tick. Every replica ticks; the
   * dedupe keys make each happen once.
   */
  async tick(now = new Date()): Promise<{ reviews: number; dreams: number }> {
    return { reviews: await this.scheduleReviews(now), dreams: await this.scheduleDreams(now) };
  }

  /** Reviews for idle sessions with enough new turns; returns how many were queued. */
  async scheduleReviews(now = new Date()): Promise<number> {
    let queued = 0;
    for (const s of await this.idleSessions(now)) {
      if (
        await this.enqueue(s, 'review', s.session_id, {}, `review:${s.session_id}:${new Date(s.active_at).getTime()}`)
      )
        queued++;
    }
    return queued;
  }

  /** Dreams for workspaces whose cron fired since the last look (a day back after a start); returns how many were queued. */
  async scheduleDreams(now = new Date()): Promise<number> {
    const since = this.lastDreamCheck ?? now.getTime() - CATCH_UP_MS;
    this.lastDreamCheck = now.getTime();
    let queued = 0;
    const live = (await this.deps.db.select().from(workspaces).where(isNull(workspaces.deletedAt))) as WorkspaceRow[];
    for (const ws of live) {
      const ev = ws.settings.evolution;
      if (!ev.dream_enabled) continue;
      const fired = new Cron(ev.dream_cron, { timezone: ev.timezone, paused: true }).previousRuns(1, now)[0];
      if (!fired || fired.getTime() <= since || fired.getTime() <= ws.createdAt.getTime()) continue;
      if (await this.enqueue(ws, 'dream', null, { days: 1 }, `dream:${ws.id}:${fired.toISOString()}`)) queued++;
    }
    return queued;
  }

  private async idleSessions(now: Date) {
    const result = await this.deps.db.execute(sql`
      select s.id as session_id, s.team_id as "teamId", s.workspace_id as id, x.active_at
      from sessions s
      join workspaces w on w.id = s.workspace_id and w.deleted_at is null
      cross join lateral (select greatest(s.last_activity_at, (select max(r.finished_at) from runs r where r.session_id = s.id)) as active_at) x
      where coalesce((w.settings->'evolution'->>'review_enabled')::boolean, true)
        and x.active_at <= ${now.toISOString()}::timestamptz - make_interval(mins => coalesce((w.settings->'evolution'->>'review_idle_minutes')::int, 10))
        and x.active_at > ${now.toISOString()}::timestamptz - interval '7 days'
        and (s.last_reviewed_at is null or s.last_reviewed_at < x.active_at)
        and not exists (select 1 from runs r where r.session_id = s.id and r.status in ('queued', 'in_progress', 'requires_action'))
        and (select count(*) from ${messages} m where m.session_id = s.id and m.role = 'user' and m.content not like 'Kiln System:%'
               and m.created_at > coalesce(s.last_reviewed_at, 'epoch'::timestamptz))
            >= coalesce((w.settings->'evolution'->>'review_min_turns')::int, 6)`);
    return rowsOf<{ session_id: string; teamId: string; id: string; active_at: string | Date }>(result);
  }

  // ---- running -------------------------------------------------------------------------

  private async execute(kind: EvolutionKind, p: Payload, job: JobRow): Promise<void> {
    const { db, log } = this.deps;
    const evo = await startEvolution(db, p.evolution_id);
    if (!evo) return;
    // Committed before a crash, but not recorded: finish the record (and tell the session) instead of evolving twice.
    const [made] = await db.select().from(commits).where(eq(commits.evolutionId, evo.id));
    if (made && kind === 'review') return finishCommittedReview(this.deps, evo, made);
    if (made)
      return endEvolution(db, evo.id, {
        status: 'committed',
        commitSha: made.sha,
        changedPaths: made.paths,
        summary: made.summary,
      });
    const [ws] = (await db
      .select()
      .from(workspaces)
      .where(and(eq(workspaces.id, evo.workspaceId!), isNull(workspaces.deletedAt)))) as WorkspaceRow[];
    if (!ws) return endEvolution(db, evo.id, { status: 'skipped', summary: 'the workspace was deleted' });
    const abort = new AbortController();
    this.aborts.add(abort);
    try {
      if (kind === 'review') await runReview(this.deps, evo, ws, abort.signal);
      else await runDream(this.deps, evo, ws, p.days ?? 1, abort.signal);
    } catch (err) {
      // Shutting down: back to the queue untouched; this or another replica takes it again.
      if (abort.signal.aborted) throw new ReleaseJob('shutdown');
      const final =
        job.attempts >= job.maxAttempts ||
        err instanceof InvalidDream ||
        (err instanceof ModelError && err.code === 'model_not_configured');
      log.warn({ err, evolution: evo.id, kind, attempt: job.attempts, final }, 'evolution failed');
      if (!final) throw err;
      await endEvolution(db, evo.id, { status: 'failed', error: (err as Error).message });
    } finally {
      this.aborts.delete(abort);
    }
  }

  // ---- undo ----------------------------------------------------------------------------

  undo(ws: WorkspaceRow, evolutionId: string, prov: Provenance) {
    return undoEvolution(this.deps.db, this.deps.workspaces, ws, evolutionId, prov);
  }
}
