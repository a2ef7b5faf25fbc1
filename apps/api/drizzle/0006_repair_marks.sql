ALTER TABLE "workspaces" ADD COLUMN "repair_error" text;--> statement-breakpoint
ALTER TABLE "workspaces" ADD COLUMN "repair_failed_at" timestamp with time zone;