-- A search's nearest vectors in one statement (memory/search.ts), where pgvector 0.8 or later is
-- installed. How the HNSW index of 0017 is read (iterative scan in relaxed order, ef_search) and
-- whether a workspace is read through it whatever the planner estimates (memory_vector_plan) were
-- set by a transaction of their own before the query: four statements, ~3 ms of every search on
-- the embedded database. Here they are the function's own settings: its SET clauses restore them
-- when it returns, so nothing else the connection runs plans with them.
DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector'
			AND string_to_array(split_part(extversion, '-', 1), '.')::int[] >= ARRAY[0, 8]) THEN
		-- A workspace of 1,000 chunks or more that is at least a twentieth of the table is read
		-- through the index (no sequential scan, no sort), even where the planner would compare
		-- every vector (55 ms at 3k chunks against ~2 ms through the index); a small part of a large
		-- table is left to the planner: the index would walk every workspace's nearest vectors.
		EXECUTE $fn$
			CREATE OR REPLACE FUNCTION memory_vector_plan(ws text, lim integer)
			RETURNS TABLE (seqscan text, ef_search integer) LANGUAGE sql STABLE AS $body$
				SELECT CASE WHEN mine >= 1000 AND mine * 20 >= total THEN 'off' ELSE 'on' END, greatest(40, lim)
				FROM (SELECT coalesce((SELECT chunks FROM memory_index WHERE workspace_id = ws), 0) AS mine,
					coalesce((SELECT sum(chunks) FROM memory_index), 0) AS total) c
			$body$
		$fn$;
		EXECUTE $fn$
			CREATE OR REPLACE FUNCTION memory_nearest_512(ws text, q vector(512), lim integer, path_like text,
				since date, until date, content_chars integer)
			RETURNS TABLE (id integer, path text, start_line integer, end_line integer, heading text, content text,
				day text, builtin boolean, similarity double precision)
			LANGUAGE plpgsql
			SET hnsw.iterative_scan = 'relaxed_order' SET hnsw.ef_search = 40 SET enable_seqscan = on SET enable_sort = on
			AS $body$
			DECLARE
				p record;
			BEGIN
				SELECT * INTO p FROM memory_vector_plan(ws, lim);
				PERFORM set_config('enable_seqscan', p.seqscan, true), set_config('enable_sort', p.seqscan, true),
					set_config('hnsw.ef_search', p.ef_search::text, true);
				-- Planned now, with these settings and the filters given (a NULL one drops out).
				RETURN QUERY EXECUTE
					'SELECT c.id, c.path, c.start_line, c.end_line, c.heading, left(c.content, $7), c.day::text, c.builtin,
						(1 - (c.embedding::vector(512) <=> $2))::float8
					FROM memory_chunks c
					WHERE c.workspace_id = $1 AND array_length(c.embedding, 1) = 512
						AND ($4::text IS NULL OR c.path LIKE $4) AND ($5::date IS NULL OR c.day >= $5)
						AND ($6::date IS NULL OR c.day <= $6)
					ORDER BY c.embedding::vector(512) <=> $2 LIMIT $3'
					USING ws, q, lim, path_like, since, until, content_chars;
			END
			$body$
		$fn$;
	END IF;
END $$;
