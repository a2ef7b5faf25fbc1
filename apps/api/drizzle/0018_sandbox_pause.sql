ALTER TABLE "sandboxes" ADD COLUMN "paused_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "sandboxes" ADD COLUMN "checkpoint_bytes" bigint;--> statement-breakpoint
ALTER TABLE "sandboxes" ADD COLUMN "checkpoint" jsonb;--> statement-breakpoint
ALTER TABLE "sandboxes" ADD COLUMN "lifetime_ends_at" timestamp with time zone;