/** The shapes of the API answers the dashboard and the command line read (see /openapi.json). */
import type { components } from '../../sdk/src/openapi.ts';

/** Shapes generated from /openapi.json (`npm run sdk:generate`; a type import: nothing of it is bundled). */
type Schemas = components['schemas'];
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
  /** Paused (state `paused`): since when, and its checkpoint's size on disk (null: unknown). */
  paused_at: string | null;
  checkpoint_bytes: number | null;
  /** Paused: when its checkpoint is deleted. */
  expires_at: string;
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
export type EgressRow = Schemas['EgressEvent'];
/** One of a workspace's MCP servers (`settings.mcp_servers`): its header values may reference `${secrets.NAME}`. */
export type McpServer = Schemas['WorkspaceSettings']['mcp_servers'][number];
export type Webhook = Schemas['Webhook'];
/** A registered sandbox node (`GET /v1/system/nodes`). */
export type SandboxNode = Schemas['SandboxNode'];
/** The answer of create and rotate-secret: the signing secret, shown this once. */
export type WebhookWithSecret = Schemas['WebhookWithSecret'];
export type WebhookDelivery = Schemas['WebhookDelivery'];
/** The events a webhook may subscribe to (the document's enum; the checkboxes need them at run time). */
export const WEBHOOK_EVENTS = [
  'run.completed',
  'run.failed',
  'run.requires_action',
  'evolution.committed',
  'sandbox.oom',
  'update.applied',
] as const satisfies readonly Webhook['events'][number][];
