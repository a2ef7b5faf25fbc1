import { createHash } from 'node:crypto';
import { sql, type SQL } from 'drizzle-orm';
import { auditRow, insertAudit } from '../audit/audit.ts';
import type { AuditDraft } from '../audit/draft.ts';
import type { Principal } from '../auth/principal.ts';
import { newId } from '../lib/ids.ts';
import type { EgressEvent } from './backend.ts';
import type { RunnerResult } from './runner-client.ts';

export interface ExecutionRecord {
  teamId: string;
  sessionId: string;
  sandboxId: string;
  runId?: string;
  code: string;
  result: RunnerResult;
  /** Its requests through the egress proxy, allowed and refused. */
  egress?: EgressEvent[];
}

/** Who to write the audit event for, when the execution is audited together with its record. */
export interface ExecAudit {
  /** The key that asked for the execution; none when the agent ran it. */
  actor?: Principal;
  /** Overrides the actor's role in the audit row (e.g. "agent"). */
  role?: string;
  requestId?: string;
}

/** The statement that records an execution (and its audit event), for a caller that batches writes. */
export function executionWrite(rec: ExecutionRecord, audit?: ExecAudit): { id: string; writes: SQL[] } {
  const id = newId('exe');
  const r = rec.result;
  const codeHash = createHash('sha256').update(rec.code).digest('hex');
  const error = r.error ? `${r.error.type}: ${r.error.message}`.slice(0, 2000) : null;
  const insertExecution = sql`insert into executions
      (id, team_id, session_id, sandbox_id, run_id, code_hash, duration_ms, exit_code, error, truncated, stdout_bytes, stderr_bytes, egress)
    values (${id}, ${rec.teamId}, ${rec.sessionId}, ${rec.sandboxId}, ${rec.runId ?? null}, ${codeHash}, ${Math.round(r.duration_ms)},
      ${r.exit_code}, ${error}, ${r.truncated}, ${r.stdout_bytes}, ${r.stderr_bytes}, ${JSON.stringify(rec.egress ?? [])}::jsonb)`;
  if (!audit) return { id, writes: [insertExecution] };
  const draft: AuditDraft = {
    action: 'session.exec',
    resourceType: 'session',
    resourceId: rec.sessionId,
    teamId: rec.teamId,
    after: {
      execution_id: id,
      sandbox_id: rec.sandboxId,
      run_id: rec.runId ?? null,
      code_sha256: codeHash,
      exit_code: r.exit_code,
      error: r.error?.type ?? null,
      ...(rec.egress?.length
        ? {
            egress: {
              allowed: rec.egress.filter((e) => e.allowed).length,
              refused: rec.egress.filter((e) => !e.allowed).length,
            },
          }
        : {}),
    },
  };
  const a = auditRow(draft, audit.actor, audit.requestId);
  if (audit.role) a.actorRole = audit.role;
  return { id, writes: [insertExecution, insertAudit(a)] };
}
