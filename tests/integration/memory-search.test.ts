import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { and, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { memoryChunks } from '../../apps/api/src/db/schema/index.ts';
import { openAiEmbedder } from '../../apps/api/src/memory/embeddings.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { DRIVERS } from '../support/db.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';

const day = (offset: number) => new Date(Date.now() - offset * 86_400_000).toISOString().slice(0, 10);

describe.each(DRIVERS)('memory search on %s', (driver) => {
  let t: TestApp;
  let team: { id: string; key: string };
  let ws: string;
  const put = (path: string, content: string) => t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key: team.key, raw: content });
  const search = async (q: string, k = 8) => {
    const r = await t.call('GET', `/v1/workspaces/${ws}/memory/search?q=${encodeURIComponent(q)}&k=${k}`, { key: team.key });
    expect(r.status).toBe(200);
    return r.body.data as { path: string; start_line: number; end_line: number; snippet: string; score: number }[];
  };

  beforeAll(async () => {
    t = await createTestApp({ driver });
    team = await t.team(`search-${driver}`);
    ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'mem' } })).body.id;
  });
  afterAll(() => t.close());

  it('indexes the template at creation: built-in skills are searchable', async () => {
    const hits = await search('consolidate budget merge bullets');
    expect(hits.map((h) => h.path)).toContain('skills/builtin/memory-keeping/SKILL.md');
  });

  it('finds a fact right after the commit that wrote it, with path, lines and snippet', async () => {
    await put('MEMORY.md', '# Core memory\n\n- The staging database is called orchid.\n- Reports go out on Mondays.\n');
    const [hit] = await search('staging database');
    expect(hit).toMatchObject({ path: 'MEMORY.md', start_line: 1 });
    expect(hit!.end_line).toBeGreaterThanOrEqual(4);
    expect(hit!.snippet).toContain('staging database is called orchid');
    expect(hit!.score).toBeGreaterThan(0);
  });

  it('finds Chinese text and code identifiers the full-text parser cannot split', async () => {
    await put('knowledge/deploy.md', '# 部署\n\n我们的部署流程需要先运行冒烟测试，然后再发布。\n\n## Config\n\nCall `load_config()` before `parseConfigFile(path)`.\n');
    expect((await search('部署流程'))[0]!.path).toBe('knowledge/deploy.md');
    expect((await search('冒烟测试'))[0]!.snippet).toContain('冒烟测试');
    expect((await search('parseConfigFile'))[0]!.path).toBe('knowledge/deploy.md');
    const ident = (await search('load_config'))[0]!;
    expect(ident.path).toBe('knowledge/deploy.md');
    expect(ident.start_line).toBe(5);
  });

  it('lets dated daily logs decay with age while core memory does not', async () => {
    const text = '- Decided: the quarterly audit uses the blue checklist.\n';
    await put(`memory/${day(0)}.md`, `# ${day(0)}\n\n${text}`);
    await put(`memory/${day(120)}.md`, `# ${day(120)}\n\n${text}`);
    await put('knowledge/audit.md', `# Audit\n\n${text}`);
    const hits = await search('quarterly audit blue checklist');
    const score = (p: string) => hits.find((h) => h.path === p)!.score;
    expect(score(`memory/${day(0)}.md`)).toBeGreaterThan(score(`memory/${day(120)}.md`) * 4);
    expect(score('knowledge/audit.md')).toBeGreaterThanOrEqual(score(`memory/${day(0)}.md`));
  });

  it('follows deletes and reverts: chunks of a removed file disappear and come back', async () => {
    await put('knowledge/temp.md', '# Temporary\n\nThe zebra protocol is deprecated.\n');
    expect((await search('zebra protocol')).map((h) => h.path)).toContain('knowledge/temp.md');
    const del = await t.call('DELETE', `/v1/workspaces/${ws}/files?path=knowledge/temp.md`, { key: team.key });
    expect(del.body.commit.paths).toEqual(['knowledge/temp.md']);
    expect((await search('zebra protocol')).map((h) => h.path)).not.toContain('knowledge/temp.md');
    await t.call('POST', `/v1/workspaces/${ws}/commits/${del.body.commit.sha}/revert`, { key: team.key });
    expect((await search('zebra protocol')).map((h) => h.path)).toContain('knowledge/temp.md');
  });

  it('chunks long files by heading and line count, keeping line numbers exact', async () => {
    const body = Array.from({ length: 100 }, (_, i) => (i === 77 ? 'needle: the marmalade key' : `line ${i + 3}`)).join('\n');
    await put('knowledge/long.md', `# Long\n\n${body}\n`);
    const [hit] = await search('marmalade');
    expect(hit!.path).toBe('knowledge/long.md');
    expect(hit!.start_line).toBeLessThanOrEqual(80);
    expect(hit!.end_line).toBeGreaterThanOrEqual(80);
    expect(hit!.end_line - hit!.start_line).toBeLessThan(40);
    const rows = await t.database.db.select().from(memoryChunks).where(and(eq(memoryChunks.workspaceId, ws), eq(memoryChunks.path, 'knowledge/long.md')));
    expect(rows.length).toBeGreaterThanOrEqual(3);
  });

  it('answers an empty query with 400', async () => {
    const r = await t.call('GET', `/v1/workspaces/${ws}/memory/search?q=%20`, { key: team.key });
    expect(r.status).toBe(400);
  });
});

describe('memory search with an embeddings endpoint', () => {
  let fake: FakeOpenAI;
  let t: TestApp;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
    t = await createTestApp({ embedder: openAiEmbedder({ model: 'fake-embed', baseURL: fake.url, apiKey: 'test' }) });
  });
  afterAll(async () => {
    await t.close();
    await fake.close();
  });

  it('ranks by meaning too: a synonym with no shared word is found through the vectors', async () => {
    const team = await t.team('vectors');
    const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'v' } })).body.id;
    await t.call('PUT', `/v1/workspaces/${ws}/files?path=knowledge/garage.md`, { key: team.key, raw: '# Garage\n\nThe red car needs new tyres.\n' });
    expect(fake.requests.some((r) => r.path === '/v1/embeddings' && r.body.model === 'fake-embed')).toBe(true);
    const r = await t.call('GET', `/v1/workspaces/${ws}/memory/search?q=automobile`, { key: team.key });
    expect(r.body.data[0]).toMatchObject({ path: 'knowledge/garage.md' });
  });
});

describe('start-up repair after a crash', () => {
  it('removes a stale index lock, commits stranded changes as the system, and mirrors commits the table missed', async () => {
    const t = await createTestApp();
    try {
      const team = await t.team('crash');
      const ws = (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'c' } })).body.id;
      const dir = t.workspaces.repos.dirOf(ws);
      const git = (...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });
      // A commit that reached git but not the database (crash between the two)...
      writeFileSync(join(dir, 'MEMORY.md'), '# Core memory\n\n- committed before the crash\n');
      git('add', '-A');
      git('-c', 'user.name=k', '-c', 'user.email=k@k', 'commit', '-qm', 'Agent step', '-m', 'Kiln-Kind: memory\nKiln-Author: agent\nKiln-Run: run_crash');
      // ...then a write that never got committed, and git's lock left behind.
      writeFileSync(join(dir, 'knowledge/stranded.md'), '# Stranded\n\nwritten just before the crash\n');
      writeFileSync(join(dir, '.git/index.lock'), '');

      const { repaired } = await t.workspaces.repairAll();
      expect(repaired).toBe(1);
      expect(git('status', '--porcelain')).toBe('');
      const log = await t.call('GET', `/v1/workspaces/${ws}/commits`, { key: team.key });
      expect(log.body.data[0]).toMatchObject({ author: 'system', summary: 'Recover uncommitted changes found at start-up', paths: ['knowledge/stranded.md'] });
      expect(log.body.data[1]).toMatchObject({ author: 'agent', kind: 'memory', run_id: 'run_crash' });
      expect((await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body.head).toBe(git('rev-parse', 'HEAD').trim());
      const hits = await t.call('GET', `/v1/workspaces/${ws}/memory/search?q=crash`, { key: team.key });
      expect(hits.body.data.map((h: { path: string }) => h.path)).toEqual(expect.arrayContaining(['MEMORY.md', 'knowledge/stranded.md']));
      expect((await t.workspaces.repairAll()).repaired).toBe(0);
      git('fsck', '--no-progress');
    } finally {
      await t.close();
    }
  });
});
