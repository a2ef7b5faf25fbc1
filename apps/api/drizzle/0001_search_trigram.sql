-- Substring search over memory chunks (Chinese text, code identifiers) needs trigrams.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "memory_chunks_content_trgm_idx" ON "memory_chunks" USING gin ("content" gin_trgm_ops);
