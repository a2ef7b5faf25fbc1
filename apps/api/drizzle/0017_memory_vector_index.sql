-- An approximate-nearest-neighbour index (HNSW, cosine) over the vectors of the built-in sentence
-- encoder (512 dimensions), where the database has pgvector: a search compared every vector of the
-- workspace before (170 ms at 10k chunks). Other models' vectors (another size) are left to the
-- exact comparison. Rows without a vector are not in it, so an installation without an encoder
-- pays nothing on its writes.
DO $$ BEGIN
	IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') THEN
		CREATE INDEX IF NOT EXISTS "memory_chunks_vector_512" ON "memory_chunks"
			USING hnsw ((embedding::vector(512)) vector_cosine_ops)
			WHERE array_length(embedding, 1) = 512;
	END IF;
END $$;
