CREATE TABLE "sandbox_nodes" (
	"name" text PRIMARY KEY NOT NULL,
	"url" text NOT NULL,
	"state" text DEFAULT 'active' NOT NULL,
	"memory_mb" integer DEFAULT 0 NOT NULL,
	"cpus" real DEFAULT 0 NOT NULL,
	"runtimes" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"last_heard_at" timestamp with time zone,
	"last_error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
