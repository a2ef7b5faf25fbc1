/**
 * The parts of the API's answers the command line prints (the contract is docs/api.md): the
 * dashboard's types of the same answers, plus what only the command line reads.
 */
export type { Approval, Commit, Evolution, List as Page, Run, Session, Workspace } from '../../dashboard/src/types.ts';

export interface ExecResult {
  stdout: string;
  stderr: string;
  error: { type: string; message: string } | null;
}

/** The fields of run events the chat prints; which are present depends on the event's name. */
export interface EventData {
  text?: string;
  protocol_violation?: boolean;
  attempt?: number;
  code?: string;
  stream?: 'stdout' | 'stderr';
  data?: string;
  error?: { type?: string; code?: string; message: string };
  commit?: { sha: string; paths: string[] };
  query?: string;
  hits?: unknown[];
  before_tokens?: number;
  after_tokens?: number;
  approval_id?: string;
  role?: string;
  content?: string;
}
