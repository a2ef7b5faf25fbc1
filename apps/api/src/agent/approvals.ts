/**
 * Approvals: a run that pauses for a person's decision, listing and deciding approvals, and the
 * timers that expire an undecided one (failing closed). A decided or expired approval continues
 * its run only through the `resume` callback it is given: it starts no loop itself.
 *
 * May touch: the `approvals` table, a run's status when it pauses (`requires_action`), the
 * session's auto-approve flag (`approve_session`) and the approval events of the run. Never the
 * run's transcript, its end, or a sandbox.
 */
import { and, eq, lt } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Principal } from '../auth/principal.ts';
import type { Db } from '../db/client.ts';
import { approvals, runs, sessions, type ApprovalRow, type RunRow } from '../db/schema/index.ts';
import { cursorOn } from '../db/pagination.ts';
import { ApiError } from '../lib/errors.ts';
import { newId } from '../lib/ids.ts';
import type { SessionRow } from '../sessions/sessions.ts';
import type { WorkspaceRow } from '../workspace/records.ts';
import { runLinks, webhookEventWrite } from '../webhooks/events.ts';
import type { RunEventLog } from './events.ts';

/** How a paused run continues once its approval is decided. */
export type Resume = { approval: ApprovalRow; outcome: 'approved' | 'denied' | 'expired' };

export class Approvals {
  private readonly expiries = new Map<string, NodeJS.Timeout>();

  /** `resume` continues the run of an approval that was just decided or expired. */
  constructor(
    private readonly deps: { db: Db; events: RunEventLog; log: Logger },
    private readonly resume: (r: Resume) => Promise<void>,
  ) {}

  /** A team's approvals; for an org admin (`teamId` null), those only an org admin may decide. */
  async list(
    teamId: string | null,
    f: { status?: string; workspace?: string },
    page: { limit: number; after?: string },
  ) {
    // Oldest first: a queue of decisions to make.
    const c = cursorOn(approvals.id, { ...page, order: 'asc' });
    return this.deps.db
      .select()
      .from(approvals)
      .where(
        and(
          teamId ? eq(approvals.teamId, teamId) : eq(approvals.requiresOrgAdmin, true),
          f.status ? eq(approvals.status, f.status as ApprovalRow['status']) : undefined,
          f.workspace ? eq(approvals.workspaceId, f.workspace) : undefined,
          c.where,
        ),
      )
      .orderBy(c.orderBy)
      .limit(c.limit);
  }

  async decide(
    principal: Principal,
    approvalId: string,
    decision: 'approve' | 'deny' | 'approve_session',
    reason?: string,
  ): Promise<ApprovalRow> {
    const { db } = this.deps;
    const teamId = principal.teamId;
    const [a] = await db
      .select()
      .from(approvals)
      .where(and(eq(approvals.id, approvalId), teamId ? eq(approvals.teamId, teamId) : undefined));
    // An org-admin key acts inside no team: it sees and decides only the approvals reserved for
    // org admins (platform source updates); a team's ordinary approvals are the team's own.
    if (!a || (!teamId && !a.requiresOrgAdmin)) throw ApiError.notFound('approval');
    if (a.requiresOrgAdmin ? principal.role !== 'org_admin' : !principal.canApprove) {
      throw new ApiError(
        'forbidden',
        a.requiresOrgAdmin
          ? 'only an org admin may decide this approval'
          : 'this key may not approve code: use an owner or admin key, or one created with can_approve',
      );
    }
    if (a.status === 'expired' || (a.status === 'pending' && a.expiresAt.getTime() <= Date.now())) {
      if (a.status === 'pending') await this.expire(a);
      throw new ApiError('approval_expired', 'this approval expired before it was decided; the run was told so');
    }
    if (a.status !== 'pending') throw new ApiError('conflict', `this approval was already decided (${a.status})`);
    const status = decision === 'deny' ? 'denied' : 'approved';
    const [decided] = await db
      .update(approvals)
      .set({ status, decision, reason: reason ?? null, decidedBy: principal.keyId, decidedAt: new Date() })
      .where(and(eq(approvals.id, a.id), eq(approvals.status, 'pending')))
      .returning();
    if (!decided) throw new ApiError('conflict', 'this approval was decided at the same moment by someone else');
    if (decision === 'approve_session' && !a.requiresOrgAdmin) {
      await db.update(sessions).set({ autoApprove: true }).where(eq(sessions.id, a.sessionId));
    }
    this.clearExpiry(a.id);
    await this.resolve(decided, status);
    return decided;
  }

  /**
   * Pauses a run at a call that waits for a person: the approval (`orgAdmin`: only an org admin
   * may decide it), the run in `requires_action`, its two events, then the expiry timer.
   */
  async request(
    at: { run: RunRow; ws: WorkspaceRow; session: SessionRow },
    code: string,
    toolCallId: string | undefined,
    orgAdmin = false,
  ): Promise<void> {
    const { db, events } = this.deps;
    const runId = at.run.id;
    const timeout = at.ws.settings.approval.timeout_s;
    const [a] = (await db
      .insert(approvals)
      .values({
        id: newId('apr'),
        teamId: at.run.teamId,
        workspaceId: at.ws.id,
        sessionId: at.session.id,
        runId,
        code,
        toolCallId: toolCallId ?? null,
        requiresOrgAdmin: orgAdmin,
        expiresAt: new Date(Date.now() + timeout * 1000),
      })
      .returning()) as [ApprovalRow];
    await db.update(runs).set({ status: 'requires_action' }).where(eq(runs.id, runId));
    const requested = { approval_id: a.id, code, expires_at: a.expiresAt.toISOString(), requires_org_admin: orgAdmin };
    await events.append(runId, 'approval.requested', requested);
    // The webhooks subscribed to run.requires_action are owed it in the same statement as the event.
    const owed = webhookEventWrite('run.requires_action', at.run.teamId, {
      run_id: runId,
      session_id: at.session.id,
      workspace_id: at.ws.id,
      status: 'requires_action',
      approval_id: a.id,
      links: { ...runLinks(runId), approval: `/v1/approvals/${a.id}` },
    });
    await events.appendMany(runId, [['run.requires_action', { approval_id: a.id }]], [owed]);
    this.scheduleExpiry(a);
  }

  /** At start-up: every pending approval gets its expiry timer again. */
  async schedulePending(): Promise<void> {
    const pending = await this.deps.db.select().from(approvals).where(eq(approvals.status, 'pending'));
    for (const a of pending) this.scheduleExpiry(a);
  }

  /** At shutdown: no approval expires in this process any more (start-up schedules them again). */
  stopTimers(): void {
    for (const t of this.expiries.values()) clearTimeout(t);
  }

  /** A run cancelled while it waited: its pending approvals are denied, so nobody decides them later. */
  async cancelPending(runId: string): Promise<void> {
    await this.deps.db
      .update(approvals)
      .set({ status: 'denied', decision: 'deny', reason: 'run cancelled', decidedAt: new Date() })
      .where(and(eq(approvals.runId, runId), eq(approvals.status, 'pending')));
  }

  /** Approvals past their deadline that no timer caught (e.g. across a restart). */
  async sweepExpired(): Promise<number> {
    const due = await this.deps.db
      .select()
      .from(approvals)
      .where(and(eq(approvals.status, 'pending'), lt(approvals.expiresAt, new Date())));
    for (const a of due) await this.expire(a);
    return due.length;
  }

  private scheduleExpiry(a: ApprovalRow): void {
    const ms = Math.max(0, a.expiresAt.getTime() - Date.now());
    const timer = setTimeout(
      () => {
        this.expiries.delete(a.id);
        this.expire(a).catch((err) => this.deps.log.error({ err, approval: a.id }, 'could not expire approval'));
      },
      Math.min(ms, 2 ** 31 - 1),
    );
    timer.unref();
    this.expiries.set(a.id, timer);
  }

  private clearExpiry(id: string): void {
    clearTimeout(this.expiries.get(id));
    this.expiries.delete(id);
  }

  /** Fails closed: the code is not run, and the model is told nobody answered (not that someone refused). */
  private async expire(a: ApprovalRow): Promise<void> {
    const [expired] = await this.deps.db
      .update(approvals)
      .set({ status: 'expired', decidedAt: new Date() })
      .where(and(eq(approvals.id, a.id), eq(approvals.status, 'pending')))
      .returning();
    if (expired) await this.resolve(expired, 'expired');
  }

  private async resolve(a: ApprovalRow, outcome: Resume['outcome']): Promise<void> {
    const status = outcome === 'approved' ? 'approved' : outcome;
    const resolved = { approval_id: a.id, status, decision: a.decision, reason: a.reason };
    await this.deps.events.append(a.runId, 'approval.resolved', resolved);
    await this.resume({ approval: a, outcome });
  }
}
