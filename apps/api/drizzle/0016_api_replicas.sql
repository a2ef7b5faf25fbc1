CREATE TABLE "api_replicas" (
	"instance" text PRIMARY KEY NOT NULL,
	"url" text NOT NULL,
	"heard_at" timestamp with time zone NOT NULL
);
