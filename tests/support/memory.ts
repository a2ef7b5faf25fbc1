import { sql } from 'drizzle-orm';
import { expect } from 'vitest';
import type { Db } from '../../apps/api/src/db/client.ts';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import type { SearchHit } from '../../apps/api/src/memory/search.ts';
import { getWorkspace } from '../../apps/api/src/workspace/records.ts';
import type { TestApp } from './app.ts';

export type MemoryHit = SearchHit & { debug?: Record<string, unknown> };

/**
 * A workspace of its own, with helpers to write files and search through the HTTP API. With
 * `settle` (the default) a write also waits for its chunks' vectors, which are made in the
 * background after it, so that a search after it fuses them all. `db` counts the chunks
 * without a vector (another replica's handle, when this app's closes first).
 */
export async function memoryWorkspace(t: TestApp, name: string, opts: { settle?: boolean; db?: Db } = {}) {
  const team = await t.team(name);
  const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name } })).body.id as string;
  const put = async (path: string, content: string) => {
    const r = await t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, {
      key: team.key,
      raw: content,
    });
    expect(r.status, `PUT ${path}`).toBeLessThan(300);
    if (opts.settle ?? true) await t.workspaces.vectorsSettled();
  };
  /**
   * Many files in one commit (as an agent's step makes them), through the workspace service: a
   * year of daily logs written one PUT at a time is 60 commits, each indexed and settled alone.
   */
  const putAll = async (files: Record<string, string>) => {
    const row = (await getWorkspace(t.database.db, team.id, ws))!;
    await t.workspaces.change(row, { author: 'user' }, async (tree) => {
      for (const [path, content] of Object.entries(files)) await tree.writeFile(path, Buffer.from(content));
    });
    if (opts.settle ?? true) await t.workspaces.vectorsSettled();
  };
  const query = (q: string, params: Record<string, string | number> = {}) =>
    t.call(
      'GET',
      `/v1/workspaces/${ws}/memory/search?${new URLSearchParams({ q, ...Object.fromEntries(Object.entries(params).map(([k, v]) => [k, String(v)])) })}`,
      { key: team.key },
    );
  const search = async (q: string, params: Record<string, string | number> = {}) => {
    const r = await query(q, params);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    return r.body.data as MemoryHit[];
  };
  const withoutVector = async () =>
    Number(
      rowsOf<{ n: number }>(
        await (opts.db ?? t.database.db).execute(
          sql`select count(*)::int as n from memory_chunks where workspace_id = ${ws} and embedding is null`,
        ),
      )[0]!.n,
    );
  return { team, ws, put, putAll, query, search, withoutVector };
}
