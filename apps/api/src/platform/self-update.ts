import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { and, eq, inArray, isNull, sql } from 'drizzle-orm';
import type { Logger } from 'pino';
import { alive, type RelayPlan, type RelayStatus } from '../../../relay/src/relay.ts';
import { recordAudit } from '../audit/audit.ts';
import type { Db } from '../db/client.ts';
import { platformUpdates, workspaces } from '../db/schema/index.ts';
import type { AuditDraft } from '../audit/draft.ts';
import type { SourceUpdateSink } from '../agent/source-update.ts';
import type { Principal } from '../auth/principal.ts';
import { ApiError } from '../lib/errors.ts';
import { cursorOn, type ListParams } from '../db/pagination.ts';
import { newId } from '../lib/ids.ts';
import { SANDBOX_IMAGE_LABEL } from '../sandbox/backend.ts';
import { connectDocker } from '../sandbox/docker/connect.ts';
import { webhookEventWrite } from '../webhooks/events.ts';
import {
  capLog,
  IDENTITY,
  isCheckWorktree,
  killGroup,
  PatchError,
  preparePatch,
  SourceError,
  removeWorktree,
  runSelfCheck,
  sourceGit,
  type CheckStep,
} from './self-check.ts';

export type UpdateRow = typeof platformUpdates.$inferSelect;
export type UpdateStatus = UpdateRow['status'];

export interface SelfUpdateOptions {
  sourceDir: string;
  dataDir: string;
  checkTimeoutMs: number;
  /** What the self-check's test step runs (default DEFAULT_CHECK_TESTS). */
  checkTests?: string[];
  stopTimeoutMs: number;
  readyTimeoutMs: number;
  dockerHost?: string;
  /** The image this server's sandboxes run (`KILN_SANDBOX_IMAGE`): rebuilt at a restart whose update changed sandbox-image/. */
  sandboxImage?: string;
}

export interface Version {
  commit: string | null;
  tree: string | null;
  branch: string | null;
  source_dir: string;
  pid: number;
  started_at: string;
}

/** The checkout this process runs from, and its relay, read once at start-up (before any update moves the checkout). */
const RUNNING_ROOT = fileURLToPath(new URL('../../../..', import.meta.url)).replace(/\/$/, '');
const RELAY_FILE = join(RUNNING_ROOT, 'apps/relay/src/relay.ts');

/**
 * Platform self-update: a patch to Kiln's own source is committed in a separate
 * worktree and self-checked there; applying it moves the source branch and hands the restart
 * to a detached relay (apps/relay), whose status file the surviving server reads to finish the
 * update's row. One update at a time: a second submit or apply meanwhile is `409 conflict`.
 * It is also where the agent's approved source-update proposals are submitted (the agent knows
 * only the sink's type, never this part).
 */
export class SelfUpdates implements SourceUpdateSink {
  /** The update holding the one-at-a-time lock (checking, applying, or being finished). */
  private holder: string | null = null;
  private readonly children = new Set<ChildProcess>();
  private readonly relaySource: string;
  private version!: Version;
  private watch: NodeJS.Timeout | undefined;

  constructor(
    private readonly db: Db,
    private readonly o: SelfUpdateOptions,
    private readonly log: Logger,
  ) {
    this.relaySource = readFileSync(RELAY_FILE, 'utf8');
  }

  private get git() {
    return sourceGit(this.o.sourceDir);
  }

  private dir(id: string): string {
    return join(this.o.dataDir, 'self-update', id);
  }

  /**
   * After a (re)start: reads the running commit, fails checks a restart cut short, removes their
   * worktrees, and follows an update being applied until its relay says how it ended.
   */
  async startup(): Promise<void> {
    const read = (args: string[]) =>
      this.git(args).then(
        (s) => s.trim(),
        () => null,
      );
    this.version = {
      commit: await read(['rev-parse', 'HEAD']),
      tree: await read(['rev-parse', 'HEAD^{tree}']),
      branch: await read(['symbolic-ref', '--short', 'HEAD']),
      source_dir: this.o.sourceDir,
      pid: process.pid,
      started_at: new Date().toISOString(),
    };
    const cut = await this.db
      .update(platformUpdates)
      .set({ status: 'failed', error: 'the server restarted during the self-check', finishedAt: new Date() })
      .where(eq(platformUpdates.status, 'checking'))
      .returning({ id: platformUpdates.id });
    for (const { id } of cut)
      await recordAudit(
        this.db,
        {
          action: 'system.update.check',
          resourceType: 'system_update',
          resourceId: id,
          teamId: null,
          after: { status: 'failed' },
        },
        undefined,
      );
    const worktrees = await read(['worktree', 'list', '--porcelain']);
    for (const line of worktrees?.split('\n') ?? []) {
      const path = /^worktree (.+)$/.exec(line)?.[1];
      // A self-check boots its server from such a worktree: that one must not remove itself.
      if (path && isCheckWorktree(path) && path !== RUNNING_ROOT) await removeWorktree(this.o.sourceDir, path);
    }
    const [applying] = await this.db.select().from(platformUpdates).where(eq(platformUpdates.status, 'applying'));
    if (applying) this.follow(applying.id);
  }

  /** Ends the self-check's processes (shutdown); the check's row is failed at the next start. */
  stop(): void {
    clearInterval(this.watch);
    for (const c of this.children) killGroup(c);
  }

  currentVersion(): Version {
    return this.version;
  }

  /** Takes the one-at-a-time lock, synchronously, so of two requests at once exactly one wins. */
  private lock(id: string): void {
    if (this.holder)
      throw new ApiError(
        'conflict',
        `another platform update (${this.holder}) is being checked or applied; try again when it has finished`,
      );
    this.holder = id;
  }

  private unlock(id: string): void {
    if (this.holder === id) this.holder = null;
  }

  /**
   * Commits the patch in a new worktree (a patch that does not apply is a 400 and leaves
   * nothing behind), records the update as `checking` and runs the self-check in the background.
   */
  async submit(
    input: { patch: string; reason: string; author: 'user' | 'agent' },
    actor: Principal | undefined,
    requestId?: string,
  ): Promise<UpdateRow> {
    // The `evo_` prefix of the time updates were evolutions: ids of old and new updates look alike.
    const id = newId('evo');
    this.lock(id);
    try {
      const reason = input.reason.trim();
      const [subject = '', ...rest] = reason.split('\n');
      const message = `${subject.slice(0, 100)}\n\n${rest.length ? `${rest.join('\n').trim()}\n\n` : ''}Kiln-Kind: source\nKiln-Update: ${id}\nKiln-Author: ${input.author}`;
      const prepared = await preparePatch(this.o.sourceDir, { id, patch: input.patch, message }).catch((err: Error) => {
        if (err instanceof PatchError) throw new ApiError('invalid_request', err.message);
        if (err instanceof SourceError) throw new ApiError('unavailable', err.message);
        throw err;
      });
      let row: UpdateRow;
      try {
        [row] = (await this.db
          .insert(platformUpdates)
          .values({
            id,
            status: 'checking',
            commitSha: prepared.commit,
            changedPaths: prepared.paths,
            reason,
            checks: [],
          })
          .returning()) as [UpdateRow];
        await this.audit({ action: 'system.update.submit', after: updateView(row) }, id, actor, requestId);
      } catch (err) {
        await removeWorktree(this.o.sourceDir, prepared.worktree);
        await this.git(['update-ref', '-d', `refs/kiln/updates/${id}`]).catch(() => undefined);
        throw err;
      }
      void this.check(row, prepared);
      return row;
    } catch (err) {
      this.unlock(id);
      throw err;
    }
  }

  /** A revert is an update like any other: the reverse of the update's commit, self-checked. */
  async revert(id: string, actor: Principal | undefined, requestId?: string): Promise<UpdateRow> {
    const row = await this.get(id);
    if (row.status !== 'applied' || !row.commitSha)
      throw new ApiError('conflict', `only an applied update can be reverted (this one is ${row.status})`);
    const patch = await this.git(['diff', '--binary', row.commitSha, `${row.commitSha}^`]);
    return this.submit(
      { patch, reason: `Revert platform update ${id}\n\n${row.reason}`, author: 'user' },
      actor,
      requestId,
    );
  }

  private async check(row: UpdateRow, prepared: Awaited<ReturnType<typeof preparePatch>>): Promise<void> {
    const steps: CheckStep[] = [];
    let error: string | null;
    try {
      const ok = await runSelfCheck(
        this.o.sourceDir,
        prepared,
        row.id,
        {
          stepTimeoutMs: this.o.checkTimeoutMs,
          tests: this.o.checkTests,
          readyTimeoutMs: this.o.readyTimeoutMs,
          stopTimeoutMs: this.o.stopTimeoutMs,
          dockerHost: this.o.dockerHost,
          children: this.children,
        },
        async (s) => {
          steps.push(s);
          await this.db.update(platformUpdates).set({ checks: steps }).where(eq(platformUpdates.id, row.id));
        },
      );
      error = ok ? null : `self-check failed at ${steps.find((s) => !s.ok)?.name ?? 'a step'}`;
    } catch (err) {
      this.log.error({ err, update: row.id }, 'self-check crashed');
      error = `self-check could not run: ${(err as Error).message}`;
    }
    // Whoever sees the outcome may act on it at once: the worktree is gone and the lock free.
    await removeWorktree(this.o.sourceDir, prepared.worktree);
    this.unlock(row.id);
    await this.settle(row.id, error ? 'failed' : 'ready', error).catch((err) =>
      this.log.error({ err, update: row.id }, 'could not record the self-check'),
    );
  }

  private async settle(id: string, status: 'ready' | 'failed', error: string | null): Promise<void> {
    await this.db
      .update(platformUpdates)
      .set({ status, error, finishedAt: status === 'failed' ? new Date() : null })
      .where(and(eq(platformUpdates.id, id), eq(platformUpdates.status, 'checking')));
    await this.audit({ action: 'system.update.check', after: { status, error } }, id, undefined);
  }

  /**
   * The sandbox image a restart rebuilds: this server's, when it is a `:latest` name on the local
   * engine that sandbox-image/'s build made (its label); not an image the operator made, nor one on
   * sandbox nodes (each node's host builds its own from its own checkout).
   */
  private async rebuiltImage(): Promise<string | undefined> {
    const image = this.o.sandboxImage;
    if (!image?.endsWith(':latest')) return undefined;
    try {
      const info = await connectDocker(this.o.dockerHost).getImage(image).inspect();
      return info.Config?.Labels?.[SANDBOX_IMAGE_LABEL] === 'runner' ? image : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Moves the source branch to the checked commit (a fast-forward: the branch must still be
   * where the check started) and starts the relay that restarts the server into it.
   */
  async apply(id: string, actor: Principal, requestId?: string): Promise<UpdateRow> {
    this.lock(id);
    let moved = false;
    try {
      const row = await this.get(id);
      if (row.status !== 'ready' || !row.commitSha)
        throw new ApiError(
          'conflict',
          `only an update that passed its self-check can be applied (this one is ${row.status})`,
        );
      const branch = (await this.git(['symbolic-ref', '--short', 'HEAD']).catch(() => '')).trim();
      if (!branch) throw new ApiError('conflict', 'the source checkout is not on a branch');
      const [head, parent] = await Promise.all([
        this.git(['rev-parse', 'HEAD']),
        this.git(['rev-parse', `${row.commitSha}^`]),
      ]);
      if (head.trim() !== parent.trim())
        throw new ApiError('conflict', 'the source branch moved since this update was checked: submit the patch again');
      const changes = (...paths: string[]) =>
        this.git(['diff', '--quiet', head.trim(), row.commitSha!, '--', ...paths]).then(
          () => false,
          () => true,
        );
      const lockChanged = await changes('package-lock.json');
      // The dashboard is served from its build: a new one for new sources (or a new vite).
      const dashboardChanged = lockChanged || (await changes('apps/dashboard'));
      // The sandbox image is built from sandbox-image/ (the runner the server talks to is in it): a
      // new one for new sources, under the name this server runs, when this build made it.
      const image = (await changes('sandbox-image')) ? await this.rebuiltImage() : undefined;

      const dir = this.dir(id);
      mkdirSync(dir, { recursive: true });
      const relayFile = join(dir, 'relay.ts');
      writeFileSync(relayFile, this.relaySource);
      const plan: RelayPlan = {
        updateId: id,
        oldPid: process.pid,
        command: process.execPath,
        args: [...process.execArgv, join(this.o.sourceDir, 'apps/api/src/main.ts')],
        cwd: process.cwd(),
        sourceDir: this.o.sourceDir,
        commit: row.commitSha,
        previous: head.trim(),
        prepare: [
          ...(lockChanged ? [['npm', 'ci', '--no-audit', '--no-fund']] : []),
          ...(dashboardChanged ? [['npm', 'run', '--silent', 'dashboard:build']] : []),
          ...(image ? [['npm', 'run', '--silent', 'sandbox:build', '--', '--image', image]] : []),
        ],
        stopTimeoutMs: this.o.stopTimeoutMs,
        readyTimeoutMs: this.o.readyTimeoutMs,
        statusFile: join(dir, 'status.json'),
        logFile: join(dir, 'relay.log'),
        serverLogFile: join(this.o.dataDir, 'self-update', 'server.log'),
      };
      writeFileSync(join(dir, 'plan.json'), JSON.stringify(plan, null, 2));

      const [applying] = await this.db
        .update(platformUpdates)
        .set({ status: 'applying' })
        .where(and(eq(platformUpdates.id, id), eq(platformUpdates.status, 'ready')))
        .returning();
      if (!applying) throw new ApiError('conflict', 'this update is no longer ready');
      try {
        await this.git([...IDENTITY, 'merge', '--ff-only', '-q', row.commitSha]);
        moved = true;
        await this.audit(
          {
            action: 'system.update.apply',
            before: { status: 'ready', commit: plan.previous },
            after: { status: 'applying', commit: row.commitSha },
          },
          id,
          actor,
          requestId,
        );
        this.follow(id, { pid: this.startRelay(relayFile, plan), plan });
      } catch (err) {
        if (moved) await this.git(['reset', '--keep', plan.previous]).catch(() => undefined);
        await this.db.update(platformUpdates).set({ status: 'ready' }).where(eq(platformUpdates.id, id));
        throw err instanceof ApiError
          ? err
          : new ApiError('conflict', `could not move the source branch: ${(err as Error).message}`);
      }
      this.log.warn(
        { update: id, commit: row.commitSha },
        'platform update applied to the source; the relay restarts the server',
      );
      return applying;
    } catch (err) {
      this.unlock(id);
      throw err;
    }
  }

  /** Detached, in its own process group, outliving this server; it inherits this environment. */
  private startRelay(relayFile: string, plan: RelayPlan): number | undefined {
    const out = openSync(plan.logFile, 'a');
    try {
      const child = spawn(
        process.execPath,
        ['--import', 'tsx', relayFile, join(this.dir(plan.updateId), 'plan.json')],
        {
          cwd: this.o.sourceDir,
          env: process.env,
          detached: true,
          stdio: ['ignore', out, out],
        },
      );
      child.on('error', (err) => this.log.error({ err, update: plan.updateId }, 'the relay did not start'));
      child.unref();
      return child.pid;
    } finally {
      closeSync(out);
    }
  }

  /**
   * Polls the relay's status until it is done, then finishes the row: by the server it names as
   * the survivor (this one), or by any server once that one is gone. A relay that died before
   * it was done fails the update; one that died before it wrote anything (`relay`: the server
   * that started it is still the one running) also has the update's commit reverted.
   */
  private follow(id: string, relay?: { pid: number | undefined; plan: RelayPlan }): void {
    this.holder = id;
    const statusFile = join(this.dir(id), 'status.json');
    const tick = async () => {
      const status = existsSync(statusFile) ? (JSON.parse(readFileSync(statusFile, 'utf8')) as RelayStatus) : null;
      if (!status && relay) {
        if (relay.pid && alive(relay.pid)) return;
        await this.revertUnstarted(relay.plan);
        await this.finishApply(
          id,
          'failed',
          'the relay did not start: the update was reverted and this server kept running',
        );
      } else if (status?.phase === 'done' && (status.pid === process.pid || !status.pid || !alive(status.pid))) {
        await this.finishApply(id, status.outcome ?? 'failed', status.error ?? null, status.downtimeMs);
      } else if (!status || (status.phase !== 'done' && !alive(status.relayPid))) {
        await this.finishApply(id, 'failed', `the relay stopped before it finished (${status?.phase ?? 'no status'})`);
      } else {
        return;
      }
      clearInterval(this.watch);
      this.unlock(id);
    };
    let busy = false;
    this.watch = setInterval(() => {
      if (busy) return;
      busy = true;
      tick()
        .catch((err) => this.log.error({ err, update: id }, 'could not finish the platform update'))
        .finally(() => (busy = false));
    }, 250);
    this.watch.unref();
  }

  private async revertUnstarted(plan: RelayPlan): Promise<void> {
    if ((await this.git(['rev-parse', 'HEAD'])).trim() !== plan.commit) return;
    await this.git([...IDENTITY, 'revert', '--no-commit', plan.commit]);
    await this.git([
      ...IDENTITY,
      'commit',
      '-q',
      '--no-verify',
      '-m',
      `Revert platform update ${plan.updateId}: the relay did not start\n\nKiln-Kind: source\nKiln-Update: ${plan.updateId}\nKiln-Author: system`,
    ]);
  }

  private async finishApply(
    id: string,
    outcome: 'applied' | 'rolled_back' | 'failed',
    error: string | null,
    downtimeMs?: number,
  ): Promise<void> {
    const [row] = await this.db.select().from(platformUpdates).where(eq(platformUpdates.id, id));
    const relayLog = (() => {
      try {
        return readFileSync(join(this.dir(id), 'relay.log'), 'utf8');
      } catch {
        return '';
      }
    })();
    const restart: CheckStep = {
      name: 'restart',
      ok: outcome === 'applied',
      duration_ms: downtimeMs ?? 0,
      log: capLog(relayLog),
    };
    const checks = [...((row?.checks as CheckStep[] | undefined) ?? []), restart];
    const finish = (db: Db) =>
      db
        .update(platformUpdates)
        .set({ status: outcome, error, checks, finishedAt: new Date() })
        .where(and(eq(platformUpdates.id, id), eq(platformUpdates.status, 'applying')))
        .returning();
    // An applied update owes update.applied to every team's subscribed webhooks (all of them run on
    // the new code), in the same transaction; what they get is the update's id and time only, not
    // its commit or patch, which are the org admin's to see.
    const [done] =
      outcome !== 'applied'
        ? await finish(this.db)
        : await this.db.transaction(async (tx) => {
            const rows = await finish(tx as unknown as Db);
            if (rows[0]) {
              const data = { update_id: id, status: 'applied', applied_at: new Date().toISOString() };
              await tx.execute(webhookEventWrite('update.applied', null, data));
            }
            return rows;
          });
    if (done)
      await this.audit(
        {
          action: `system.update.${outcome}`,
          before: { status: 'applying' },
          after: { status: outcome, error, commit: this.version.commit },
        },
        id,
        undefined,
      );
    this.log.warn({ update: id, outcome }, 'platform update finished');
  }

  private async audit(
    draft: Omit<AuditDraft, 'resourceType' | 'resourceId' | 'teamId'>,
    id: string,
    actor: Principal | undefined,
    requestId?: string,
  ) {
    await recordAudit(
      this.db,
      { ...draft, resourceType: 'system_update', resourceId: id, teamId: null },
      actor,
      requestId,
    );
  }

  async get(id: string): Promise<UpdateRow> {
    const [row] = await this.db.select().from(platformUpdates).where(eq(platformUpdates.id, id));
    if (!row) throw ApiError.notFound('platform update');
    return row;
  }

  async list(p: ListParams, status?: UpdateStatus[]): Promise<UpdateRow[]> {
    const c = cursorOn(platformUpdates.id, p);
    return this.db
      .select()
      .from(platformUpdates)
      .where(and(status ? inArray(platformUpdates.status, status) : undefined, c.where))
      .orderBy(c.orderBy)
      .limit(c.limit);
  }
}

export function updateView(r: UpdateRow) {
  return {
    id: r.id,
    status: r.status,
    reason: r.reason,
    commit_sha: r.commitSha,
    changed_paths: r.changedPaths,
    checks: r.checks as CheckStep[],
    error: r.error,
    created_at: r.createdAt.toISOString(),
    finished_at: r.finishedAt?.toISOString() ?? null,
  };
}

/**
 * Lets (or stops) a workspace's agent propose platform source updates: an org admin's switch,
 * kept in the workspace's settings (`source_updates`), which team keys cannot change.
 */
export async function setSourceUpdates(
  db: Db,
  wsId: string,
  enabled: boolean,
): Promise<{ teamId: string; before: boolean }> {
  const [before] = await db
    .select({
      teamId: workspaces.teamId,
      enabled: sql<boolean | null>`(${workspaces.settings}->>'source_updates')::boolean`,
    })
    .from(workspaces)
    .where(and(eq(workspaces.id, wsId), isNull(workspaces.deletedAt)));
  if (!before) throw ApiError.notFound('workspace');
  await db
    .update(workspaces)
    .set({
      settings: sql`jsonb_set(${workspaces.settings}, '{source_updates}', ${enabled ? 'true' : 'false'}::jsonb)`,
      updatedAt: new Date(),
    })
    .where(eq(workspaces.id, wsId));
  return { teamId: before.teamId, before: before.enabled ?? false };
}
