import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import { pg_trgm } from '@electric-sql/pglite/contrib/pg_trgm';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/pglite';
import { migrate } from 'drizzle-orm/pglite/migrator';
import { afterAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../../apps/api/src/db/client.ts';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { searchMemory } from '../../apps/api/src/memory/search.ts';

const MIGRATIONS = fileURLToPath(new URL('../../apps/api/drizzle', import.meta.url));

describe('upgrading a database indexed by the search before this one (migration 0007)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-upgrade-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('keeps the old chunks searchable, with exact statistics, and marks the workspace for re-indexing', async () => {
    // The migrations up to 0006, as a server of the previous version left the database...
    const old = join(dir, 'migrations');
    cpSync(MIGRATIONS, old, { recursive: true });
    const journal = JSON.parse(readFileSync(join(old, 'meta/_journal.json'), 'utf8')) as { entries: { idx: number }[] };
    journal.entries = journal.entries.filter((e) => e.idx <= 6);
    writeFileSync(join(old, 'meta/_journal.json'), JSON.stringify(journal));
    const pg = await PGlite.create(join(dir, 'pglite'), { extensions: { pg_trgm } });
    const db = drizzle(pg);
    await migrate(db, { migrationsFolder: old });
    // ...with an old-style chunk (its whole text, no window, no date).
    await db.execute(sql`insert into teams (id, name) values ('team_old', 'old')`);
    await db.execute(
      sql`insert into workspaces (id, team_id, name, settings) values ('ws_old', 'team_old', 'w', '{}'::jsonb)`,
    );
    await db.execute(sql`insert into memory_chunks (team_id, workspace_id, path, start_line, end_line, heading, content, content_hash)
      values ('team_old', 'ws_old', 'memory/2025-03-04.md', 1, 5, '2025-03-04', ${'- 10:00 Maya: Good morning.\n- 10:01 Maya: We adopted a puppy called Biscuit.'}, 'x')`);
    await pg.close();

    // This version opens it: 0007 runs.
    const database = await openDatabase({ dataDir: dir });
    try {
      const { hits } = await searchMemory(database.db, 'ws_old', 'adopted puppy', { k: 3 });
      expect(hits).toHaveLength(1);
      // The matching turn; the greeting before it completes nothing (conversation-aware snippets).
      expect(hits[0]).toMatchObject({ path: 'memory/2025-03-04.md', start_line: 2, end_line: 2, date: null });
      expect(hits[0]!.snippet).toContain('adopted a puppy');
      const [index] = rowsOf<{ chunks: number; version: number }>(
        await database.db.execute(sql`select chunks, version from memory_index where workspace_id = 'ws_old'`),
      );
      expect(index).toEqual({ chunks: 1, version: 0 });
      const terms = rowsOf<{ term: string; df: number }>(
        await database.db.execute(sql`select term, df from memory_terms where workspace_id = 'ws_old' order by term`),
      );
      expect(terms.find((t) => t.term === 'puppi')).toEqual({ term: 'puppi', df: 1 });
    } finally {
      await database.close();
    }
  });
});
