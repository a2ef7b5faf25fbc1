import type { SQL } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { ExecAudit } from '../sandbox/executions.ts';
import type { ExecOutcome, SandboxEngine } from '../sandbox/engine.ts';
import type { OutputListener } from '../sandbox/runner-client.ts';
import type { CommitOutcome, Provenance } from '../workspace/git-repos.ts';
import type { WorkspaceService } from '../workspace/service.ts';
import type { WorkspaceRow } from '../workspace/records.ts';

export interface SessionExecResult extends ExecOutcome {
  /** With `deferRecord`: the statement that records the execution, for the caller to batch. */
  record?: SQL[];
  /** What the code changed in /workspace, as committed (null when it changed nothing). */
  workspace:
    | (CommitOutcome & { ignored: { path: string; reason: string }[]; skipped: { path: string; reason: string }[] })
    | null;
}

type ExecDeps = { engine: SandboxEngine; workspaces: WorkspaceService };
type ExecBy = { teamId: string; sessionId: string; runId?: string };

const contextOf = (deps: ExecDeps, ws: WorkspaceRow, by: ExecBy) =>
  deps.engine.settings.execContext(ws, { ...by, workspaceDir: deps.workspaces.dirOf(ws.id) });

/**
 * Starts resuming the session's paused sandbox, if it has one, and does not wait: an agent run
 * does this before its first model call, which then hides the resume. Whatever goes wrong is
 * met again, and answered, by the execution that follows.
 */
export function wakeSession(deps: ExecDeps & { log: Logger }, ws: WorkspaceRow, by: ExecBy): void {
  const failed = (err: unknown) =>
    deps.log.debug(
      { err, session: by.sessionId },
      "the session's paused sandbox could not be resumed ahead of its use",
    );
  try {
    const { ctx, limits } = contextOf(deps, ws, by);
    deps.engine.wake(ctx, limits).catch(failed);
  } catch (err) {
    // Settings the execution refuses, with the reason, when it comes (the run answers the model).
    failed(err);
  }
}

/**
 * Runs code in a session's sandbox with the workspace copied into /workspace, then commits
 * whatever the code changed there (with provenance) and puts the sandbox copy back in line
 * with the repository where changes were refused or redacted.
 */
export async function execInSession(
  deps: ExecDeps,
  ws: WorkspaceRow,
  ctx: ExecBy,
  code: string,
  opts: {
    timeoutS?: number;
    onOutput?: OutputListener;
    signal?: AbortSignal;
    audit?: ExecAudit;
    prov: Provenance;
    deferRecord?: boolean;
  },
): Promise<SessionExecResult> {
  const { ctx: where, limits } = contextOf(deps, ws, ctx);
  const quota = deps.workspaces.quotaOf(ws);
  const { changes, ...result } = await deps.engine.exec(where, limits, code, {
    timeoutS: opts.timeoutS,
    onOutput: opts.onOutput,
    signal: opts.signal,
    audit: opts.audit,
    deferRecord: opts.deferRecord,
    // The runner stops collecting one past the cap: over it, the step is refused anyway.
    sync: { maxFiles: quota.filesPerStep, maxBytes: quota.bytesPerStep },
  });
  if (!changes || (!changes.changed.length && !changes.deleted.length && !changes.skipped.length && !changes.over))
    return { ...result, workspace: null };
  const { outcome, pushBack, ignored, quotaExceeded } = await deps.workspaces.applySandboxChanges(
    ws,
    changes,
    opts.prov,
  );
  if (quotaExceeded) {
    // Nothing was committed, and which files the code left may not even be known (the runner
    // stops counting at the cap): the sandbox is replaced by a fresh copy of the repository.
    await deps.engine.release(ctx.sessionId, 'quota_exceeded');
    const message = `${quotaExceeded}; nothing of this step was committed and the sandbox was reset to the workspace's last commit (variables are lost)`;
    return {
      ...result,
      error: result.error ?? { type: 'QuotaExceeded', message },
      restarted: true,
      workspace: {
        ...outcome,
        ignored: [{ path: '/workspace', reason: message }, ...ignored],
        skipped: changes.skipped,
      },
    };
  }
  if (pushBack.length) await deps.engine.pushToSession(ctx.sessionId, pushBack);
  return { ...result, workspace: { ...outcome, ignored, skipped: changes.skipped } };
}
