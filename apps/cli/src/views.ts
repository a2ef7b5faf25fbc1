/** The parts of the API's answers the command line prints (the contract is docs/api.md). */
export interface Page<T> {
  data: T[];
}

export interface Workspace {
  id: string;
  name: string;
  head: string | null;
  settings: { protocol: string; approval: { mode: string } };
}

export interface Session {
  id: string;
  status: string;
  title: string | null;
  last_activity_at: string;
}

export interface Run {
  id: string;
  status: string;
  steps: number;
  usage: { prompt_tokens: number; completion_tokens: number };
  error: { code: string; message: string } | null;
}

export interface Approval {
  id: string;
  status: string;
  run_id: string;
  expires_at: string;
  code: string;
}

export interface Commit {
  sha: string;
  kind: string;
  author: string;
  summary: string;
}

export interface Evolution {
  id: string;
  kind: string;
  status: string;
  commit_sha: string | null;
  summary: string | null;
  error: string | null;
  changed_paths: string[];
}

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
