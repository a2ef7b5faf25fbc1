ALTER TABLE "approvals" ADD COLUMN "tool_call_id" text;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "auto_approve" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "state_snapshot" text;--> statement-breakpoint
CREATE UNIQUE INDEX "runs_one_active_per_session" ON "runs" USING btree ("session_id") WHERE status in ('queued', 'in_progress', 'requires_action');