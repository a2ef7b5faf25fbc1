/**
 * Egress benchmark (`npm run bench:egress`): what `sandbox.network: allowlist` costs, against
 * `none` measured in the same run. Prints medians, p95 and ratios; never fails on time.
 *
 *  1. warm exec of print(1): network none vs allowlist (the settings read, the proxy check and
 *     the log marker of every allowlist execution)
 *  2. warm exec of one HTTP GET through the proxy to an upstream on a Docker network of this
 *     benchmark's own
 *  3. cold start (new session to first result, no warm pool): none vs allowlist (its own
 *     network, the proxy attached to it, its rules written)
 *
 * Each under runc and under gVisor, against none in the same runtime (a gVisor sandbox reaches the
 * proxy through its egress bridge: a Unix socket, no network).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { connectDocker } from '../apps/api/src/sandbox/docker/connect.ts';
import { startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, row, summarize, timeEach } from './lib.ts';

const N = Number(process.env.BENCH_N ?? 100);
const COLD_N = Number(process.env.BENCH_COLD_N ?? 10);
const docker = connectDocker(process.env.DOCKER_HOST);
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
const UPSTREAM = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 80), H).serve_forever()
`;

async function main() {
  const tag = `${process.pid}`;
  const net = `kiln-bench-egress-${tag}`;
  await docker.createNetwork({ Name: net, Driver: 'bridge', Internal: true });
  const upstream = await docker.createContainer({
    Image: image,
    User: '0:0',
    Cmd: ['python3', '-c', UPSTREAM],
    HostConfig: { NetworkMode: net },
    NetworkingConfig: { EndpointsConfig: { [net]: { Aliases: ['api.bench.test'] } } },
  });
  await upstream.start();
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-'));
  const adminKey = generateKey('admin');
  const server = await startKiln({
    KILN_DATA_DIR: dataDir,
    KILN_ADMIN_KEY: adminKey,
    ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
    KILN_INSTANCE_ID: `bench-egress-${tag}`,
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_SANDBOX_MAX_PER_TEAM: '64',
    KILN_RATE_LIMIT_PER_MINUTE: '1000000',
    KILN_RATE_LIMIT_BURST: '1000000',
    KILN_SANDBOX_IMAGE: image,
    KILN_EGRESS_UPSTREAM_NETWORK: net,
  });
  const call = apiCaller(() => server.url);
  try {
    const team = await call(adminKey, 'POST', '/v1/teams', { name: 'bench' });
    const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'bench', role: 'owner' });
    const workspace = async (settings: unknown) =>
      (await call(key, 'POST', '/v1/workspaces', { name: `bench-${Math.random()}`, settings })).id as string;
    const session = async (ws: string) => (await call(key, 'POST', `/v1/workspaces/${ws}/sessions`, {})).id as string;
    const run = async (s: string, code: string) => {
      const r = await call(key, 'POST', `/v1/sessions/${s}/exec`, { code });
      if (r.error) throw new Error(`${r.error.type}: ${r.error.message}`);
      return r;
    };
    process.stdout.write(`Kiln egress benchmark — image ${image}\n`);
    // Each runtime against itself: a runc sandbox reaches the proxy on a network of its own, a
    // gVisor sandbox (no network) through its egress bridge's socket.
    for (const runtime of ['runc', 'gvisor'] as const) {
      const none = await workspace({ sandbox: { runtime } });
      const allow = await workspace({ sandbox: { runtime, network: 'allowlist', allow: ['api.bench.test'] } });

      heading(`${runtime} 1. warm exec of print(1), ${N} sequential calls`);
      const sNone = await session(none);
      const sAllow = await session(allow);
      const warmNone = summarize(await timeEach(N, () => run(sNone, 'print(1)'), 5));
      const warmAllow = summarize(await timeEach(N, () => run(sAllow, 'print(1)'), 5));
      process.stdout.write(`${row('baseline: network none', warmNone)}\n`);
      process.stdout.write(`${row('network allowlist (no request)', warmAllow, warmNone)}\n`);

      heading(`${runtime} 2. warm exec of one HTTP GET through the proxy, ${N} sequential calls`);
      const get = 'import urllib.request\nurllib.request.urlopen("http://api.bench.test/", timeout=10).read()';
      const warmGet = summarize(await timeEach(N, () => run(sAllow, get), 5));
      process.stdout.write(`${row('network allowlist, one allowed GET', warmGet, warmNone)}\n`);
      for (const s of [sNone, sAllow]) await call(key, 'DELETE', `/v1/sessions/${s}`);

      heading(`${runtime} 3. cold start: new session to first result, ${COLD_N} times (no warm pool)`);
      const cold = async (ws: string) => {
        const made: string[] = [];
        const s = summarize(
          await timeEach(
            COLD_N,
            async () => {
              const id = await session(ws);
              made.push(id);
              await run(id, 'print(1)');
            },
            1,
          ),
        );
        for (const id of made) await call(key, 'DELETE', `/v1/sessions/${id}`);
        return s;
      };
      const coldNone = await cold(none);
      const coldAllow = await cold(allow);
      process.stdout.write(`${row('baseline: network none', coldNone)}\n`);
      process.stdout.write(`${row('network allowlist', coldAllow, coldNone)}\n`);
    }
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
    await upstream.remove({ force: true });
    await docker.getNetwork(net).remove();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack ?? err}\n`);
  process.exit(1);
});
