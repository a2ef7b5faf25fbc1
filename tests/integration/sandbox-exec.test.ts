import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, RUNTIMES, sessionIn } from '../support/sandbox.ts';

// The stateful runner, artifacts and files in/out under both runtimes (a gvisor run fails when it is not offered).
describe.each(RUNTIMES)('%s', (runtime) => {
  describe('stateful execution through the API', () => {
    let t: TestApp;
    let team: { id: string; key: string };
    let session: string;
    beforeAll(async () => {
      t = await createTestApp();
      team = await t.team('exec');
      ({ session } = await sessionIn(t, team, { sandbox: { runtime } }));
    });
    afterAll(() => t.close());

    it('keeps variables across executions and prints a trailing expression', async () => {
      const a = await exec(t, team.key, session, 'x = 20\ny = x * 2\ny + 2');
      expect(a).toMatchObject({ stdout: '42\n', exit_code: 0, truncated: false, restarted: false });
      expect(a.error).toBeUndefined();
      const b = await exec(t, team.key, session, 'print(x + y)');
      expect(b.stdout).toBe('60\n');
      expect(b.sandbox_id).toBe(a.sandbox_id);
    });

    it('reports exceptions with type, message and a traceback that starts in the cell', async () => {
      const r = await exec(t, team.key, session, 'def f():\n    return 1 / 0\nf()');
      expect(r.exit_code).toBe(1);
      expect(r.error).toMatchObject({ type: 'ZeroDivisionError', message: 'division by zero' });
      expect(r.error!.traceback).toContain('File "<cell>", line 2, in f');
      expect(r.error!.traceback).not.toContain('kiln_worker');
      expect(r.stderr).toContain('ZeroDivisionError');
      const syntax = await exec(t, team.key, session, 'def (');
      expect(syntax.error!.type).toBe('SyntaxError');
      expect((await exec(t, team.key, session, 'import sys\nsys.exit(3)')).exit_code).toBe(3);
      expect((await exec(t, team.key, session, 'x')).stdout).toBe('20\n');
    });

    it('returns matplotlib figures as PNG artifacts', async () => {
      const r = await exec(
        t,
        team.key,
        session,
        'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares");',
      );
      expect(r.artifacts).toHaveLength(1);
      expect(r.artifacts[0]).toMatchObject({ name: 'figure-1.png', mime: 'image/png' });
      expect(Buffer.from(r.artifacts[0]!.base64, 'base64').subarray(0, 4).toString('latin1')).toBe('\x89PNG');
      expect((await exec(t, team.key, session, 'print(len(plt.get_fignums()))')).stdout).toBe('0\n');
    });

    it('streams output as it is produced with ?stream=true', async () => {
      const res = await t.app.request(`/v1/sessions/${session}/exec?stream=true`, {
        method: 'POST',
        headers: { authorization: `Bearer ${team.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ code: 'import time\nprint("first", flush=True)\ntime.sleep(0.3)\nprint("second")' }),
      });
      expect(res.headers.get('content-type')).toContain('text/event-stream');
      const reader = res.body!.getReader();
      const seen: string[] = [];
      let text = '';
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
        const events = [...text.matchAll(/event: (\S+)\ndata: (.*)\n/g)].map((m) => `${m[1]} ${m[2]}`);
        seen.splice(0, seen.length, ...events);
      }
      const outputs = seen
        .filter((e) => e.startsWith('exec.output '))
        .map((e) => JSON.parse(e.slice('exec.output '.length)).data as string);
      // "first" arrived in its own event(s), before "second" was even printed.
      expect(outputs[0]).toContain('first');
      expect(outputs[0]).not.toContain('second');
      expect(outputs.join('')).toBe('first\nsecond\n');
      expect(seen.at(-1)).toMatch(/^exec.completed /);
      const completed = JSON.parse(seen.at(-1)!.slice('exec.completed '.length));
      expect(completed.stdout).toBe('first\nsecond\n');
    });

    it('puts files into the sandbox and fetches them back; bad paths are 400', async () => {
      const put = await t.call('PUT', `/v1/sessions/${session}/files?path=/workspace/data/in.csv`, {
        key: team.key,
        raw: 'a,b\n1,2\n3,4\n',
        headers: { 'content-type': 'text/csv' },
      });
      expect(put.status).toBe(200);
      expect(put.body).toEqual({ path: '/workspace/data/in.csv', size: 12 });
      const sum = await exec(
        t,
        team.key,
        session,
        'import pandas as pd\ndf = pd.read_csv("data/in.csv")\ndf.to_csv("/tmp/out.csv", index=False)\nint(df.b.sum())',
      );
      expect(sum.stdout).toBe('6\n');
      const got = await t.app.request(`/v1/sessions/${session}/files?path=/tmp/out.csv`, {
        headers: { authorization: `Bearer ${team.key}` },
      });
      expect(got.status).toBe(200);
      expect(await got.text()).toBe('a,b\n1,2\n3,4\n');
      for (const bad of ['relative.txt', '/workspace/../etc/passwd', '/etc/passwd', '/workspace', '/tmp//x']) {
        const r = await t.call('PUT', `/v1/sessions/${session}/files?path=${encodeURIComponent(bad)}`, {
          key: team.key,
          raw: 'x',
        });
        expect(r.status, bad).toBe(400);
      }
      const missing = await t.call('GET', `/v1/sessions/${session}/files?path=/tmp/nope`, { key: team.key });
      expect(missing.status).toBe(404);
    });

    it('cancelling a running execution interrupts it and keeps the variables', async () => {
      const ws = (await t.call('GET', `/v1/sessions/${session}`, { key: team.key })).body.workspace_id;
      const ctx = { teamId: team.id, workspaceId: ws, sessionId: session, runtime };
      const limits = t.engine.settings.limitsFor(
        (await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body.settings.sandbox,
      );
      const abort = new AbortController();
      const result = await t.engine.exec(
        ctx,
        limits,
        'import time\nprint("looping", flush=True)\nwhile True:\n    time.sleep(0.01)',
        {
          signal: abort.signal,
          onOutput: (_stream, data) => {
            if (data.includes('looping')) abort.abort();
          },
        },
      );
      expect(result.error).toMatchObject({ type: 'Cancelled' });
      expect(result.exit_code).toBe(130);
      expect(result.restarted).toBe(false);
      expect((await exec(t, team.key, session, 'x')).stdout).toBe('20\n');
    });
  });
});
