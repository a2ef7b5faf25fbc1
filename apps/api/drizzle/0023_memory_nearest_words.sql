-- memory_nearest_512 (0022) also returns what a chunk's words score reads (its term frequencies,
-- its length, its searched text cut like its content), and compares each vector it returns once.
-- A search read those three by key for every chunk the function found, in a second scan of each
-- (~0.5 ms at 10k chunks on the embedded database), and the similarity it returned was the
-- distance the index scan had ordered by computed a second time. Same arguments, same settings;
-- the return type changes, so the function is made again.
DO $$
BEGIN
	-- Where 0022 made it (the type's name means nothing where pgvector is not installed).
	IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') THEN
		IF to_regprocedure('memory_nearest_512(text,vector,integer,text,date,date,integer)') IS NOT NULL THEN
			EXECUTE 'DROP FUNCTION memory_nearest_512(text, vector, integer, text, date, date, integer)';
			EXECUTE $fn$
				CREATE FUNCTION memory_nearest_512(ws text, q vector(512), lim integer, path_like text,
					since date, until date, content_chars integer)
				RETURNS TABLE (id integer, path text, start_line integer, end_line integer, heading text, content text,
					day text, builtin boolean, tf jsonb, len integer, search_text text, similarity double precision)
				LANGUAGE plpgsql
				SET hnsw.iterative_scan = 'relaxed_order' SET hnsw.ef_search = 40 SET enable_seqscan = on SET enable_sort = on
				AS $body$
				DECLARE
					p record;
				BEGIN
					SELECT * INTO p FROM memory_vector_plan(ws, lim);
					PERFORM set_config('enable_seqscan', p.seqscan, true), set_config('enable_sort', p.seqscan, true),
						set_config('hnsw.ef_search', p.ef_search::text, true);
					-- Planned now, with these settings and the filters given (a NULL one drops out). The
					-- distance is the ordering's own column: computed once per row.
					RETURN QUERY EXECUTE
						'SELECT n.id, n.path, n.start_line, n.end_line, n.heading, n.content, n.day, n.builtin, n.tf, n.len,
							n.search_text, (1 - n.distance)::float8
						FROM (SELECT c.id, c.path, c.start_line, c.end_line, c.heading, left(c.content, $7) AS content,
								c.day::text AS day, c.builtin, c.tf, c.len, left(c.search_text, $7) AS search_text,
								c.embedding::vector(512) <=> $2 AS distance
							FROM memory_chunks c
							WHERE c.workspace_id = $1 AND array_length(c.embedding, 1) = 512
								AND ($4::text IS NULL OR c.path LIKE $4) AND ($5::date IS NULL OR c.day >= $5)
								AND ($6::date IS NULL OR c.day <= $6)
							ORDER BY distance LIMIT $3) n'
						USING ws, q, lim, path_like, since, until, content_chars;
				END
				$body$
			$fn$;
		END IF;
	END IF;
END $$;
