import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { commits } from '../../apps/api/src/db/schema/index.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { tableCounts } from '../support/counts.ts';
import { HOSTILE_NAMES } from '../support/hostile-names.ts';

const git = (dir: string, ...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });

describe('workspaces are git repositories', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  let ws: string;
  let dir: string;
  const put = (path: string, content: string | Buffer, key = team.key) =>
    t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key, raw: content as string });

  beforeAll(async () => {
    t = await createTestApp({ maxFileBytes: 64 * 1024 });
    team = await t.team('repo');
    ws = (
      await t.call('POST', '/v1/workspaces', {
        key: team.key,
        body: { name: 'repo', settings: { evolution: { memory_max_entries: 5, memory_max_bytes: 2000 } } },
      })
    ).body.id;
    dir = t.workspaces.dirOf(ws);
  });
  afterAll(() => t.close());

  it('starts from the template with one system commit', async () => {
    for (const f of [
      'AGENT.md',
      'RULE.md',
      'USER.md',
      'MEMORY.md',
      'SPEC.md',
      'PYTHON.md',
      'knowledge/index.md',
      'tools/README.md',
      'skills/builtin/memory-keeping/SKILL.md',
    ]) {
      expect(existsSync(join(dir, f)), f).toBe(true);
    }
    const log = await t.call('GET', `/v1/workspaces/${ws}/commits`, { key: team.key });
    expect(log.body.data).toHaveLength(1);
    expect(log.body.data[0]).toMatchObject({
      kind: 'system',
      author: 'system',
      summary: 'Create workspace from template',
    });
    const listing = await t.call('GET', `/v1/workspaces/${ws}/files`, { key: team.key });
    expect(listing.body.entries.map((e: { name: string }) => e.name)).toEqual(
      expect.arrayContaining(['AGENT.md', 'knowledge', 'skills']),
    );
    expect(listing.body.entries.map((e: { name: string }) => e.name)).not.toContain('.git');
  });

  it('commits every write with trailers; the kind follows the paths; the table mirrors it', async () => {
    const r = await put('MEMORY.md', '# Core memory\n\n- Deploys happen on Fridays.\n');
    expect(r.status).toBe(200);
    expect(r.body.commit).toMatchObject({ kind: 'memory', author: 'user', paths: ['MEMORY.md'] });
    const body = git(dir, 'log', '-1', '--format=%B');
    expect(body).toContain('Kiln-Kind: memory');
    expect(body).toContain('Kiln-Author: user');
    expect(git(dir, 'log', '-1', '--format=%(trailers:key=Kiln-Actor,valueonly)').trim()).toMatch(/^key_/);
    for (const [path, kind] of [
      ['skills/report/SKILL.md', 'skill'],
      ['knowledge/pricing.md', 'knowledge'],
      ['AGENT.md', 'prompt'],
      ['tools/util.py', 'source'],
      ['data/raw.csv', 'user'],
    ] as const) {
      const c = await put(path, `content of ${path}\n`);
      expect(c.body.commit.kind, path).toBe(kind);
    }
    const [row] = await t.database.db.select().from(commits).where(eq(commits.sha, r.body.commit.sha));
    expect(row).toMatchObject({ kind: 'memory', author: 'user', paths: ['MEMORY.md'], workspaceId: ws });
    const ws2 = await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key });
    expect(ws2.body.head).toBe(git(dir, 'rev-parse', 'HEAD').trim());
    const filtered = await t.call('GET', `/v1/workspaces/${ws}/commits?kind=skill`, { key: team.key });
    expect(filtered.body.data.map((c: { paths: string[] }) => c.paths[0])).toEqual(['skills/report/SKILL.md']);
    const one = await t.call('GET', `/v1/workspaces/${ws}/commits/${r.body.commit.sha}`, { key: team.key });
    expect(one.body.diff).toContain('+- Deploys happen on Fridays.');
    const content = await t.call('GET', `/v1/workspaces/${ws}/files?path=MEMORY.md`, { key: team.key });
    expect(content.body).toMatchObject({
      type: 'file',
      encoding: 'utf-8',
      content: '# Core memory\n\n- Deploys happen on Fridays.\n',
    });
    const same = await put('MEMORY.md', '# Core memory\n\n- Deploys happen on Fridays.\n');
    expect(same.body.commit).toBeNull();
  });

  it('serialises concurrent writers: no update is lost and the index is never left locked', async () => {
    const writes = Array.from({ length: 12 }, (_, i) => put(`notes/n${i}.md`, `note ${i}\n`));
    const results = await Promise.all(writes);
    expect(results.every((r) => r.status === 200 && r.body.commit)).toBe(true);
    expect(new Set(results.map((r) => r.body.commit.sha)).size).toBe(12);
    for (let i = 0; i < 12; i++) expect(readFileSync(join(dir, `notes/n${i}.md`), 'utf8')).toBe(`note ${i}\n`);
    expect(git(dir, 'status', '--porcelain')).toBe('');
    expect(existsSync(join(dir, '.git/index.lock'))).toBe(false);
    const logged = git(dir, 'log', '--format=%s', '-12').split('\n').filter(Boolean);
    expect(logged).toHaveLength(12);
  });

  it('a JSON body is the file as GET answers it; JSON of another shape is refused, never committed as text', async () => {
    const json = (path: string, body: string) =>
      t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, {
        key: team.key,
        raw: body,
        headers: { 'content-type': 'application/json; charset=utf-8' },
      });
    const head = git(dir, 'rev-parse', 'HEAD');
    for (const body of ['{"a": 1}', 'not json', '{"content": 5}', '{"content": "x", "encoding": "hex"}', '[]']) {
      const r = await json('data/conf.json', body);
      expect(r.status, body).toBe(400);
      expect(r.body.error.message, body).toMatch(/"content".*application\/octet-stream|application\/octet-stream/);
    }
    expect(git(dir, 'rev-parse', 'HEAD')).toBe(head);
    expect((await json('notes/hello.md', '{"content": "hello\\n"}')).status).toBe(200);
    expect(readFileSync(join(dir, 'notes/hello.md'), 'utf8')).toBe('hello\n');
    const bytes = Buffer.from([0, 1, 2, 255]);
    expect(
      (await json('data/blob.bin', JSON.stringify({ content: bytes.toString('base64'), encoding: 'base64' }))).status,
    ).toBe(200);
    expect(readFileSync(join(dir, 'data/blob.bin'))).toEqual(bytes);
    // A JSON file's own bytes, sent as octet-stream, are stored as they are.
    const raw = await t.call('PUT', `/v1/workspaces/${ws}/files?path=data/conf.json`, {
      key: team.key,
      raw: '{"a": 1}\n',
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(raw.status).toBe(200);
    expect(readFileSync(join(dir, 'data/conf.json'), 'utf8')).toBe('{"a": 1}\n');
  });

  it('reverts with a new commit; reverting a memory commit restores MEMORY.md byte for byte', async () => {
    const before = readFileSync(join(dir, 'MEMORY.md'));
    const change = await put('MEMORY.md', `${before.toString()}- Staging runs on port 8080.\n`);
    const rev = await t.call('POST', `/v1/workspaces/${ws}/commits/${change.body.commit.sha}/revert`, {
      key: team.key,
    });
    expect(rev.status).toBe(201);
    expect(rev.body.commit).toMatchObject({
      kind: 'memory',
      author: 'user',
      summary: expect.stringMatching(/^Revert "/),
    });
    expect(readFileSync(join(dir, 'MEMORY.md')).equals(before)).toBe(true);
    expect(git(dir, 'log', '-1', '--format=%B')).toContain(`Kiln-Reverts: ${change.body.commit.sha}`);
    // History is never rewritten: the reverted commit is still there.
    expect(git(dir, 'cat-file', '-t', change.body.commit.sha).trim()).toBe('commit');
  });

  it('a revert that conflicts answers 409 and leaves the repository exactly as it was', async () => {
    const first = await put('conflict.md', 'line one\n');
    await put('conflict.md', 'line one, changed later\n');
    const head = git(dir, 'rev-parse', 'HEAD');
    const counts = await tableCounts(t.database.db);
    const r = await t.call('POST', `/v1/workspaces/${ws}/commits/${first.body.commit.sha}/revert`, { key: team.key });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('conflict');
    expect(git(dir, 'rev-parse', 'HEAD')).toBe(head);
    expect(git(dir, 'status', '--porcelain')).toBe('');
    expect(readFileSync(join(dir, 'conflict.md'), 'utf8')).toBe('line one, changed later\n');
    expect((await tableCounts(t.database.db)).commits).toBe(counts.commits);
    const missing = await t.call('POST', `/v1/workspaces/${ws}/commits/${'0'.repeat(40)}/revert`, { key: team.key });
    expect(missing.status).toBe(404);
  });

  it('rejects bad paths, links out, oversized files and writes to built-in skills, writing nothing', async () => {
    mkdirSync(join(dir, 'links'), { recursive: true });
    symlinkSync('/etc', join(dir, 'links/out'));
    git(dir, 'add', '-A');
    git(dir, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'test link');
    const head = git(dir, 'rev-parse', 'HEAD');
    for (const bad of [
      '../escape.md',
      '/etc/passwd',
      '.git/config',
      'a/.git/x',
      'a/../../b',
      'links/out/passwd',
      'a//b',
      '',
    ]) {
      const r = await put(bad, 'x');
      expect(r.status, bad).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
    }
    const read = await t.call('GET', `/v1/workspaces/${ws}/files?path=links/out/passwd`, { key: team.key });
    expect(read.status).toBe(400);
    const big = await put('big.bin', 'x'.repeat(64 * 1024 + 1));
    expect(big.status).toBe(400);
    expect(big.body.error.message).toMatch(/limit/);
    const builtin = await put('skills/builtin/memory-keeping/SKILL.md', 'hijacked');
    expect(builtin.status).toBe(403);
    expect(readFileSync(join(dir, 'skills/builtin/memory-keeping/SKILL.md'), 'utf8')).not.toBe('hijacked');
    expect(git(dir, 'rev-parse', 'HEAD')).toBe(head);
    expect(existsSync('/etc/passwd.kiln')).toBe(false);
  });

  it('changes to built-in skills made in the working tree (by agent code) are undone, not committed', async () => {
    const file = join(dir, 'skills/builtin/memory-keeping/SKILL.md');
    const original = readFileSync(file, 'utf8');
    writeFileSync(file, 'tampered by code');
    writeFileSync(join(dir, 'skills/builtin/new-one.md'), 'sneaky');
    writeFileSync(join(dir, 'ok.md'), 'fine\n');
    const row = (await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body;
    const outcome = await t.workspaces.commitPending(
      { ...row, teamId: team.id, createdAt: new Date(), updatedAt: new Date(), deletedAt: null },
      { author: 'agent', sessionId: 'ses_x', runId: 'run_y' },
    );
    expect(outcome.commit!.paths).toEqual(['ok.md']);
    expect(outcome.refused.map((r) => r.path).sort()).toEqual([
      'skills/builtin/memory-keeping/SKILL.md',
      'skills/builtin/new-one.md',
    ]);
    expect(readFileSync(file, 'utf8')).toBe(original);
    expect(existsSync(join(dir, 'skills/builtin/new-one.md'))).toBe(false);
    const msg = git(dir, 'log', '-1', '--format=%B');
    expect(msg).toContain('Kiln-Author: agent');
    expect(msg).toContain('Kiln-Session: ses_x');
    expect(msg).toContain('Kiln-Run: run_y');
  });

  it('redacts secrets before the commit lands, in the file itself, and says so', async () => {
    const fakeAws = ['AKIA', 'ABCDEFGHIJKLMNOP'].join('');
    const fakeGh = `ghp_${'a1B2'.repeat(9)}`;
    const pem = ['-----BEGIN RSA PRIVATE KEY-----', 'MIIEowIBAAKCAQEAx', '-----END RSA PRIVATE KEY-----'].join('\n');
    const r = await put(
      'knowledge/creds.md',
      `# Creds\naws: ${fakeAws}\ntoken = "${fakeGh}"\n${pem}\nnothing secret here\n`,
    );
    expect(r.status).toBe(200);
    expect(r.body.redactions.map((x: { type: string }) => x.type).sort()).toEqual([
      'aws_access_key',
      'github_token',
      'private_key',
    ]);
    expect(r.body.redactions.find((x: { type: string }) => x.type === 'aws_access_key').line).toBe(2);
    const onDisk = readFileSync(join(dir, 'knowledge/creds.md'), 'utf8');
    const committed = git(dir, 'show', 'HEAD:knowledge/creds.md');
    for (const text of [onDisk, committed, git(dir, 'log', '-p', '-1')]) {
      expect(text).not.toContain(fakeAws);
      expect(text).not.toContain(fakeGh);
      expect(text).not.toContain('MIIEowIBAAKCAQEAx');
    }
    expect(committed).toContain('[REDACTED:aws_access_key]');
    expect(committed).toContain('nothing secret here');
    expect(git(dir, 'log', '-1', '--format=%B')).toMatch(/Redacted 3 secret\(s\)/);
  });

  it('refuses a MEMORY.md over budget with a message listing the current entries', async () => {
    const current = readFileSync(join(dir, 'MEMORY.md'), 'utf8');
    const tooMany = `# Core memory\n\n${Array.from({ length: 6 }, (_, i) => `- fact ${i}`).join('\n')}\n`;
    const r = await put('MEMORY.md', tooMany);
    expect(r.status).toBe(400);
    expect(r.body.error.message).toMatch(/6 entries \(limit 5\)/);
    expect(r.body.error.message).toContain('1. Deploys happen on Fridays.');
    expect(readFileSync(join(dir, 'MEMORY.md'), 'utf8')).toBe(current);
    const tooBig = `# Core memory\n\n- ${'x'.repeat(2100)}\n`;
    const big = await put('MEMORY.md', tooBig);
    expect(big.status).toBe(400);
    expect(big.body.error.message).toMatch(/bytes \(limit 2000\)/);
    expect(git(dir, 'status', '--porcelain')).toBe('');
  });

  it('says how much of its budget MEMORY.md uses, and lists the skills with their front matter', async () => {
    const text = '# Core memory\n\n- one\n- two\n* three\nnot an entry\n';
    expect((await put('MEMORY.md', text)).status).toBe(200);
    const usage = await t.call('GET', `/v1/workspaces/${ws}/memory`, { key: team.key });
    expect(usage.body).toEqual({
      path: 'MEMORY.md',
      entries: 3,
      bytes: Buffer.byteLength(text),
      max_entries: 5,
      max_bytes: 2000,
    });
    const skill = '---\nname: plot-sales\ndescription: Plot monthly sales with matplotlib\n---\n\n1. load\n';
    expect((await put('skills/plot-sales/SKILL.md', skill)).status).toBe(200);
    const skills = (await t.call('GET', `/v1/workspaces/${ws}/skills`, { key: team.key })).body.data;
    expect(skills).toContainEqual({
      name: 'plot-sales',
      description: 'Plot monthly sales with matplotlib',
      path: 'skills/plot-sales/SKILL.md',
      builtin: false,
    });
    expect(skills.filter((x: { builtin: boolean }) => x.builtin).length).toBeGreaterThan(0);
    expect(
      skills.every((x: { path: string; builtin: boolean }) => x.builtin === x.path.startsWith('skills/builtin/')),
    ).toBe(true);
  });

  it('another team cannot read, write, list or revert this workspace', async () => {
    const other = await t.team('repo-other');
    const sha = git(dir, 'rev-parse', 'HEAD').trim();
    for (const [method, path] of [
      ['GET', `/v1/workspaces/${ws}/files?path=MEMORY.md`],
      ['PUT', `/v1/workspaces/${ws}/files?path=x.md`],
      ['DELETE', `/v1/workspaces/${ws}/files?path=ok.md`],
      ['GET', `/v1/workspaces/${ws}/commits`],
      ['GET', `/v1/workspaces/${ws}/commits/${sha}`],
      ['POST', `/v1/workspaces/${ws}/commits/${sha}/revert`],
      ['GET', `/v1/workspaces/${ws}/memory/search?q=fridays`],
      ['GET', `/v1/workspaces/${ws}/memory`],
      ['GET', `/v1/workspaces/${ws}/skills`],
    ] as const) {
      const r = await t.call(method, path, { key: other.key, raw: method === 'PUT' ? 'x' : undefined });
      expect(r.status, `${method} ${path}`).toBe(404);
    }
    expect(git(dir, 'rev-parse', 'HEAD').trim()).toBe(sha);
  });
});

describe('names git refuses never reach git; git never fails on a name we accept', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('names');
  });
  afterAll(() => t.close());
  const newWs = async (name: string) =>
    (await t.call('POST', '/v1/workspaces', { key: team.key, body: { name } })).body.id as string;
  const put = (ws: string, path: string, content: string) =>
    t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key: team.key, raw: content });
  const row = async (ws: string) => ({
    ...(await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body,
    teamId: team.id,
    createdAt: new Date(),
    updatedAt: new Date(),
    deletedAt: null,
  });

  it('every hostile name, at the top and nested, is refused with a 400 or committed; commits keep working', async () => {
    const ws = await newWs('hostile');
    const dir = t.workspaces.dirOf(ws);
    let accepted = 0;
    for (const name of HOSTILE_NAMES) {
      for (const path of [name, `d1/${name}`, `d2/${name}/f.md`]) {
        const r = await put(ws, path, '* working-tree-encoding=UTF-16\n');
        expect([200, 400], `${JSON.stringify(path)}: ${JSON.stringify(r.body)}`).toContain(r.status);
        if (r.status === 400) {
          expect(r.body.error.code).toBe('invalid_request');
          continue;
        }
        accepted++;
        expect(r.body.commit.paths, JSON.stringify(path)).toEqual([path]);
        expect(git(dir, 'cat-file', '-p', `HEAD:${path}`)).toBe('* working-tree-encoding=UTF-16\n');
      }
    }
    for (const refused of [
      '.git.',
      '.git ',
      'git~1',
      'GIT~1',
      '.git::$INDEX_ALLOCATION',
      '.g\u200cit',
      '.gitattributes',
      '.gitignore',
      '.gitmodules',
      'line\nbreak',
    ]) {
      expect((await put(ws, `d/${refused}`, 'x')).status, JSON.stringify(refused)).toBe(400);
    }
    expect(accepted).toBeGreaterThan(40);
    // Nothing is left outside a commit, and the next write commits as usual.
    expect(git(dir, 'ls-files', '-z', '--others', '--modified')).toBe('');
    expect((await put(ws, 'after.md', 'still fine\n')).body.commit.paths).toEqual(['after.md']);
    const under = await put(ws, 'after.md/x.md', 'x');
    expect(under.status).toBe(400);
    expect(under.body.error.message).toMatch(/not a directory/);
    git(dir, 'fsck', '--no-progress');
  });

  it('ignore and attribute files already in a working tree hide nothing and break nothing', async () => {
    const ws = await newWs('legacy-dotfiles');
    const dir = t.workspaces.dirOf(ws);
    // What an older version let a sandbox write, before these names were refused.
    writeFileSync(join(dir, '.gitignore'), '*.md\nhidden/\n');
    mkdirSync(join(dir, 'knowledge/deep'), { recursive: true });
    writeFileSync(join(dir, 'knowledge/deep/.gitignore'), '*\n');
    writeFileSync(
      join(dir, '.gitattributes'),
      '* working-tree-encoding=UTF-16\n* filter=evil diff=evil merge=evil text eol=crlf ident\n',
    );
    mkdirSync(join(dir, 'hidden'));
    const token = `ghp_${'Qq7'.repeat(12)}`;
    writeFileSync(join(dir, 'hidden/creds.txt'), `token: ${token}\n`);
    writeFileSync(join(dir, 'knowledge/deep/notes.md'), 'deep $Id$ notes\n');
    mkdirSync(join(dir, '.git. '));
    writeFileSync(join(dir, '.git. /config'), 'x');
    const outcome = await t.workspaces.commitPending(await row(ws), { author: 'agent' });
    expect(outcome.commit!.paths).toEqual(['hidden/creds.txt', 'knowledge/deep/notes.md']);
    expect(outcome.refused.map((r) => r.path).sort()).toEqual([
      '.git. ',
      '.gitattributes',
      '.gitignore',
      'knowledge/deep/.gitignore',
    ]);
    expect(outcome.redactions.map((r) => r.path)).toEqual(['hidden/creds.txt']);
    expect(git(dir, 'show', 'HEAD:hidden/creds.txt')).not.toContain(token);
    // Stored byte for byte: no attribute converted anything.
    expect(git(dir, 'show', 'HEAD:knowledge/deep/notes.md')).toBe('deep $Id$ notes\n');
    expect(existsSync(join(dir, '.gitignore')) || existsSync(join(dir, '.git. '))).toBe(false);
    expect(git(dir, 'ls-files', '-z', '--others', '--modified')).toBe('');
    expect((await put(ws, 'knowledge/after.md', 'fine\n')).body.commit.paths).toEqual(['knowledge/after.md']);
    // One an older version committed stays in the tree, and still changes nothing.
    writeFileSync(
      join(dir, '.gitattributes'),
      '[attr]evil filter=evil text\n* working-tree-encoding=UTF-16 evil ident eol=crlf diff=evil merge=evil\n',
    );
    const blob = git(dir, 'hash-object', '-w', '--no-filters', '.gitattributes').trim();
    git(dir, 'update-index', '--add', '--cacheinfo', `100644,${blob},.gitattributes`);
    git(dir, '-c', 'user.name=old', '-c', 'user.email=old@old', 'commit', '-qm', 'committed by an older version');
    const tracked = await put(ws, 'knowledge/id.md', 'plain $Id$ text\n');
    expect(tracked.body.commit.paths).toEqual(['knowledge/id.md']);
    expect(git(dir, 'cat-file', '-p', 'HEAD:knowledge/id.md')).toBe('plain $Id$ text\n');
    expect(readFileSync(join(dir, 'knowledge/id.md'), 'utf8')).toBe('plain $Id$ text\n');
  });

  it('a commit that fails anyway puts the working tree back to HEAD, and the next commit works', async () => {
    const ws = await newWs('fails');
    const dir = t.workspaces.dirOf(ws);
    const head = git(dir, 'rev-parse', 'HEAD');
    // An embedded repository with no commit: git cannot add it (no request can create one).
    mkdirSync(join(dir, 'embedded'));
    git(join(dir, 'embedded'), 'init', '-q');
    const r = await put(ws, 'half.md', 'half-written\n');
    expect(r.status).toBe(500);
    expect(git(dir, 'rev-parse', 'HEAD')).toBe(head);
    expect(existsSync(join(dir, 'half.md'))).toBe(false);
    expect(git(dir, 'status', '--porcelain', '--ignored')).toBe('');
    const next = await put(ws, 'next.md', 'next\n');
    expect(next.status).toBe(200);
    expect(next.body.commit.paths).toEqual(['next.md']);
  });

  it('start-up repair logs, marks and skips a workspace it cannot repair, and clears the mark once it can', async () => {
    const broken = await newWs('repair-broken');
    const stranded = await newWs('repair-stranded');
    const legacy = await newWs('repair-legacy');
    const brokenDir = t.workspaces.dirOf(broken);
    mkdirSync(join(brokenDir, 'embedded'));
    git(join(brokenDir, 'embedded'), 'init', '-q');
    writeFileSync(join(brokenDir, 'kept.md'), 'written before the crash\n');
    writeFileSync(join(t.workspaces.dirOf(stranded), 'stranded.md'), 'stranded\n');
    // A name an older version let through, which made every commit (and this repair) fail.
    mkdirSync(join(t.workspaces.dirOf(legacy), '.git.'));
    writeFileSync(join(t.workspaces.dirOf(legacy), '.git./hooks'), 'x');
    writeFileSync(join(t.workspaces.dirOf(legacy), 'legacy.md'), 'legacy\n');

    const { failed } = await t.workspaces.repairAll();
    expect(failed).toBe(1);
    const repairedIds = t.logs.filter((l) => l.msg === 'repaired workspace').map((l) => l.workspace);
    expect(repairedIds).toEqual(expect.arrayContaining([stranded, legacy]));
    expect(repairedIds).not.toContain(broken);
    const b = (await t.call('GET', `/v1/workspaces/${broken}`, { key: team.key })).body;
    expect(b.repair_error).toMatch(/embedded/);
    expect(Date.parse(b.repair_failed_at)).not.toBeNaN();
    expect(t.logs.some((l) => l.workspace === broken && l.level === 50)).toBe(true);
    // Skipped, not wiped: what the crash left is still there for an operator.
    expect(readFileSync(join(brokenDir, 'kept.md'), 'utf8')).toBe('written before the crash\n');
    for (const ok of [stranded, legacy]) {
      const w = (await t.call('GET', `/v1/workspaces/${ok}`, { key: team.key })).body;
      expect(w).toMatchObject({ repair_error: null, repair_failed_at: null });
      expect(git(t.workspaces.dirOf(ok), 'status', '--porcelain', '--ignored')).toBe('');
    }
    expect(git(t.workspaces.dirOf(legacy), 'show', '--name-only', '--format=', 'HEAD').trim()).toBe('legacy.md');

    execFileSync('rm', ['-rf', join(brokenDir, 'embedded')]);
    await t.workspaces.repairAll();
    expect((await t.call('GET', `/v1/workspaces/${broken}`, { key: team.key })).body).toMatchObject({
      repair_error: null,
      repair_failed_at: null,
    });
    expect(git(brokenDir, 'show', '--name-only', '--format=', 'HEAD').trim()).toBe('kept.md');
  });
});
