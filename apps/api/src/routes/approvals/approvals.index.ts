import type { AgentService } from '../../agent/service.ts';
import type { ApprovalRow } from '../../db/schema/index.ts';
import { teamOf } from '../../http/guards.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import * as r from './approvals.routes.ts';

const approvalView = (a: ApprovalRow) => ({
  id: a.id,
  run_id: a.runId,
  session_id: a.sessionId,
  workspace_id: a.workspaceId,
  code: a.code,
  requires_org_admin: a.requiresOrgAdmin,
  status: a.status,
  decision: a.decision,
  reason: a.reason,
  created_at: a.createdAt.toISOString(),
  expires_at: a.expiresAt.toISOString(),
});

export function approvalsRouter(agent: AgentService) {
  return createRouter()
    .openapi(r.listApprovals, async (c) => {
      const orgAdmin = c.get('principal').role === 'org_admin';
      const q = c.req.valid('query');
      const rows = await agent.listApprovals(orgAdmin ? null : teamOf(c), q, q);
      return c.json(toPage(rows, q, approvalView), 200);
    })
    .openapi(r.decideApproval, async (c) => {
      // Org admins decide the approvals only they may (platform source updates), in any team.
      if (c.get('principal').role !== 'org_admin') teamOf(c);
      const { decision, reason } = c.req.valid('json');
      const a = await agent.decide(c.get('principal'), c.req.valid('param').approval, decision, reason);
      c.set('audit', {
        action: 'approval.decide',
        resourceType: 'approval',
        resourceId: a.id,
        teamId: a.teamId,
        after: { decision, reason: reason ?? null, run_id: a.runId },
      });
      return c.json(approvalView(a), 200);
    });
}
