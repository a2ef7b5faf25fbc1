import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKey } from '../../apps/api/src/auth/keys.ts';
import { createPgDatabase, dropPgDatabase } from '../support/db.ts';
import { startFakeOpenAI, type FakeOpenAI } from '../support/fake-openai.ts';
import { startKiln, type KilnProcess } from '../support/server.ts';

/** Polls until `check` returns a value (no fixed sleeps); fails after `ms`. */
async function until<T>(what: string, check: () => Promise<T | undefined>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('evolution jobs survive a crash of the server', () => {
  let fake: FakeOpenAI;
  let dir: string;
  let url: string;
  const procs: KilnProcess[] = [];

  beforeAll(async () => {
    fake = await startFakeOpenAI();
    dir = mkdtempSync(join(tmpdir(), 'kiln-evo-e2e-'));
    url = await createPgDatabase();
  });
  afterAll(async () => {
    for (const p of procs) {
      if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
      await p.exited;
    }
    await fake.close();
    await dropPgDatabase(url);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a dream that was running when the server was killed runs again after the restart, and commits once', async () => {
    const adminKey = generateKey('admin');
    const env = {
      KILN_DATA_DIR: dir,
      DATABASE_URL: url,
      KILN_ADMIN_KEY: adminKey,
      // The same instance comes back: its jobs are released at once instead of waiting out the lease.
      KILN_INSTANCE_ID: `evo-e2e-${process.pid}`,
      KILN_JOBS_POLL_MS: '100',
      OPENAI_BASE_URL: fake.url,
      OPENAI_API_KEY: 'k',
      KILN_MODEL: 'fake-model',
      KILN_MODEL_MAX_RETRIES: '0',
    };
    const start = async () => {
      const p = await startKiln(env);
      procs.push(p);
      return p;
    };
    let p = await start();
    const api = async (key: string, path: string, init: { method?: string; body?: unknown; raw?: string } = {}) => {
      const res = await fetch(`${p.url}${path}`, {
        method: init.method ?? 'GET',
        // A file's bytes go as octet-stream: a PUT /files sent as JSON is the {content} shape.
        headers: {
          authorization: `Bearer ${key}`,
          'content-type': init.raw === undefined ? 'application/json' : 'application/octet-stream',
        },
        body: init.raw ?? (init.body === undefined ? undefined : JSON.stringify(init.body)),
      });
      return { status: res.status, body: (await res.json()) as any };
    };
    const team = (await api(adminKey, '/v1/teams', { method: 'POST', body: { name: 'dreamers' } })).body;
    const key = (
      await api(adminKey, `/v1/teams/${team.id}/keys`, { method: 'POST', body: { name: 'o', role: 'owner' } })
    ).body.key;
    const ws = (
      await api(key, '/v1/workspaces', {
        method: 'POST',
        body: { name: 'w', settings: { approval: { mode: 'auto' } } },
      })
    ).body;
    const session = (await api(key, `/v1/workspaces/${ws.id}/sessions`, { method: 'POST', body: {} })).body;
    expect(
      (
        await api(key, `/v1/workspaces/${ws.id}/files?path=MEMORY.md`, {
          method: 'PUT',
          raw: '# Core memory\n\n- The build uses make.\n',
        })
      ).status,
    ).toBe(200);
    fake.script({ content: '<finish>Noted, we switched to ninja.</finish>' });
    const posted = (
      await api(key, `/v1/sessions/${session.id}/messages`, {
        method: 'POST',
        body: { content: 'We switched the build from make to ninja.' },
      })
    ).body;
    await until('the run to finish', async () =>
      (await api(key, `/v1/runs/${posted.run.id}`)).body.status === 'completed' ? true : undefined,
    );

    // The dream gets as far as the consolidation call, which never answers: then kill -9.
    const asked = fake.chats().length;
    fake.script({ content: '<daily_log>\n- The build moved from make to ninja.\n</daily_log>' }, { hang: true });
    const evo = (await api(key, `/v1/workspaces/${ws.id}/dream`, { method: 'POST', body: {} })).body;
    await fake.chatRequests(asked + 2);
    expect((await api(key, `/v1/workspaces/${ws.id}/evolutions/${evo.id}`)).body.status).toBe('running');
    p.child.kill('SIGKILL');
    await p.exited;

    fake.script(
      { content: '<daily_log>\n- The build moved from make to ninja.\n</daily_log>' },
      {
        content:
          '<memory>\n# Core memory\n\n- The build uses ninja (was make).\n</memory><diary>The build tool changed.</diary><summary>Build tool is now ninja</summary>',
      },
    );
    p = await start();
    const done = await until('the dream to run again', async () => {
      const e = (await api(key, `/v1/workspaces/${ws.id}/evolutions/${evo.id}`)).body;
      return ['committed', 'failed', 'skipped'].includes(e.status) ? e : undefined;
    });
    expect(done).toMatchObject({ status: 'committed', summary: 'Build tool is now ninja' });
    expect(fake.chats().length).toBe(asked + 4);
    const memory = (await api(key, `/v1/workspaces/${ws.id}/files?path=MEMORY.md`)).body;
    expect(memory.content).toBe('# Core memory\n\n- The build uses ninja (was make).\n');
    const commits = (await api(key, `/v1/workspaces/${ws.id}/commits?limit=100`)).body.data as any[];
    expect(commits.filter((c) => c.evolution_id === evo.id)).toHaveLength(1);
    const log = (await api(key, `/v1/workspaces/${ws.id}/files?path=memory`)).body.entries.map((e: any) => e.name);
    expect(log.filter((n: string) => /^\d{4}-\d{2}-\d{2}\.md$/.test(n))).toHaveLength(1);
  });
});
