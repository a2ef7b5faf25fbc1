-- Platform self-updates get a table of their own: until now they were `evolutions` rows of kind
-- 'self_update' (no team, workspace or session). Each one moves with its id and values (its
-- summary is the update's reason); `evolutions` is left with reviews and dreams.
CREATE TABLE "platform_updates" (
	"id" text PRIMARY KEY NOT NULL,
	"status" text NOT NULL,
	"commit_sha" text,
	"changed_paths" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"reason" text NOT NULL,
	"checks" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone
);--> statement-breakpoint
INSERT INTO "platform_updates"
	("id", "status", "commit_sha", "changed_paths", "reason", "checks", "error", "created_at", "finished_at")
SELECT "id", "status", "commit_sha", "changed_paths", coalesce("summary", ''), coalesce("checks", '[]'::jsonb),
	"error", "created_at", "finished_at"
FROM "evolutions" WHERE "kind" = 'self_update';--> statement-breakpoint
DELETE FROM "evolutions" WHERE "kind" = 'self_update';
