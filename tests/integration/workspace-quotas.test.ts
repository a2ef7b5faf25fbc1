import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readForSandboxes } from '../../apps/api/src/workspace/quota.ts';
import { tarChunks } from '../../apps/api/src/sandbox/tar.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/** What one step and one workspace may hold: over a quota, nothing of the step is committed. */
describe('workspace quotas', () => {
  let t: TestApp;
  let team: { id: string; key: string };
  const git = (ws: string, ...args: string[]) =>
    execFileSync('git', ['-C', t.workspaces.dirOf(ws), ...args], { encoding: 'utf8' });

  beforeAll(async () => {
    t = await createTestApp();
    team = await t.team('quotas');
  });
  afterAll(() => t.close());

  it('25,000 empty files in one step fail the step with a clear error and commit nothing; the sandbox copy is put back', async () => {
    const { session, ws } = await sessionIn(t, team, { sandbox: { max_files_per_step: 100 } });
    const head = git(ws, 'rev-parse', 'HEAD');
    const r = await exec(
      t,
      team.key,
      session,
      [
        'import os',
        'os.makedirs("/workspace/many")',
        'for i in range(25000): open(f"/workspace/many/{i}", "w").close()',
        'open("/workspace/note.md", "w").write("kept?")',
        'print("done")',
      ].join('\n'),
    );
    expect(r.stdout).toBe('done\n');
    expect(r.error).toMatchObject({ type: 'QuotaExceeded' });
    expect(r.error!.message).toContain('100 files');
    expect(git(ws, 'rev-parse', 'HEAD')).toBe(head);
    expect(git(ws, 'status', '--porcelain')).toBe('');
    const after = await exec(
      t,
      team.key,
      session,
      'import os; print(os.path.exists("/workspace/many"), os.path.exists("/workspace/note.md"))',
    );
    expect(after.stdout).toBe('False False\n');
    // Within the quota, steps commit as before.
    const ok = await exec(t, team.key, session, 'open("/workspace/small.md", "w").write("fine")');
    expect(ok.error ?? null).toBeNull();
    expect(git(ws, 'show', 'HEAD:small.md')).toBe('fine');
  });

  it('a step over its byte quota commits nothing, even though every file is under the file size limit', async () => {
    const { session, ws } = await sessionIn(t, team, { sandbox: { max_bytes_per_step: 1000 } });
    const head = git(ws, 'rev-parse', 'HEAD');
    const r = await exec(
      t,
      team.key,
      session,
      'for n in ("a", "b"): open(f"/workspace/{n}.txt", "w").write("x" * 600)',
    );
    expect(r.error).toMatchObject({ type: 'QuotaExceeded' });
    expect(r.error!.message).toContain('1000 bytes');
    expect(git(ws, 'rev-parse', 'HEAD')).toBe(head);
  });

  it('a workspace over its total byte quota takes no more: from the sandbox or the files API', async () => {
    const { session, ws } = await sessionIn(t, team, { quota: { max_bytes: 60_000 } });
    const used = Number(
      execFileSync(
        'sh',
        ['-c', `find . -path ./.git -prune -o -type f -printf '%s\\n' | awk '{s+=$1} END {print s}'`],
        { cwd: t.workspaces.dirOf(ws), encoding: 'utf8' },
      ),
    );
    const room = 60_000 - used;
    expect(room).toBeGreaterThan(1000);
    const first = await exec(t, team.key, session, `open("/workspace/one.bin", "w").write("x" * ${room - 500})`);
    expect(first.error ?? null).toBeNull();
    const head = git(ws, 'rev-parse', 'HEAD');
    const second = await exec(t, team.key, session, 'open("/workspace/two.bin", "w").write("x" * 1000)');
    expect(second.error).toMatchObject({ type: 'QuotaExceeded' });
    expect(second.error!.message).toContain('60000 bytes');
    expect(git(ws, 'rev-parse', 'HEAD')).toBe(head);
    const put = await t.call('PUT', `/v1/workspaces/${ws}/files?path=three.bin`, {
      key: team.key,
      raw: 'y'.repeat(1000),
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(put.status).toBe(413);
    expect(put.body.error.message).toContain('60000 bytes');
    // Replacing a file with a smaller one still fits.
    const smaller = await exec(t, team.key, session, 'open("/workspace/one.bin", "w").write("x" * 10)');
    expect(smaller.error ?? null).toBeNull();
    expect(git(ws, 'show', 'HEAD:one.bin')).toBe('x'.repeat(10));
  });

  it('settings cannot raise a quota past the server-wide maximum', async () => {
    const res = await t.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'too-big', settings: { quota: { max_files: 0 } } },
    });
    expect(res.status).toBe(400);
    const { ws } = await sessionIn(t, team, {
      sandbox: { max_files_per_step: 1_000_000 },
      quota: { max_files: 10_000_000 },
    });
    const row = (await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body;
    const q = t.workspaces.quotaOf(row);
    expect(q.filesPerStep).toBeLessThan(1_000_000);
    expect(q.files).toBeLessThan(10_000_000);
  });
});

describe('reading committed files for the sandbox copies', () => {
  it('a read error is not a deletion: only a missing file is reported as deleted', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-read-'));
    try {
      writeFileSync(join(dir, 'kept.txt'), 'kept');
      mkdirSync(join(dir, 'now-a-dir'));
      const files = await readForSandboxes(
        (p) => import('node:fs/promises').then((fs) => fs.readFile(join(dir, p))),
        ['kept.txt', 'now-a-dir', 'gone.txt'],
      );
      expect(files).toEqual([
        { path: 'kept.txt', data: Buffer.from('kept') },
        { path: 'gone.txt', data: null },
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the tar path streams a workspace in chunks, never as one buffer of the whole tree', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-tar-'));
    try {
      writeFileSync(join(dir, 'big.bin'), Buffer.alloc(64 * 1024, 7));
      mkdirSync(join(dir, '.git'));
      writeFileSync(join(dir, '.git', 'HEAD'), 'ref: refs/heads/main\n');
      const chunks: Buffer[] = [];
      for await (const c of tarChunks(dir, 16 * 1024)) chunks.push(c);
      expect(chunks.length).toBeGreaterThanOrEqual(4);
      expect(Math.max(...chunks.map((c) => c.length))).toBe(16 * 1024);
      const tar = Buffer.concat(chunks).toString('latin1');
      expect(tar).toContain('./big.bin');
      expect(tar).not.toContain('.git/HEAD');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** One team's share of the host's disk: its number of workspaces and their bytes together. */
describe('per-team workspace caps', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await createTestApp({
      sandbox: false,
      maxFileBytes: 64 * 1024,
      env: { KILN_WORKSPACES_MAX_PER_TEAM: '3', KILN_TEAM_WORKSPACE_BYTES_MAX: String(100 * 1024) },
    });
  });
  afterAll(() => t.close());
  const create = (key: string, name: string) => t.call('POST', '/v1/workspaces', { key, body: { name } });
  const metric = async (name: string, of: string) => {
    const text = (await t.call('GET', '/metrics', { key: t.adminKey })).body as string;
    return Number(new RegExp(`^${name}\\{of="${of}"\\} (\\d+)$`, 'm').exec(text)?.[1]);
  };

  it('creates at most KILN_WORKSPACES_MAX_PER_TEAM, even all at once, and one more after a delete', async () => {
    const team = await t.team('count-cap');
    const other = await t.team('count-cap-other');
    const answers = await Promise.all(Array.from({ length: 6 }, (_, i) => create(team.key, `w${i}`)));
    const made = answers.filter((r) => r.status === 201);
    expect(made).toHaveLength(3);
    for (const r of answers.filter((a) => a.status !== 201)) {
      expect(r.status).toBe(409);
      expect(r.body.error.message).toMatch(/this team has 3 workspaces.*KILN_WORKSPACES_MAX_PER_TEAM=3.*delete one/);
    }
    // Nothing was left of the refused ones; another team is not affected.
    expect((await t.call('GET', '/v1/workspaces', { key: team.key })).body.data).toHaveLength(3);
    expect((await create(other.key, 'mine')).status).toBe(201);
    expect(await metric('kiln_workspaces', 'largest_team')).toBe(3);
    expect((await t.call('DELETE', `/v1/workspaces/${made[0]!.body.id}`, { key: team.key })).status).toBe(200);
    expect((await create(team.key, 'again')).status).toBe(201);
  });

  it("refuses a write that would take the team's workspaces past KILN_TEAM_WORKSPACE_BYTES_MAX, writing nothing", async () => {
    const team = await t.team('bytes-cap');
    const a = (await create(team.key, 'a')).body.id;
    const b = (await create(team.key, 'b')).body.id;
    const put = (ws: string, path: string, bytes: number) =>
      t.call('PUT', `/v1/workspaces/${ws}/files?path=${path}`, { key: team.key, raw: 'x'.repeat(bytes) });
    expect((await put(a, 'data/one.txt', 40 * 1024)).status).toBe(200);
    const head = execFileSync('git', ['-C', t.workspaces.dirOf(b), 'rev-parse', 'HEAD'], { encoding: 'utf8' });
    // a holds ~51 KiB with the template; b's ~11 KiB of template plus 40 KiB would pass 100 KiB.
    const over = await put(b, 'data/two.txt', 40 * 1024);
    expect(over.status).toBe(409);
    expect(over.body.error.message).toMatch(/team's workspaces would hold \d+ bytes.*KILN_TEAM_WORKSPACE_BYTES_MAX/);
    expect(execFileSync('git', ['-C', t.workspaces.dirOf(b), 'rev-parse', 'HEAD'], { encoding: 'utf8' })).toBe(head);
    expect(execFileSync('git', ['-C', t.workspaces.dirOf(b), 'status', '--porcelain'], { encoding: 'utf8' })).toBe('');
    // Shrinking one makes room for the other.
    expect((await put(a, 'data/one.txt', 1024)).status).toBe(200);
    expect((await put(b, 'data/two.txt', 40 * 1024)).status).toBe(200);
    expect(await metric('kiln_workspace_bytes', 'largest_team')).toBeGreaterThan(60 * 1024);
  });
});
