import { bigint, index, jsonb, pgTable, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';

/** Mirrors the containers Kiln owns; the reaper reconciles it with Docker. */
export const sandboxes = pgTable(
  'sandboxes',
  {
    id: text('id').primaryKey(),
    teamId: teamId(),
    workspaceId: text('workspace_id'),
    sessionId: text('session_id'),
    /**
     * The API instance holding the runner stream; only it can use (or must reap) the container.
     * (The column keeps its first name, as the `kiln.owner` label does: docs/architecture.md, Glossary.)
     */
    instance: text('owner').notNull(),
    limits: jsonb('limits').notNull(),
    containerId: text('container_id').notNull(),
    image: text('image').notNull(),
    /** The container runtime it runs in (rows from before runtimes existed ran in runc). */
    runtime: text('runtime', { enum: ['runc', 'gvisor'] })
      .notNull()
      .default('runc'),
    /**
     * starting → ready (running) → removed; a paused one (checkpointed to its host's disk, gVisor)
     * is `paused` until a request resumes it (`resuming`, then ready again) or its checkpoint is
     * deleted (removed). Paused sandboxes count against no cap but their checkpoint's disk.
     */
    state: text('state', { enum: ['starting', 'ready', 'paused', 'resuming', 'removed'] }).notNull(),
    /** While paused: since when, and its checkpoint's bytes on its host's disk (null: unknown). */
    pausedAt: ts('paused_at'),
    checkpointBytes: bigint('checkpoint_bytes', { mode: 'number' }),
    /** While paused: what resuming it needs (sandbox/live.ts, PausedState). */
    checkpoint: jsonb('checkpoint'),
    /**
     * While running, for one whose runner lives apart from its holder's connection (a pausable
     * sandbox): what another replica needs to speak to that runner when its holder is gone
     * (sandbox/live.ts, RunnerState). Null for others.
     */
    runner: jsonb('runner'),
    /**
     * The end of its hard lifetime once it has been paused: its container's `kiln.expires` label
     * moved on by the time it spent paused (paused time does not count); null: the label's.
     */
    lifetimeEndsAt: ts('lifetime_ends_at'),
    removedReason: text('removed_reason'),
    createdAt: createdAt(),
    lastUsedAt: ts('last_used_at').notNull().defaultNow(),
    /** Running: its idle deadline (reclaimed, or paused, past it). Paused: when its checkpoint is deleted. */
    expiresAt: ts('expires_at').notNull(),
    removedAt: ts('removed_at'),
  },
  (t) => [index('sandboxes_team_state_idx').on(t.teamId, t.state), index('sandboxes_session_idx').on(t.sessionId)],
);
