import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { ensureEgressImage, ensureSandboxImage } from '../../sandbox-image/build.ts';
import { converse } from '../support/agent.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { type FakeOpenAI, startFakeOpenAI } from '../support/fake-openai.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/**
 * Egress through the proxy, against upstream HTTP and HTTPS servers this file starts in a
 * container on a Docker network of its own (never a host outside this machine). The proxy
 * joins that network (KILN_EGRESS_UPSTREAM_NETWORK); the sandboxes never do.
 */
const docker = new Docker();
const NAMES = ['api.allowed.test', 'other.refused.test', 'a.wild.test', 'b.c.wild.test', 'wild.test', 'y.only.test'];

/**
 * Serves every name on 80 (HTTP), 443 (HTTPS, the test's own CA) and 8080 and 22 (HTTP): each
 * answers "<host> <path>", followed by the name of any proxy header that reached it.
 */
const UPSTREAM = `
import http.server, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        # Anything the proxy should not pass on (the sandbox's credentials, its address) shows in the body.
        leaked = [h for h in ("Proxy-Authorization", "X-Forwarded-For", "Via") if h in self.headers]
        body = " ".join([self.headers.get("Host", "?").split(":")[0], self.path] + leaked).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
def serve(port, tls):
    s = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("/certs/cert.pem", "/certs/key.pem")
        s.socket = ctx.wrap_socket(s.socket, server_side=True)
    s.serve_forever()
for p, tls in ((80, False), (443, True), (8080, False), (22, False)):
    threading.Thread(target=serve, args=(p, tls), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
`;

/** Python run in the sandbox: each probe prints one JSON line {name, ok, detail}. */
const PROBES = (ca: string) => `
import json, os, socket, ssl, urllib.request, urllib.error, http.client
CA = ${JSON.stringify(ca)}
ctx = ssl.create_default_context(cadata=CA)
def probe(name, f):
    try:
        print(json.dumps({"name": name, "ok": True, "detail": f()}))
    except Exception as e:
        print(json.dumps({"name": name, "ok": False, "detail": type(e).__name__ + ": " + str(e)[:200]}))
def get(url):
    with urllib.request.urlopen(url, timeout=10, context=ctx if url.startswith("https") else None) as r:
        return r.read().decode()
`;

interface Probe {
  name: string;
  ok: boolean;
  detail: string;
}
const probes = (stdout: string): Record<string, Probe> =>
  Object.fromEntries(
    stdout
      .trim()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Probe)
      .map((p) => [p.name, p]),
  );

/** The test app's instance id: the `kiln.owner` label of everything its engine creates. */
const instanceOf = (t: TestApp) => (t.engine as unknown as { opts: { instance: string } }).opts.instance;

describe('sandbox egress through the allowlist proxy', () => {
  const tag = randomBytes(4).toString('hex');
  const netName = `kiln-egress-test-${tag}`;
  const certDir = mkdtempSync(join(tmpdir(), 'kiln-egress-certs-'));
  let upstream: Docker.Container;
  let upstreamIp: string;
  let ca: string;
  let t: TestApp;
  let fake: FakeOpenAI;
  let teamA: { id: string; key: string };
  let teamB: { id: string; key: string };

  beforeAll(async () => {
    const image = await ensureSandboxImage();
    await ensureEgressImage();
    // A CA and a server certificate for every upstream name, made for this run.
    const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: certDir, stdio: 'pipe' });
    ssl(
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
      '-days',
      '2',
      '-subj',
      '/CN=kiln-test-ca',
    );
    ssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'key.pem', '-out', 'req.csr', '-subj', '/CN=upstream');
    writeFileSync(
      join(certDir, 'san.ext'),
      `subjectAltName=${['*.wild.test', ...NAMES].map((n) => `DNS:${n}`).join(',')}\n`,
    );
    ssl('x509', '-req', '-in', 'req.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'cert.pem');
    ssl(
      'x509',
      '-req',
      '-in',
      'req.csr',
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-out',
      'cert.pem',
      '-days',
      '2',
      '-extfile',
      'san.ext',
    );
    chmodSync(join(certDir, 'key.pem'), 0o644);
    ca = readFileSync(join(certDir, 'ca.pem'), 'utf8');
    await docker.createNetwork({ Name: netName, Driver: 'bridge', Internal: true, Labels: { 'kiln.test': tag } });
    upstream = await docker.createContainer({
      name: `kiln-egress-upstream-${tag}`,
      Image: image,
      User: '0:0',
      Cmd: ['python3', '-c', UPSTREAM],
      Labels: { 'kiln.test': tag },
      HostConfig: { NetworkMode: netName, Binds: [`${certDir}:/certs:ro`] },
      NetworkingConfig: { EndpointsConfig: { [netName]: { Aliases: NAMES } } },
    });
    await upstream.start();
    upstreamIp = (await upstream.inspect()).NetworkSettings.Networks[netName]!.IPAddress;
    fake = await startFakeOpenAI();
    t = await createTestApp({
      env: { KILN_EGRESS_UPSTREAM_NETWORK: netName },
      model: { baseURL: fake.url, model: 'fake-model' },
    });
    teamA = await t.team('egress-a');
    teamB = await t.team('egress-b');
  }, 240_000);

  afterAll(async () => {
    await t?.close();
    await fake?.close();
    await upstream?.remove({ force: true }).catch(() => undefined);
    await docker
      .getNetwork(netName)
      .remove()
      .catch(() => undefined);
    rmSync(certDir, { recursive: true, force: true });
  });

  /** A session in a new allowlist workspace: runc unless said (gVisor sandboxes reach the proxy through a bridge socket). */
  const allowlist = async (team: { key: string }, allow: string[], runtime: 'runc' | 'gvisor' = 'runc') =>
    sessionIn(t, team, { sandbox: { network: 'allowlist', allow, runtime } });
  const proxyOf = (stdout: string) => new URL(stdout.trim().split('\n').at(-1)!);

  it('validates sandbox.network and sandbox.allow at the edge (400, nothing written) and audits a change', async () => {
    const { ws } = await sessionIn(t, teamA);
    const bad: unknown[] = [
      ['10.0.0.1'],
      ['*'],
      ['*.com'],
      ['Api.Example.com'],
      ['a.*.example.com'],
      ['localhost'],
      ['example.com:22'],
      ['example.com:8080'],
      ['xn--zz.example.com'],
      ['ex--ample.com'],
      [`${'a'.repeat(64)}.example.com`],
      ['http://example.com'],
      ['exa mple.com'],
      ['bücher.example'],
      ['a.example.com', 'a.example.com'],
      Array.from({ length: 101 }, (_, i) => `h${i}.example.com`),
      'example.com',
    ];
    for (const allow of bad) {
      const r = await t.call('PATCH', `/v1/workspaces/${ws}`, {
        key: teamA.key,
        body: { settings: { sandbox: { allow } } },
      });
      expect(r.status, JSON.stringify(allow)).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
    }
    const mode = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: teamA.key,
      body: { settings: { sandbox: { network: 'open' } } },
    });
    expect(mode.status).toBe(400);
    const unchanged = await t.call('GET', `/v1/workspaces/${ws}`, { key: teamA.key });
    expect(unchanged.body.settings.sandbox).toMatchObject({ network: 'none', allow: [] });

    const good = ['api.example.com', '*.example.org', 'xn--bcher-kva.example:443', 'plain.example.net:80'];
    const ok = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: teamA.key,
      body: { settings: { sandbox: { network: 'allowlist', allow: good } } },
    });
    expect(ok.status).toBe(200);
    expect(ok.body.settings.sandbox).toMatchObject({ network: 'allowlist', allow: good });
    const audit = await t.call('GET', '/v1/audit?limit=20', { key: teamA.key });
    const update = audit.body.data.find(
      (e: { action: string; resource_id: string }) => e.action === 'workspace.update' && e.resource_id === ws,
    );
    expect(update.after.settings.sandbox.allow).toEqual(good);
    expect(update.before.settings.sandbox.network).toBe('none');

    // Another team's workspace does not exist for this team.
    const across = await t.call('PATCH', `/v1/workspaces/${ws}`, {
      key: teamB.key,
      body: { settings: { sandbox: { allow: [] } } },
    });
    expect(across.status).toBe(404);
  });

  it.each(['runc', 'gvisor'] as const)(
    '%s: reaches allowed names over HTTP and HTTPS only through the proxy, refuses everything else, and records every request',
    async (runtime) => {
      const { session } = await allowlist(teamA, ['api.allowed.test', '*.wild.test'], runtime);
      const code = `${PROBES(ca)}
probe("http", lambda: get("http://api.allowed.test/one"))
probe("https", lambda: get("https://api.allowed.test/two"))
probe("refused", lambda: get("http://other.refused.test/"))
probe("wild", lambda: get("https://a.wild.test/w"))
probe("wild_deep", lambda: get("http://b.c.wild.test/d"))
probe("wild_parent", lambda: get("https://wild.test/"))
probe("ip_via_proxy", lambda: get("http://${upstreamIp}/"))
probe("ip_tls_via_proxy", lambda: get("https://${upstreamIp}/"))
probe("port_8080", lambda: get("http://api.allowed.test:8080/"))
import base64, urllib.parse
PROXY = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
AUTH = "Basic " + base64.b64encode(f"{PROXY.username}:{PROXY.password}".encode()).decode()
def connect22():
    c = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=10)
    c.set_tunnel("api.allowed.test", 22, headers={"Proxy-Authorization": AUTH})
    c.request("GET", "/"); return c.getresponse().status
def raw(method, url):
    c = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=10)
    c.putrequest(method, url, skip_host=True, skip_accept_encoding=True)
    c.putheader("Proxy-Authorization", AUTH); c.endheaders()
    return c.getresponse().status
probe("ftp", lambda: raw("GET", "ftp://api.allowed.test:80/"))
probe("manager", lambda: raw("GET", "cache_object://api.allowed.test/info"))
probe("post", lambda: raw("POST", "http://api.allowed.test/"))
probe("connect_22", connect22)
probe("https_on_80", lambda: get("https://api.allowed.test:80/"))
probe("direct_ip", lambda: socket.create_connection(("${upstreamIp}", 80), timeout=3).close())
probe("dns", lambda: socket.getaddrinfo("api.allowed.test", 443))
probe("dns_outside", lambda: socket.getaddrinfo("deb.debian.org", 80))
probe("proxy_other_port", lambda: socket.create_connection((urllib.parse.urlsplit(os.environ["HTTP_PROXY"]).hostname, 22), timeout=3).close())
def bare(data):
    s = socket.create_connection((PROXY.hostname, PROXY.port), timeout=10)
    if data: s.sendall(data)
    s.shutdown(socket.SHUT_WR); answer = s.recv(64); s.close(); return answer[:12].decode()
probe("bare", lambda: bare(b""))
probe("garbage", lambda: bare(b"HELLO THERE\\r\\n\\r\\n"))
def no_auth():
    c = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=10)
    c.request("GET", "http://api.allowed.test/"); return c.getresponse().status
probe("no_auth", no_auth)
print(os.environ["HTTP_PROXY"])
`;
      const r = await exec(t, teamA.key, session, code, 60);
      const p = probes(r.stdout);
      expect(p.http).toMatchObject({ ok: true, detail: 'api.allowed.test /one' });
      expect(p.https).toMatchObject({ ok: true, detail: 'api.allowed.test /two' });
      expect(p.wild).toMatchObject({ ok: true, detail: 'a.wild.test /w' });
      expect(p.wild_deep).toMatchObject({ ok: true, detail: 'b.c.wild.test /d' });
      expect(p.refused).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.wild_parent).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.ip_via_proxy).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.ip_tls_via_proxy).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.port_8080).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.connect_22).toMatchObject({ ok: false, detail: expect.stringContaining('403') });
      expect(p.https_on_80!.ok).toBe(false);
      // Only HTTP goes through, to allowed names (no FTP, no cache manager); any method of it.
      expect(p.ftp).toMatchObject({ ok: true, detail: 403 });
      expect(p.manager).toMatchObject({ ok: true, detail: 403 });
      expect(p.post).toMatchObject({ ok: true, detail: 501 });
      expect(p.direct_ip!.ok).toBe(false);
      expect(p.dns).toMatchObject({ ok: false, detail: expect.stringContaining('gaierror') });
      expect(p.dns_outside).toMatchObject({ ok: false, detail: expect.stringContaining('gaierror') });
      expect(p.proxy_other_port!.ok).toBe(false);
      const proxy = proxyOf(r.stdout);
      expect(proxy.username).toBe(r.sandbox_id);

      // Every request that reached the proxy is an event of this execution, allowed or refused.
      const ev = (host: string, port: number, method: string) =>
        r.egress.find((e) => e.host === host && e.port === port && e.method === method);
      expect(ev('api.allowed.test', 80, 'GET')).toMatchObject({ allowed: true, status: 200 });
      expect(ev('api.allowed.test', 443, 'CONNECT')).toMatchObject({ allowed: true, status: 200 });
      expect(ev('api.allowed.test', 443, 'CONNECT')!.bytes_in).toBeGreaterThan(0);
      expect(ev('a.wild.test', 443, 'CONNECT')).toMatchObject({ allowed: true });
      expect(ev('b.c.wild.test', 80, 'GET')).toMatchObject({ allowed: true, status: 200 });
      expect(ev('other.refused.test', 80, 'GET')).toMatchObject({ allowed: false, status: 403 });
      expect(ev('wild.test', 443, 'CONNECT')).toMatchObject({ allowed: false, status: 403 });
      expect(ev(upstreamIp, 80, 'GET')).toMatchObject({ allowed: false, status: 403 });
      expect(ev(upstreamIp, 443, 'CONNECT')).toMatchObject({ allowed: false, status: 403 });
      expect(ev('api.allowed.test', 8080, 'GET')).toMatchObject({ allowed: false, status: 403 });
      expect(ev('api.allowed.test', 22, 'CONNECT')).toMatchObject({ allowed: false, status: 403 });
      expect(ev('api.allowed.test', 80, 'POST')).toMatchObject({ allowed: true, status: 501 });
      expect(ev('api.allowed.test', 0, 'GET')).toMatchObject({ allowed: false, status: 403 });
      // What the proxy decided, not what reached it: a bare connection, garbage (its own 400) and a
      // request without credentials (407) were let through to nowhere, and say so.
      expect(p.garbage).toMatchObject({ ok: true, detail: 'HTTP/1.1 400' });
      expect(p.no_auth).toMatchObject({ ok: true, detail: 407 });
      expect(ev('error:transaction-end-before-headers', 0, '-')).toMatchObject({ allowed: false, status: 0 });
      expect(ev('error:invalid-request', 0, 'HELLO')).toMatchObject({ allowed: false, status: 400 });
      expect(r.egress.filter((e) => e.status === 407)).toEqual([expect.objectContaining({ allowed: false })]);
      // One event per request that reached the proxy (all but the direct and DNS probes).
      expect(r.egress).toHaveLength(17);
      expect(r.egress.filter((e) => e.allowed)).toHaveLength(5);

      // The execution's record holds them too.
      const [row] = rowsOf<{ egress: unknown[] }>(
        await t.database.db.execute(sql`select egress from executions where id = ${r.execution_id}`),
      );
      expect(row!.egress).toEqual(r.egress);
      // Nothing from an earlier execution is reported again.
      const quiet = await exec(t, teamA.key, session, 'print(1)');
      expect(quiet.egress).toEqual([]);
      expect(quiet.sandbox_id).toBe(r.sandbox_id);
    },
  );

  it('keeps workspaces apart: rules never mix, credentials work for no one else, a network-none sandbox has no network', async () => {
    const x = await allowlist(teamA, ['api.allowed.test']);
    const y = await allowlist(teamB, ['y.only.test']);
    const none = await sessionIn(t, teamB);
    const both = `${PROBES(ca)}
probe("api", lambda: get("http://api.allowed.test/"))
probe("y", lambda: get("http://y.only.test/"))
print(os.environ["HTTP_PROXY"])
`;
    const [rx, ry] = await Promise.all([
      exec(t, teamA.key, x.session, both, 60),
      exec(t, teamB.key, y.session, both, 60),
    ]);
    expect(probes(rx.stdout).api!.ok).toBe(true);
    expect(probes(rx.stdout).y!.ok).toBe(false);
    expect(probes(ry.stdout).api!.ok).toBe(false);
    expect(probes(ry.stdout).y!.ok).toBe(true);
    expect(rx.egress.map((e) => [e.host, e.allowed])).toEqual([
      ['api.allowed.test', true],
      ['y.only.test', false],
    ]);
    expect(ry.egress.map((e) => [e.host, e.allowed])).toEqual([
      ['api.allowed.test', false],
      ['y.only.test', true],
    ]);

    // Y holding X's credentials: X's proxy address is not on Y's network, and through its own
    // they are refused (they belong to another sandbox's address).
    const px = proxyOf(rx.stdout);
    const py = proxyOf(ry.stdout);
    expect(px.hostname).not.toBe(py.hostname);
    // X listens on its own address (its interpreter keeps the thread): reachable from X itself.
    const xIp = px.hostname.replace(/\.\d+$/, (m) => `.${Number(m.slice(1)) + 1}`);
    const listen = `${PROBES(ca)}
import threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("0.0.0.0", 8000)); srv.listen()
threading.Thread(target=lambda: [srv.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
probe("self", lambda: socket.create_connection((${JSON.stringify(xIp)}, 8000), timeout=3).close())
`;
    expect(probes((await exec(t, teamA.key, x.session, listen, 60)).stdout).self!.ok).toBe(true);
    const stolen = `${PROBES(ca)}
probe("x_proxy", lambda: socket.create_connection((${JSON.stringify(px.hostname)}, 3128), timeout=3).close())
os.environ["HTTP_PROXY"] = os.environ["http_proxy"] = ${JSON.stringify(`http://${px.username}:${px.password}@${py.hostname}:3128`)}
probe("x_creds", lambda: get("http://api.allowed.test/"))
probe("peer", lambda: socket.create_connection((${JSON.stringify(xIp)}, 8000), timeout=3).close())
`;
    const rs = await exec(t, teamB.key, y.session, stolen, 60);
    const ps = probes(rs.stdout);
    expect(ps.x_proxy!.ok).toBe(false);
    expect(ps.x_creds).toMatchObject({ ok: false, detail: expect.stringMatching(/40[37]/) });
    // Not refused (which would mean it got there): no route to X at all.
    expect(ps.peer).toMatchObject({ ok: false, detail: expect.not.stringContaining('refused') });

    // Network none: no interface but loopback, nothing reachable, no name resolves.
    const rn = await exec(
      t,
      teamB.key,
      none.session,
      `${PROBES(ca)}
print(json.dumps(sorted(os.listdir("/sys/class/net"))))
probe("proxy", lambda: socket.create_connection((${JSON.stringify(px.hostname)}, 3128), timeout=3).close())
probe("dns", lambda: socket.getaddrinfo("api.allowed.test", 80))
`,
      60,
    );
    expect(rn.stdout.split('\n')[0]).toBe('["lo"]');
    expect(probes(rn.stdout).proxy!.ok).toBe(false);
    expect(probes(rn.stdout).dns!.ok).toBe(false);
    expect(rn.egress).toEqual([]);
  });

  it('gVisor: a sandbox with no network reaches the proxy through its own bridge socket only; no one can speak for it or starve it', async () => {
    const g1 = await allowlist(teamA, ['api.allowed.test'], 'gvisor');
    const g2 = await allowlist(teamB, ['y.only.test'], 'gvisor');
    const r = await allowlist(teamB, ['y.only.test']);
    const both = `${PROBES(ca)}
print(json.dumps(sorted(os.listdir("/sys/class/net"))))
probe("api", lambda: get("http://api.allowed.test/"))
probe("y", lambda: get("http://y.only.test/"))
probe("direct", lambda: socket.create_connection(("${upstreamIp}", 80), timeout=3).close())
print(os.environ["HTTP_PROXY"])
`;
    const [r1, r2] = await Promise.all([
      exec(t, teamA.key, g1.session, both, 60),
      exec(t, teamB.key, g2.session, both, 60),
    ]);
    // Loopback only: the proxy is the bridge's address there, and each is credited with its own requests.
    expect(r1.stdout.split('\n')[0]).toBe('["lo"]');
    expect(proxyOf(r1.stdout).hostname).toBe('127.0.0.1');
    expect(probes(r1.stdout)).toMatchObject({ api: { ok: true }, y: { ok: false }, direct: { ok: false } });
    expect(probes(r2.stdout)).toMatchObject({ api: { ok: false }, y: { ok: true }, direct: { ok: false } });
    expect(r1.egress.map((e) => [e.host, e.allowed])).toEqual([
      ['api.allowed.test', true],
      ['y.only.test', false],
    ]);
    expect(r2.egress.map((e) => [e.host, e.allowed])).toEqual([
      ['api.allowed.test', false],
      ['y.only.test', true],
    ]);

    // The container: gVisor's egress runtime, no network, only its own bridge directory mounted (read-only).
    const info = await docker.getContainer(`kiln-${r1.sandbox_id}`).inspect();
    expect(info.HostConfig.Runtime).toBe('kiln-gvisor-egress');
    expect(info.HostConfig.NetworkMode).toBe('none');
    const bridge = info.Mounts.find((m) => m.Destination === '/run/kiln-egress');
    expect(bridge).toMatchObject({ Type: 'bind', RW: false });
    expect(bridge!.Source).toContain(r1.sandbox_id);
    // The bridge is the container's keeper process: the code's uid cannot stop it.
    const kill = await exec(
      t,
      teamA.key,
      g1.session,
      `${PROBES(ca)}
import signal
def kill_bridge():
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if b"kiln_bridge" in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(int(pid), signal.SIGKILL); return pid
        except (FileNotFoundError, ProcessLookupError): pass
    return "none"
probe("kill", kill_bridge)
probe("after", lambda: get("http://api.allowed.test/after"))
`,
      60,
    );
    expect(probes(kill.stdout).kill).toMatchObject({ ok: false, detail: expect.stringContaining('PermissionError') });
    expect(probes(kill.stdout).after).toMatchObject({ ok: true, detail: 'api.allowed.test /after' });

    // A runc sandbox cannot speak for it: the proxy takes a PROXY header from the API host only.
    const backend = (t.engine as unknown as { backend: { proxies: Map<string, unknown> } }).backend;
    const proxy = backend.proxies.get(instanceOf(t)) as { attached: Map<string, { sandboxIp: string; token: string }> };
    const g1a = proxy.attached.get(r1.sandbox_id)!;
    const forged = await exec(
      t,
      teamB.key,
      r.session,
      `${PROBES(ca)}
import urllib.parse, base64
P = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
AUTH = base64.b64encode(${JSON.stringify(`${r1.sandbox_id}:${g1a.token}`)}.encode()).decode()
def forge():
    s = socket.create_connection((P.hostname, 3129), timeout=10)
    s.sendall(b"PROXY TCP4 ${g1a.sandboxIp} " + P.hostname.encode() + b" 1234 3129\\r\\n"
              b"GET http://api.allowed.test/forged HTTP/1.1\\r\\nHost: api.allowed.test\\r\\nProxy-Authorization: Basic " + AUTH.encode() + b"\\r\\n\\r\\n")
    data = s.recv(200); s.close(); return data.decode(errors="replace")
probe("forge", forge)
`,
      60,
    );
    const f = probes(forged.stdout).forge;
    expect(f, forged.stdout + forged.stderr).toBeDefined();
    expect(f!.ok ? f!.detail : '').not.toContain('/forged');
    expect(f!.ok ? f!.detail : '').not.toContain('200 OK');

    // One bridged sandbox holding every connection it may still leaves another's egress alone
    // (the proxy counts them by the address its bridge vouches for, not the host's).
    const hold = await exec(
      t,
      teamA.key,
      g1.session,
      'import socket\nheld = [socket.create_connection(("127.0.0.1", 3128), timeout=5) for _ in range(70)]\nprint(len(held))',
      60,
    );
    expect(hold.stdout.trim()).toBe('70');
    const still = await exec(
      t,
      teamB.key,
      g2.session,
      `${PROBES(ca)}\nprobe("y", lambda: get("http://y.only.test/still"))`,
      60,
    );
    expect(probes(still.stdout).y).toMatchObject({ ok: true, detail: 'y.only.test /still' });

    // Its bridge directory goes with its sandbox.
    expect(existsSync(bridge!.Source)).toBe(true);
    expect((await t.call('DELETE', `/v1/sessions/${g1.session}`, { key: teamA.key })).status).toBe(200);
    await vi.waitFor(() => expect(existsSync(bridge!.Source)).toBe(false), { timeout: 30_000 });
  });

  it('applies a settings change at the next execution: new patterns on the same sandbox, a new mode on a new one', async () => {
    const { ws, session } = await allowlist(teamA, ['api.allowed.test']);
    const code = `${PROBES(ca)}\nprobe("other", lambda: get("http://other.refused.test/"))\n`;
    const before = await exec(t, teamA.key, session, `x = 1\n${code}`, 60);
    expect(probes(before.stdout).other!.ok).toBe(false);
    const patch = (sandbox: unknown) =>
      t.call('PATCH', `/v1/workspaces/${ws}`, { key: teamA.key, body: { settings: { sandbox } } });
    expect((await patch({ allow: ['api.allowed.test', 'other.refused.test'] })).status).toBe(200);
    const after = await exec(t, teamA.key, session, `print(x)\n${code}`, 60);
    expect(after.sandbox_id).toBe(before.sandbox_id);
    expect(after.stdout.startsWith('1\n')).toBe(true);
    expect(probes(after.stdout).other).toMatchObject({ ok: true, detail: 'other.refused.test /' });
    expect(after.egress).toEqual([expect.objectContaining({ host: 'other.refused.test', allowed: true })]);

    // A file put into the sandbox keeps it (and its network).
    const put = await t.call('PUT', `/v1/sessions/${session}/files?path=/tmp/in.txt`, {
      key: teamA.key,
      raw: 'hello',
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(put.status).toBe(200);
    const kept = await exec(t, teamA.key, session, `print(open("/tmp/in.txt").read(), x)\n${code}`, 60);
    expect(kept.sandbox_id).toBe(before.sandbox_id);
    expect(kept.stdout.startsWith('hello 1\n')).toBe(true);
    expect(probes(kept.stdout).other!.ok).toBe(true);

    expect((await patch({ network: 'none' })).status).toBe(200);
    const off = await exec(t, teamA.key, session, 'import os\nprint(sorted(os.listdir("/sys/class/net")))', 60);
    expect(off.sandbox_id).not.toBe(before.sandbox_id);
    expect(off.restarted).toBe(true);
    expect(off.stdout).toBe("['lo']\n");
  });

  it('KILN_EGRESS=off forbids allowlists (400) and runs a workspace that has one without a network; KILN_EGRESS_MAX_ALLOW caps them', async () => {
    const { ws, session } = await allowlist(teamA, ['api.allowed.test']);
    const off = await createTestApp({ replicaOf: t, env: { KILN_EGRESS: 'off', KILN_EGRESS_MAX_ALLOW: '2' } });
    try {
      const patch = (sandbox: unknown) =>
        off.call('PATCH', `/v1/workspaces/${ws}`, { key: teamA.key, body: { settings: { sandbox } } });
      const refused = await patch({ network: 'allowlist' });
      expect(refused.status).toBe(400);
      expect(refused.body.error.message).toContain('KILN_EGRESS=off');
      const tooMany = await patch({ allow: ['a.example.com', 'b.example.com', 'c.example.com'] });
      expect(tooMany.status).toBe(400);
      expect(tooMany.body.error.message).toContain('KILN_EGRESS_MAX_ALLOW');
      const r = await exec(off, teamA.key, session, 'import os\nprint(sorted(os.listdir("/sys/class/net")))', 60);
      expect(r.stdout).toBe("['lo']\n");
      expect(r.egress).toEqual([]);
    } finally {
      await off.close();
    }
  });

  it('answers 503 when the proxy cannot start (no image), and leaves nothing behind', async () => {
    const broken = await createTestApp({ replicaOf: t, env: { KILN_EGRESS_IMAGE: `kiln-egress:missing-${tag}` } });
    try {
      const { session } = await allowlist(teamA, ['api.allowed.test']);
      const r = await broken.call('POST', `/v1/sessions/${session}/exec`, {
        key: teamA.key,
        body: { code: 'print(1)' },
      });
      expect(r.status).toBe(503);
      expect(r.body.error.code).toBe('unavailable');
      expect(r.body.error.message).toContain('egress proxy');
    } finally {
      await broken.close();
    }
    const left = await docker.listNetworks({ filters: { label: [`kiln.owner=${instanceOf(broken)}`] } });
    expect(left).toEqual([]);
  });

  it("records an agent run's requests in its exec.completed event and tells the model what was refused", async () => {
    const { session } = await sessionIn(t, teamA, {
      approval: { mode: 'auto' },
      sandbox: { network: 'allowlist', allow: ['api.allowed.test'] },
    });
    const code = `${PROBES(ca)}\nprobe("ok", lambda: get("http://api.allowed.test/agent"))\nprobe("no", lambda: get("http://other.refused.test/"))`;
    fake.script({ content: `<python>\n${code}\n</python>` }, { content: '<finish>done</finish>' });
    const { run, events } = await converse(t, teamA.key, session, 'fetch it');
    expect(run.status).toBe('completed');
    const done = events.find((e) => e.event === 'exec.completed')!.data as {
      egress: { host: string; allowed: boolean }[];
    };
    expect(done.egress.map((e) => [e.host, e.allowed])).toEqual([
      ['api.allowed.test', true],
      ['other.refused.test', false],
    ]);
    const feedback = JSON.stringify(fake.chats()[1].messages.at(-1));
    expect(feedback).toContain("refused by the workspace's egress allowlist: other.refused.test:80");
    expect(fake.refusals).toEqual([]);
  });

  it('recreates the proxy when it is gone: the next execution of a live sandbox reaches its names again', async () => {
    const { session } = await allowlist(teamA, ['api.allowed.test']);
    const code = `${PROBES(ca)}\nprobe("ok", lambda: get("http://api.allowed.test/again"))`;
    const first = await exec(t, teamA.key, session, code, 60);
    expect(probes(first.stdout).ok!.ok).toBe(true);
    // With its anonymous volume (its rules), as the proxy's own removal does: none is left on the engine.
    await docker.getContainer(`kiln-egress-${instanceOf(t)}`).remove({ force: true, v: true });
    const second = await exec(t, teamA.key, session, code, 60);
    expect(second.sandbox_id).toBe(first.sandbox_id);
    expect(probes(second.stdout).ok).toMatchObject({ ok: true, detail: 'api.allowed.test /again' });
    expect(second.egress).toEqual([expect.objectContaining({ host: 'api.allowed.test', allowed: true, status: 200 })]);
  });

  it('serves many allowlist sandboxes started at once, each crediting only its own requests', async () => {
    const n = 6;
    const sessions = await Promise.all(Array.from({ length: n }, () => allowlist(teamB, ['api.allowed.test'])));
    const results = await Promise.all(
      sessions.map(({ session }, i) =>
        exec(t, teamB.key, session, `${PROBES(ca)}\nprobe("get", lambda: get("http://api.allowed.test/s${i}"))`, 60),
      ),
    );
    results.forEach((r, i) => {
      expect(probes(r.stdout).get).toMatchObject({ ok: true, detail: `api.allowed.test /s${i}` });
      expect(r.egress).toEqual([expect.objectContaining({ host: 'api.allowed.test', allowed: true, status: 200 })]);
    });
    expect(new Set(results.map((r) => r.sandbox_id)).size).toBe(n);
    for (const { session } of sessions) await t.call('DELETE', `/v1/sessions/${session}`, { key: teamB.key });
  });

  it('the proxy container is hardened and never routes between the networks it joins', async () => {
    await allowlist(teamA, ['api.allowed.test']).then(({ session }) => exec(t, teamA.key, session, 'print(1)', 60));
    const proxy = docker.getContainer(`kiln-egress-${instanceOf(t)}`);
    const info = await proxy.inspect();
    expect(info.HostConfig).toMatchObject({
      ReadonlyRootfs: true,
      CapDrop: ['ALL'],
      SecurityOpt: ['no-new-privileges'],
    });
    expect(info.Config.User).toBe('proxy');
    const run = await proxy.exec({ Cmd: ['cat', '/proc/sys/net/ipv4/ip_forward'], AttachStdout: true });
    const stream = await run.start({});
    let out = '';
    stream.on('data', (d: Buffer) => {
      out += d.toString('latin1');
    });
    await new Promise((resolve) => stream.on('end', resolve));
    expect(out.trim().endsWith('0')).toBe(true);
  });

  it('the reaper removes a sandbox network whose container is gone, and keeps those of live sandboxes', async () => {
    const { session } = await allowlist(teamA, ['api.allowed.test']);
    const live = await exec(t, teamA.key, session, 'print(1)', 60);
    const leftover = `kiln-egress-sbx_left${tag}`;
    await docker.createNetwork({
      Name: leftover,
      Internal: true,
      Labels: { 'kiln.egress.net': 'sandbox', 'kiln.owner': instanceOf(t), 'kiln.sandbox': `sbx_left${tag}` },
    });
    await t.engine.reap();
    const names = (await docker.listNetworks({ filters: { label: [`kiln.owner=${instanceOf(t)}`] } })).map(
      (n) => n.Name,
    );
    expect(names).not.toContain(leftover);
    expect(names).toContain(`kiln-egress-${live.sandbox_id}`);
  });

  it('a reap while sandbox networks are being made leaves them: the engine lists a network before its creator hears it exists', async () => {
    // The engine records a network, then builds its bridge and firewall rules, then answers:
    // a sweep in between saw a network no sandbox held and removed it under its creator (a 503).
    const backend = (t.engine as unknown as { backend: { proxyFor(i: string): unknown } }).backend;
    const proxy = backend.proxyFor(instanceOf(t)) as {
      reserve(id: string, allow: string[]): Promise<{ network: string }>;
      detach(id: string): Promise<void>;
    };
    const ids = Array.from({ length: 8 }, (_, i) => `sbx_race${i}${tag}`);
    let reserving = true;
    let sweeps = 0;
    const sweeping = (async () => {
      while (reserving) {
        await t.engine.reap();
        sweeps++;
      }
    })();
    try {
      const made = await Promise.all(ids.map((id) => proxy.reserve(id, ['api.allowed.test'])));
      reserving = false;
      await sweeping;
      const names = (await docker.listNetworks({ filters: { label: [`kiln.owner=${instanceOf(t)}`] } })).map(
        (n) => n.Name,
      );
      expect(sweeps).toBeGreaterThan(0);
      expect(names).toEqual(expect.arrayContaining(made.map((a) => a.network)));
    } finally {
      reserving = false;
      await sweeping;
      for (const id of ids) await proxy.detach(id);
    }
  });

  it('leaves no container or network of its own behind once the server stops', async () => {
    const labelled = async () => {
      const containers = await docker.listContainers({
        all: true,
        filters: { label: [`kiln.owner=${instanceOf(t)}`] },
      });
      const nets = await docker.listNetworks({ filters: { label: [`kiln.owner=${instanceOf(t)}`] } });
      return containers.length + nets.length;
    };
    expect(await labelled()).toBeGreaterThan(0);
    await t.engine.stop();
    expect(await labelled()).toBe(0);
  });
});
