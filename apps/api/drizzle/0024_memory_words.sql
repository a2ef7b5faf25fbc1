-- A search's words in one call: the query's terms with their document frequencies and IDF, then
-- the candidates they make with their BM25, as one row of two JSON texts. A search sent these as
-- two statements of ~2 KB each, and the embedded database parsed and planned both anew every
-- time (~1.4 ms of planning alone at 10k chunks) and answered the first before the second could
-- be built. A function's statements are parsed once per connection and their plans cached; the
-- numbers that tune the ranking stay in memory/search.ts and are passed in (`o`).
--
-- o: variant_min_len, variant_max_extra, variants_per_word, variant_weight, substring_df_cap,
--    candidate_budget, candidate_cap, common_share, common_min_df, k1, b, content_chars.
-- avg_len:    the workspace's mean chunk length in words (1 when it has none)
-- terms:      [[term, kind, df, idf, common], …], the rarest first (df, then term); idf is
--             Robertson–Spärck Jones', never negative (a term in every chunk still counts a little),
--             a variant's at variant_weight; common: idf at most a term's in common_share of the
--             chunks (and common_min_df)
-- candidates: [[id, path, start_line, end_line, heading, content, day, builtin, bm25, rare, ctid], …],
--             the best first; at most depth
CREATE FUNCTION memory_words(p_ws text, p_words text, p_cjk text[], p_subs text[], p_sub_patterns text[],
	p_path_like text, p_since date, p_until date, p_depth integer, o jsonb)
RETURNS TABLE (avg_len double precision, terms text, candidates text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	v_chunks double precision;
	v_total double precision;
	v_n double precision;
	v_avg double precision;
	v_terms jsonb;
	v_query tsquery;
	v_like text[];
	v_common_idf double precision;
	v_k1 double precision := (o->>'k1')::float8;
	v_b double precision := (o->>'b')::float8;
BEGIN
	SELECT m.chunks, m.total_len INTO v_chunks, v_total FROM memory_index m WHERE m.workspace_id = p_ws;
	v_n := greatest(1, coalesce(v_chunks, 0));
	v_avg := CASE WHEN coalesce(v_chunks, 0) > 0 THEN v_total / v_chunks ELSE 1 END;
	v_common_idf := ln(1 + (v_n - greatest((o->>'common_share')::float8 * v_n, (o->>'common_min_df')::float8) + 0.5)
		/ (greatest((o->>'common_share')::float8 * v_n, (o->>'common_min_df')::float8) + 0.5));

	-- 1. The terms: words stemmed (stop words dropped), CJK pairs, identifiers (counted up to
	-- substring_df_cap), and for a word of variant_min_len letters or more up to variants_per_word
	-- other stems of the workspace that begin with it (less its last letter when longer).
	WITH
		stems AS (SELECT DISTINCT lexeme AS term FROM unnest(to_tsvector('english', p_words))),
		wds AS (SELECT s.term, 'word' AS kind FROM stems s UNION SELECT t, 'cjk' FROM unnest(p_cjk) t),
		variants AS (
			SELECT DISTINCT v.term FROM stems s
			CROSS JOIN LATERAL (SELECT left(s.term, length(s.term)
				- CASE WHEN length(s.term) > (o->>'variant_min_len')::int THEN 1 ELSE 0 END) AS p) x
			CROSS JOIN LATERAL (
				SELECT t.term FROM memory_terms t
				WHERE t.workspace_id = p_ws AND t.term >= x.p AND t.term < x.p || 'zzzz'
					AND starts_with(t.term, x.p) AND t.term <> s.term
					AND length(t.term) <= length(s.term) + (o->>'variant_max_extra')::int
					AND NOT EXISTS (SELECT 1 FROM stems e WHERE e.term = t.term)
				ORDER BY abs(length(t.term) - length(s.term)), t.df DESC LIMIT (o->>'variants_per_word')::int) v
			WHERE length(s.term) >= (o->>'variant_min_len')::int),
		found AS (
			SELECT w.term, w.kind,
				coalesce((SELECT d.df FROM memory_terms d WHERE d.workspace_id = p_ws AND d.term = w.term), 0) AS df
			FROM wds w
			UNION ALL
			SELECT v.term, 'variant', (SELECT d.df FROM memory_terms d WHERE d.workspace_id = p_ws AND d.term = v.term)
			FROM variants v
			UNION ALL
			SELECT x.t, 'substring', (SELECT count(*) FROM (SELECT 1 FROM memory_chunks c
				WHERE c.workspace_id = p_ws AND c.search_text ILIKE x.p LIMIT (o->>'substring_df_cap')::int) y)::int
			FROM unnest(p_subs, p_sub_patterns) x(t, p)),
		weighed AS (
			SELECT f.term, f.kind, f.df,
				ln(1 + (v_n - f.df + 0.5) / (f.df + 0.5))
					* CASE WHEN f.kind = 'variant' THEN (o->>'variant_weight')::float8 ELSE 1 END AS idf
			FROM found f WHERE f.df > 0)
	SELECT coalesce(jsonb_agg(jsonb_build_array(w.term, w.kind, w.df, w.idf, w.idf <= v_common_idf) ORDER BY w.df, w.term), '[]')
	INTO v_terms FROM weighed w;

	-- 2. What makes candidates: the indexed terms, rarest first, up to candidate_budget expected
	-- matches (the rarest always; a term in thousands of chunks barely moves BM25, so it adds to the
	-- score of candidates but does not make them); every identifier, as a pattern. Either may be
	-- none (NULL, an empty array).
	SELECT to_tsquery('simple', string_agg(s.t, ' | ' ORDER BY s.ord)) INTO v_query FROM (
		SELECT e->>0 AS t, x.ord, sum((e->>2)::int) OVER (ORDER BY x.ord) AS expected, row_number() OVER (ORDER BY x.ord) AS rn
		FROM jsonb_array_elements(v_terms) WITH ORDINALITY x(e, ord) WHERE e->>1 <> 'substring') s
	WHERE s.rn = 1 OR s.expected <= (o->>'candidate_budget')::int;
	SELECT coalesce(array_agg(x.p), '{}') INTO v_like FROM unnest(p_subs, p_sub_patterns) x(t, p)
	WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(v_terms) e WHERE e->>1 = 'substring' AND e->>0 = x.t);

	-- 3. The candidates (at most candidate_cap), scored by BM25 with each chunk's term frequencies
	-- (an identifier's, its occurrences in the searched text); the best depth of them.
	RETURN QUERY
	WITH
		w AS (SELECT e->>0 AS term, e->>1 AS kind, (e->>3)::float8 AS idf, (e->>4)::boolean AS common
			FROM jsonb_array_elements(v_terms) e),
		m AS MATERIALIZED (
			SELECT c.id, c.len, c.tf, c.search_text, c.path, c.start_line FROM memory_chunks c
			WHERE c.workspace_id = p_ws AND (c.tsv @@ v_query OR c.search_text ILIKE ANY (v_like))
				AND (p_path_like IS NULL OR c.path LIKE p_path_like)
				AND (p_since IS NULL OR c.day >= p_since) AND (p_until IS NULL OR c.day <= p_until)
			LIMIT (o->>'candidate_cap')::int),
		scored AS (
			SELECT m.id, m.path, m.start_line, NOT bool_and(w.common) AS rare,
				sum(w.idf * x.tf * (v_k1 + 1) / (x.tf + v_k1 * (1 - v_b + v_b * m.len / v_avg)))::float8 AS bm25
			FROM m JOIN w ON (w.kind <> 'substring' AND m.tf ? w.term)
				OR (w.kind = 'substring' AND strpos(lower(m.search_text), w.term) > 0)
			CROSS JOIN LATERAL (SELECT CASE WHEN w.kind = 'substring'
				THEN ((length(lower(m.search_text)) - length(replace(lower(m.search_text), w.term, ''))) / length(w.term))::float8
				ELSE (m.tf ->> w.term)::float8 END AS tf) x
			GROUP BY m.id, m.path, m.start_line
			ORDER BY bm25 DESC, m.path, m.start_line
			LIMIT p_depth)
	SELECT v_avg, v_terms::text,
		(SELECT coalesce(json_agg(json_build_array(c.id, c.path, c.start_line, c.end_line, c.heading,
				left(c.content, (o->>'content_chars')::int), c.day::text, c.builtin, s.bm25, s.rare, c.ctid::text)
			ORDER BY s.bm25 DESC, s.path, s.start_line), '[]')::text
		FROM scored s JOIN memory_chunks c ON c.id = s.id);
END
$$;
