-- Memory retrieval, version 1 (issue 13): chunks carry the text that is searched (without the
-- template's boilerplate), their length in words, the date of a dated log and whether they come
-- from a built-in skill; full-text search stems English and drops stop words; per-workspace
-- statistics for BM25 (chunk count, total length, each term's document frequency) are kept by
-- statement triggers, each chunk's term frequencies by a row trigger. Existing chunks stay searchable (their
-- whole text, old chunking) until the start-up re-index job rebuilds them (memory_index.version 0).
CREATE TABLE "memory_index" (
	"workspace_id" text PRIMARY KEY NOT NULL,
	"chunks" integer DEFAULT 0 NOT NULL,
	"total_len" bigint DEFAULT 0 NOT NULL,
	"version" integer DEFAULT 0 NOT NULL,
	"embed_model" text DEFAULT '' NOT NULL,
	"indexed_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "memory_index" ADD CONSTRAINT "memory_index_workspace_id_workspaces_id_fk" FOREIGN KEY ("workspace_id") REFERENCES "public"."workspaces"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
DROP INDEX IF EXISTS "memory_chunks_content_trgm_idx";--> statement-breakpoint
ALTER TABLE "memory_chunks" DROP COLUMN "tsv";--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "search_text" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "cjk" text DEFAULT '' NOT NULL;--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "len" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "day" date;--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "builtin" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "tf" jsonb DEFAULT '{}'::jsonb NOT NULL;--> statement-breakpoint
CREATE TABLE "memory_terms" (
	"workspace_id" text NOT NULL,
	"term" text NOT NULL,
	"df" integer NOT NULL,
	CONSTRAINT "memory_terms_workspace_id_term_pk" PRIMARY KEY("workspace_id","term")
);
--> statement-breakpoint
ALTER TABLE "memory_terms" ADD CONSTRAINT "memory_terms_workspace_id_workspaces_id_fk" FOREIGN KEY ("workspace_id") REFERENCES "public"."workspaces"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
UPDATE "memory_chunks" SET "search_text" = coalesce("heading", '') || ' ' || "content",
	"len" = coalesce(array_length(regexp_split_to_array(btrim(coalesce("heading", '') || ' ' || "content"), '\s+'), 1), 0),
	"builtin" = "path" LIKE 'skills/builtin/%';--> statement-breakpoint
ALTER TABLE "memory_chunks" ADD COLUMN "tsv" "tsvector" GENERATED ALWAYS AS (to_tsvector('english'::regconfig, search_text || ' ' || cjk)) STORED;--> statement-breakpoint
-- GIN's pending list is capped at 64 kB (default 4 MB): it is merged into the index by a vacuum,
-- which PGlite never runs, or when full, and every search scans it (a bulk re-index left 7 ms per
-- search there). Without a pending list at all, a bulk re-index takes twice as long.
CREATE INDEX "memory_chunks_tsv_idx" ON "memory_chunks" USING gin ("tsv") WITH (gin_pending_list_limit = 64);--> statement-breakpoint
UPDATE "memory_chunks" SET "tf" = coalesce((SELECT jsonb_object_agg(u.lexeme, coalesce(array_length(u.positions, 1), 1)) FROM unnest("tsv") u), '{}'::jsonb);--> statement-breakpoint
INSERT INTO "memory_terms" ("workspace_id", "term", "df") SELECT c."workspace_id", k, count(*) FROM "memory_chunks" c, jsonb_object_keys(c."tf") k GROUP BY 1, 2;--> statement-breakpoint
-- Each term's frequency in a chunk, for BM25 (a key lookup per term instead of unnesting the tsvector).
CREATE FUNCTION "memory_chunks_tf"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.tf := coalesce((SELECT jsonb_object_agg(u.lexeme, coalesce(array_length(u.positions, 1), 1))
		FROM unnest(to_tsvector('english'::regconfig, NEW.search_text || ' ' || NEW.cjk)) u), '{}'::jsonb);
	RETURN NEW;
END $$;--> statement-breakpoint
CREATE TRIGGER "memory_chunks_tf" BEFORE INSERT ON "memory_chunks" FOR EACH ROW EXECUTE FUNCTION "memory_chunks_tf"();--> statement-breakpoint
CREATE INDEX "memory_chunks_search_trgm_idx" ON "memory_chunks" USING gin ("search_text" gin_trgm_ops) WITH (gin_pending_list_limit = 64);--> statement-breakpoint
CREATE INDEX "memory_chunks_ws_day_idx" ON "memory_chunks" USING btree ("workspace_id","day");--> statement-breakpoint
INSERT INTO "memory_index" ("workspace_id", "chunks", "total_len", "version")
	SELECT w."id", count(c."id"), coalesce(sum(c."len"), 0), 0 FROM "workspaces" w LEFT JOIN "memory_chunks" c ON c."workspace_id" = w."id" GROUP BY w."id";--> statement-breakpoint
CREATE FUNCTION "memory_index_added"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO memory_index AS m (workspace_id, chunks, total_len)
		SELECT workspace_id, count(*), sum(len) FROM added GROUP BY workspace_id
	ON CONFLICT (workspace_id) DO UPDATE SET chunks = m.chunks + excluded.chunks, total_len = m.total_len + excluded.total_len;
	INSERT INTO memory_terms AS t (workspace_id, term, df)
		SELECT a.workspace_id, k, count(*) FROM added a, jsonb_object_keys(a.tf) k GROUP BY 1, 2
	ON CONFLICT (workspace_id, term) DO UPDATE SET df = t.df + excluded.df;
	RETURN NULL;
END $$;--> statement-breakpoint
CREATE FUNCTION "memory_index_removed"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE memory_index m SET chunks = greatest(0, m.chunks - d.n), total_len = greatest(0, m.total_len - d.l)
		FROM (SELECT workspace_id, count(*) AS n, sum(len) AS l FROM removed GROUP BY workspace_id) d
		WHERE m.workspace_id = d.workspace_id;
	UPDATE memory_terms t SET df = t.df - d.n
		FROM (SELECT r.workspace_id, k, count(*) AS n FROM removed r, jsonb_object_keys(r.tf) k GROUP BY 1, 2) d
		WHERE t.workspace_id = d.workspace_id AND t.term = d.k;
	RETURN NULL;
END $$;--> statement-breakpoint
CREATE TRIGGER "memory_chunks_added" AFTER INSERT ON "memory_chunks" REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION "memory_index_added"();--> statement-breakpoint
CREATE TRIGGER "memory_chunks_removed" AFTER DELETE ON "memory_chunks" REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION "memory_index_removed"();--> statement-breakpoint
-- pgvector where the database has it (PGlite loads it; a Postgres server needs the package):
-- memory search then ranks chunks by vector distance in the database.
DO $$ BEGIN
	IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
		CREATE EXTENSION IF NOT EXISTS vector;
	END IF;
END $$;
