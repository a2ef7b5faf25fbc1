/** The shapes of the API answers the dashboard and the command line read (see /openapi.json). */
export interface List<T> {
  data: T[];
  has_more?: boolean;
  last_id?: string | null;
}
export interface Run {
  id: string;
  session_id: string;
  workspace_id: string;
  status: string;
  model: string | null;
  steps: number;
  usage: { prompt_tokens: number; completion_tokens: number };
  error?: { code: string; message: string } | null;
  created_at: string;
  finished_at: string | null;
}
export interface Approval {
  id: string;
  run_id: string;
  session_id: string;
  workspace_id: string;
  code: string;
  status: string;
  expires_at: string;
}
export interface Sandbox {
  id: string;
  session_id: string | null;
  state: string;
  /** runc or gvisor. */
  runtime: string;
  /** The base sandbox image or a template's. */
  image: string;
  memory_bytes: number | null;
  cpu_percent: number | null;
  limits: { memoryMb: number };
  last_used_at: string;
  /** When it goes unless used or kept alive: the earlier of its idle deadline and its hard lifetime. */
  reclaim_at: string;
}
export interface Workspace {
  id: string;
  name: string;
  head: string | null;
  settings: { approval: { mode: string }; protocol: string; model: string | null; mcp_servers?: McpServer[] };
  created_at: string;
}
export interface UsageRow {
  key: string;
  prompt_tokens: number;
  completion_tokens: number;
  calls: number;
}
export interface DailyUsage {
  from: string;
  to: string;
  data: {
    workspace_id: string;
    day: string;
    prompt_tokens: number;
    completion_tokens: number;
    calls: number;
    runs: number;
  }[];
}
export interface Session {
  id: string;
  title: string | null;
  status: string;
  last_activity_at: string;
}
export interface Commit {
  sha: string;
  kind: string;
  author: string;
  summary: string;
  paths: string[];
  session_id: string | null;
  run_id: string | null;
  evolution_id: string | null;
  created_at: string;
}
export interface CommitWithDiff extends Commit {
  diff: string;
  diff_truncated: boolean;
}
export interface Evolution {
  id: string;
  kind: string;
  status: string;
  commit_sha: string | null;
  summary: string | null;
  diary: string | null;
  session_id: string | null;
  error: string | null;
  changed_paths: string[];
  created_at: string;
  finished_at: string | null;
}
export interface AuditEvent {
  id: string;
  team_id: string | null;
  actor: string | null;
  action: string;
  resource_type: string | null;
  resource_id: string | null;
  created_at: string;
}
export interface Team {
  id: string;
  name: string;
  created_at: string;
}
export interface Update {
  id: string;
  status: string;
  reason: string;
  commit_sha: string | null;
  changed_paths: string[];
  checks: { name: string; ok: boolean; duration_ms: number; log: string }[];
  error: string | null;
  created_at: string;
  finished_at: string | null;
}
export interface Version {
  commit: string | null;
  branch: string | null;
  pid: number;
  started_at: string;
}
/** One request of an execution through the egress proxy (`exec.completed`'s `egress`). */
export interface EgressRow {
  host: string;
  port: number;
  method: string;
  allowed: boolean;
  status: number;
  bytes_out: number;
  bytes_in: number;
}
/** One of a workspace's MCP servers (`settings.mcp_servers`): its header values may reference `${secrets.NAME}`. */
export interface McpServer {
  name: string;
  url: string;
  headers: Record<string, string>;
}
/** The events a webhook may subscribe to, as the API names them. */
export const WEBHOOK_EVENTS = [
  'run.completed',
  'run.failed',
  'run.requires_action',
  'evolution.committed',
  'sandbox.oom',
  'update.applied',
] as const;
export interface Webhook {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  created_at: string;
  updated_at: string;
}
/** The answer of create and rotate-secret: the signing secret, shown this once. */
export interface WebhookWithSecret extends Webhook {
  secret: string;
}
interface WebhookAttempt {
  attempt: number;
  at: string;
  status_code: number | null;
  error: string | null;
  duration_ms: number;
}
export interface WebhookDelivery {
  id: string;
  webhook_id: string;
  event_id: string;
  event_type: string;
  status: 'pending' | 'succeeded' | 'failed';
  attempts: number;
  max_attempts: number;
  last_status_code: number | null;
  last_error: string | null;
  attempt_log: WebhookAttempt[];
  replay_of: string | null;
  created_at: string;
  updated_at: string;
  next_attempt_at: string | null;
  delivered_at: string | null;
}
