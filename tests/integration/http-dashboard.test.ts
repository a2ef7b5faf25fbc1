import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DASHBOARD_DIST } from '../../apps/api/src/http/dashboard.ts';
import { followRun, SseParser, StreamRefused, type RunEvent } from '../../apps/dashboard/src/sse.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const TERMINAL = new Set(['run.completed', 'run.failed', 'run.cancelled']);

/** The dashboard's files as the API serves them (npm test builds them first), and its SSE client. */
describe('dashboard served by the API', () => {
  const ctx = useAgentApp();
  let empty: string;
  let bare: TestApp;

  beforeAll(async () => {
    empty = mkdtempSync(join(tmpdir(), 'kiln-nodash-'));
    bare = await createTestApp({ dashboardDir: empty });
  });
  afterAll(async () => {
    await bare.close();
    rmSync(empty, { recursive: true, force: true });
  });

  it('serves the page at / and its hashed assets with types and long cache, without a key', async () => {
    const page = await ctx.t.app.request('/');
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toContain('text/html');
    expect(page.headers.get('cache-control')).toBe('no-cache');
    const html = await page.text();
    const assets = readdirSync(join(DASHBOARD_DIST, 'assets'));
    const js = assets.find((f) => f.endsWith('.js'))!;
    expect(html).toContain(`/assets/${js}`);
    const res = await ctx.t.app.request(`/assets/${js}`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    expect(res.headers.get('cache-control')).toContain('immutable');
    const css = assets.find((f) => f.endsWith('.css'))!;
    expect((await ctx.t.app.request(`/assets/${css}`)).headers.get('content-type')).toBe('text/css; charset=utf-8');
  });

  it('pages and API answers carry a Content-Security-Policy, X-Frame-Options and nosniff', async () => {
    for (const path of ['/', '/docs', '/docs/init.js', '/healthz', '/v1/teams']) {
      const res = await ctx.t.app.request(path);
      expect(res.headers.get('x-frame-options'), path).toBe('DENY');
      expect(res.headers.get('x-content-type-options'), path).toBe('nosniff');
      expect(res.headers.get('referrer-policy'), path).toBe('no-referrer');
      const csp = res.headers.get('content-security-policy') ?? '';
      expect(csp, path).toContain("script-src 'self'");
      expect(csp, path).toContain("frame-ancestors 'none'");
      expect(csp, path).not.toMatch(/script-src[^;]*unsafe/);
    }
    expect((await ctx.t.app.request('/')).headers.get('content-security-policy')).toContain("style-src 'self';");
    // The reference page runs no inline script: its start-up is a file of its own.
    const docs = await (await ctx.t.app.request('/docs')).text();
    expect(docs).not.toMatch(/<script>(?!<\/script>)/);
    expect(docs).toContain('<script src="/docs/init.js"></script>');
  });

  it('never serves anything outside assets/, and unknown paths keep the 404 envelope', async () => {
    for (const path of [
      '/assets/..%2Findex.html',
      '/assets/..%2F..%2F..%2Fpackage.json',
      '/assets/.hidden.js',
      '/assets/nope.js',
      '/assets/index.html',
      '/nothing',
    ]) {
      const r = await ctx.t.app.request(path);
      expect(r.status, path).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code, path).toBe('not_found');
    }
    expect((await ctx.t.app.request('/openapi.json')).status).toBe(200);
    expect((await ctx.t.app.request('/docs')).status).toBe(200);
    expect((await ctx.t.app.request('/healthz')).status).toBe(200);
  });

  it('without a build, / says how to build it', async () => {
    const r = await bare.app.request('/');
    expect(r.status).toBe(200);
    expect(await r.text()).toContain('npm run dashboard:build');
  });

  it('parses SSE split anywhere, with CRLF, comments and multi-line data', () => {
    const wire =
      ': hello\r\nid: 1\r\nevent: a\r\ndata: {"x":\r\ndata: 1}\r\n\r\nevent: ping\ndata: {}\n\nid: 2\nevent: b\ndata: two\n\n';
    for (const size of [1, 2, 3, 7, wire.length]) {
      const p = new SseParser();
      const frames = [];
      for (let i = 0; i < wire.length; i += size) frames.push(...p.push(wire.slice(i, i + size)));
      expect(frames, `chunks of ${size}`).toEqual([
        { id: '1', event: 'a', data: '{"x":\n1}' },
        { event: 'ping', data: '{}' },
        { id: '2', event: 'b', data: 'two' },
      ]);
    }
  });

  it('follows a run through a dropped connection with Last-Event-ID: every event once, in order', async () => {
    const team = await ctx.t.team('sse');
    const { session } = await sessionIn(ctx.t, team, { approval: { mode: 'auto' } });
    ctx.fake.script(
      { content: '<python>print("a")</python>' },
      { content: '<python>print("b")</python>' },
      { content: '<finish>done</finish>' },
    );
    const { run } = await converse(ctx.t, team.key, session, 'go');
    const asked: (string | null)[] = [];
    // The first connection is cut after its second frame, mid-stream.
    const cutting = async (url: string, init: RequestInit) => {
      asked.push(new Headers(init.headers).get('last-event-id'));
      const res = await ctx.t.app.request(url, init);
      if (asked.length > 1) return res;
      const reader = res.body!.getReader();
      let frames = 0;
      const body = new ReadableStream<Uint8Array>({
        async pull(ctrl) {
          const { value, done } = await reader.read();
          frames += value ? new TextDecoder().decode(value).split('\n\n').length - 1 : 0;
          if (done || frames >= 2) {
            if (value) ctrl.enqueue(value);
            await reader.cancel();
            return ctrl.close();
          }
          ctrl.enqueue(value);
        },
      });
      return new Response(body, { status: res.status, headers: res.headers });
    };
    const seen: RunEvent[] = [];
    await followRun({
      url: `/v1/runs/${run.id}/events`,
      headers: { authorization: `Bearer ${team.key}` },
      signal: new AbortController().signal,
      terminal: TERMINAL,
      onEvent: (e) => seen.push(e),
      fetch: cutting,
      retryMs: 0,
    });
    expect(asked.length).toBeGreaterThanOrEqual(2);
    expect(asked[0]).toBeNull();
    expect(Number(asked[1])).toBe(seen[Number(asked[1]) - 1]!.id);
    const stored = await ctx.t.call('GET', `/v1/runs/${run.id}/events`, {
      key: team.key,
      headers: { accept: 'application/json' },
    });
    expect(seen.map((e) => e.id)).toEqual(stored.body.data.map((e: { id: number }) => e.id));
    expect(seen.at(-1)!.event).toBe('run.completed');
  });

  it('a refused stream (unknown run) ends with the API\u2019s message instead of retrying', async () => {
    const team = await ctx.t.team('sse-refused');
    const follow = followRun({
      url: '/v1/runs/run_nope/events',
      headers: { authorization: `Bearer ${team.key}` },
      signal: new AbortController().signal,
      terminal: TERMINAL,
      onEvent: () => undefined,
      fetch: (u, i) => Promise.resolve(ctx.t.app.request(u, i)),
      retryMs: 0,
    });
    await expect(follow).rejects.toBeInstanceOf(StreamRefused);
    await expect(follow).rejects.toThrow(/run/);
  });
});
