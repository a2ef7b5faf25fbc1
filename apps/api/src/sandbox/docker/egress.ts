import { createHash, randomBytes } from 'node:crypto';
import { chmod, mkdir, rm } from 'node:fs/promises';
import { request } from 'node:http';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { ApiError } from '../../lib/errors.ts';
import { allowRules } from '../../workspace/egress-allow.ts';
import type { EgressEvent } from '../backend.ts';

export interface EgressOptions {
  /** The proxy image (Squid, built by sandbox-image/build.ts). */
  image: string;
  /** Where each sandbox's own /29 network is drawn from: the first address and the prefix length. */
  subnets: { base: number; prefix: number };
  /** A Docker network the proxy also joins, whose subnet it may reach despite private addresses (tests' upstreams). */
  upstreamNetwork?: string;
  /**
   * Where the Unix sockets of gVisor sandboxes' bridges are made (a directory of this host, which
   * the engine also runs on); unset, gVisor sandboxes get no egress.
   */
  bridgeDir?: string;
}

/** What one allowlist sandbox has on the proxy. */
export interface EgressAttachment {
  /** A runc sandbox: its own internal network (the proxy joins it). */
  network?: string;
  /**
   * A gVisor sandbox (no network at all): the host directory holding its bridge's Unix socket,
   * mounted into it at BRIDGE_MOUNT, where its in-sandbox bridge (kiln_bridge.py) connects.
   */
  bridgeDir?: string;
  /**
   * The sandbox's address on its network (where the proxy accepts its requests from) and the
   * proxy's; for a bridged sandbox, the address the host's bridge vouches for in each connection's
   * PROXY header (from BRIDGE_ADDRESSES, routed nowhere) and the sandbox's own loopback.
   */
  sandboxIp: string;
  proxyIp: string;
  user: string;
  token: string;
  /** The patterns last written for it. */
  allow: readonly string[];
}

const PROXY_LABEL = 'kiln.egress.proxy';
const NET_LABEL = 'kiln.egress.net';
const PORT = 3128;
/** The proxy's port for the host's bridge: every connection starts with a PROXY header (squid.conf). */
const BRIDGE_PORT = 3129;
/** Where a bridged sandbox finds its socket (kiln_bridge.py). */
export const BRIDGE_MOUNT = '/run/kiln-egress';
/** 198.18.0.0/15 (RFC 2544, benchmarking): never routed, never a sandbox network's. */
const BRIDGE_ADDRESSES = { base: ((198 << 24) | (18 << 16)) >>> 0, size: 2 ** 17 };
/** Connections one bridged sandbox may hold open through the proxy at once (as squid.conf's maxconn for the others). */
const BRIDGE_MAX_CONNECTIONS = 64;
const RULES_DIR = '/run/kiln-egress/rules';
/** Per sandbox, between two executions: more requests than this are counted, not listed. */
const MAX_BUFFERED = 1000;
const FLUSH_TIMEOUT_MS = 3000;
const READY_TIMEOUT_MS = 30_000;
const NET_ATTEMPTS = 8;
/** TEST-NET-1 (RFC 5737): never routed; the sandbox's resolver forwards there and gets nothing. */
export const NOWHERE_DNS = '192.0.2.1';

const ipOf = (n: number) => [24, 16, 8, 0].map((s) => (n >>> s) & 255).join('.');

/**
 * Squid's result codes for a request it let through (forwarded to the origin, or a tunnel it
 * opened), whatever the origin then answered. Everything else was the proxy's own answer: a
 * refusal (TCP_DENIED: 403, 407), or a request it never passed on (NONE…, TAG_NONE…: a bare
 * connection, a malformed request, its own 400s and 5xx before forwarding).
 */
const LET_THROUGH = /^TCP_(MISS|TUNNEL|HIT|MEM_HIT|REFRESH|IMS|INM|SWAPFAIL|CLIENT_REFRESH|OFFLINE)/;

/** One access-log line of the proxy (squid.conf's `kiln` format), or undefined for any other line. */
export function parseLogLine(line: string): { client: string; url: string; event: EgressEvent } | undefined {
  // The fields after these eight (the user name the client sent) are never read.
  const f = line.trim().split(' ');
  if (f[0] !== 'KILN-EGRESS' || f.length < 8) return undefined;
  const [, client = '', method = '', url = '', status, bytesOut, bytesIn, squidStatus = ''] = f;
  let host: string;
  let port: number;
  if (method === 'CONNECT') {
    const i = url.lastIndexOf(':');
    host = i > 0 ? url.slice(0, i) : url;
    port = i > 0 ? Number(url.slice(i + 1)) : 443;
  } else {
    // scheme://[user@]host[:port]/…, whatever the scheme (squid logs ftp:// and cache_object:// too).
    const m = /^([a-z][a-z0-9+._-]*):\/\/(?:[^@/]*@)?(\[[^\]]*\]|[^:/?#]+)(?::(\d+))?/i.exec(url);
    host = m ? m[2]!.toLowerCase() : url;
    const scheme = m?.[1]?.toLowerCase();
    port = m?.[3] ? Number(m[3]) : scheme === 'http' ? 80 : scheme === 'https' ? 443 : scheme === 'ftp' ? 21 : 0;
  }
  const code = Number(status) || 0;
  // What the proxy decided, not what the origin answered: a 403 from an allowed origin was let through.
  const allowed = LET_THROUGH.test(squidStatus);
  const n = (s: string | undefined) => Math.max(0, Number(s) || 0);
  const event = {
    host: host.slice(0, 253),
    port: Number.isFinite(port) ? port : 0,
    method: method.slice(0, 16),
    allowed,
    status: code,
    bytes_out: n(bytesOut),
    bytes_in: n(bytesIn),
  };
  return { client, url, event };
}

/** A ustar archive of one regular file (mode 0644, root's), for the Docker archive API. */
export function oneFileTar(name: string, data: Buffer): Buffer {
  const header = Buffer.alloc(512);
  const put = (text: string, at: number, len: number) => header.write(text.slice(0, len), at, len, 'ascii');
  const octal = (n: number, len: number) => n.toString(8).padStart(len - 1, '0');
  put(name, 0, 100);
  put(octal(0o644, 8), 100, 8);
  put(octal(0, 8), 108, 8);
  put(octal(0, 8), 116, 8);
  put(octal(data.length, 12), 124, 12);
  put(octal(Math.floor(Date.now() / 1000), 12), 136, 12);
  header.fill(' ', 148, 156);
  put('0', 156, 1);
  put('ustar\u000000', 257, 8);
  const sum = header.reduce((a, b) => a + b, 0);
  put(`${octal(sum, 7)}\u0000`, 148, 8);
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return Buffer.concat([header, data, pad, Buffer.alloc(1024)]);
}

interface Buffered {
  events: EgressEvent[];
  dropped: number;
}

/**
 * The egress proxy of this API instance: one Squid container on the sandbox host, created when
 * the first allowlist sandbox needs it, recreated (with every attachment restored) when it is
 * found gone, removed with the instance's other containers on shutdown. It joins an egress
 * network with a route out, and each allowlist sandbox's own internal /29 network (no route
 * out, no address of the host), at the same address every time. Its access log is followed:
 * each line is credited to the sandbox whose address sent the request.
 */
export class EgressProxy {
  private proxy: { id: string; ip: string } | undefined;
  private starting: Promise<{ id: string; ip: string }> | undefined;
  private readonly attached = new Map<string, EgressAttachment>();
  /** Sandboxes whose network is being created: on the engine before they are `attached`. */
  private readonly reserving = new Set<string>();
  private readonly bySandboxIp = new Map<string, Buffered>();
  private readonly markers = new Map<string, () => void>();
  private logStream: NodeJS.ReadableStream | undefined;
  /** Bridged sandboxes' socket servers, by sandbox id. */
  private readonly bridges = new Map<string, Server>();
  private nextBridgeAddress = 0;
  private bridgePort = 0;

  constructor(
    private readonly docker: Docker,
    private readonly instance: string,
    private readonly opts: EgressOptions,
    private readonly log?: Logger,
  ) {}

  private get name() {
    return `kiln-egress-${this.instance}`;
  }

  /** The running proxy, created (or recreated, restoring every attachment) when it is not. */
  async ensure(): Promise<{ id: string; ip: string }> {
    if (this.starting) return this.starting;
    if (this.proxy) {
      const state = await this.docker
        .getContainer(this.proxy.id)
        .inspect()
        .then(
          (i) => i.State.Running,
          () => false,
        );
      if (state) return this.proxy;
      this.log?.warn({ proxy: this.proxy.id }, 'the egress proxy is gone; recreating it');
      this.proxy = undefined;
    }
    this.starting = this.startProxy()
      .catch((err: Error) => {
        this.log?.error({ err }, 'the egress proxy did not start');
        // The tenant sees that egress is down here, not an internal error; the log has the cause.
        throw new ApiError('unavailable', 'the sandbox egress proxy could not be started; try again later');
      })
      .finally(() => {
        this.starting = undefined;
      });
    return this.starting;
  }

  private async startProxy(): Promise<{ id: string; ip: string }> {
    const labels = { [PROXY_LABEL]: '1', 'kiln.owner': this.instance };
    await this.docker
      .getContainer(this.name)
      .remove({ force: true, v: true })
      .catch(() => undefined);
    const egressNet = await this.egressNetwork();
    // The host's address on that network: the only source the proxy takes a PROXY header from.
    const bridgeSource = (await this.docker.getNetwork(egressNet).inspect()).IPAM?.Config?.[0]?.Gateway ?? '';
    const upstreams: string[] = [];
    if (this.opts.upstreamNetwork) {
      const net = await this.docker.getNetwork(this.opts.upstreamNetwork).inspect();
      for (const c of net.IPAM?.Config ?? []) if (c.Subnet) upstreams.push(c.Subnet);
    }
    const container = await this.docker.createContainer({
      name: this.name,
      Image: this.opts.image,
      Labels: labels,
      Env: [`KILN_EGRESS_UPSTREAMS=${upstreams.join(',')}`, `KILN_EGRESS_BRIDGE_SOURCE=${bridgeSource}`],
      HostConfig: {
        NetworkMode: egressNet,
        CapDrop: ['ALL'],
        SecurityOpt: ['no-new-privileges'],
        ReadonlyRootfs: true,
        // An anonymous volume (removed with the container): the API writes rules into it.
        Mounts: [{ Type: 'volume', Source: '', Target: '/run/kiln-egress' }],
        // It joins every allowlist sandbox's network: it must never route between them (a new
        // network namespace inherits the host's forwarding, which Docker turns on).
        Sysctls: { 'net.ipv4.ip_forward': '0', 'net.ipv4.conf.all.forwarding': '0' },
        Memory: 256 * 1024 * 1024,
        MemorySwap: 256 * 1024 * 1024,
        PidsLimit: 128,
        RestartPolicy: { Name: 'no' },
        LogConfig: { Type: 'json-file', Config: { 'max-size': '10m', 'max-file': '1' } },
      },
    });
    if (this.opts.upstreamNetwork)
      await this.docker.getNetwork(this.opts.upstreamNetwork).connect({ Container: container.id });
    await container.start();
    const info = await container.inspect();
    const ip = info.NetworkSettings.Networks[egressNet]?.IPAddress ?? '';
    const proxy = { id: container.id, ip };
    this.follow(container);
    await this.waitReady(proxy);
    // A recreated proxy: every live allowlist sandbox gets its network and rules back.
    for (const a of this.attached.values()) {
      if (a.network) await this.connect(proxy.id, a);
      await this.writeRules(proxy.id, a, a.allow);
    }
    this.proxy = proxy;
    this.log?.info({ proxy: proxy.id, upstreams }, 'egress proxy started');
    return proxy;
  }

  /** The bridge network with a route out that the proxy (and only it) is attached to. */
  private async egressNetwork(): Promise<string> {
    const name = `kiln-egress-out-${this.instance}`;
    const found = await this.docker.listNetworks({ filters: { name: [name] } });
    if (!found.some((n) => n.Name === name))
      await this.docker.createNetwork({
        Name: name,
        Driver: 'bridge',
        CheckDuplicate: true,
        Labels: { [NET_LABEL]: 'out', 'kiln.owner': this.instance },
      });
    return name;
  }

  /**
   * Follows the proxy's access log from its start (`fromStart`) or from now on. A stream that
   * ends while the proxy still runs (the engine dropped it) is followed again from then on;
   * what was logged in between is lost, and said so.
   */
  private follow(container: Docker.Container, fromStart = true): void {
    this.logStream?.removeAllListeners();
    (this.logStream as { destroy?: () => void } | undefined)?.destroy?.();
    const out = new PassThrough();
    let tail = '';
    out.on('data', (chunk: Buffer) => {
      const lines = (tail + chunk.toString('utf8')).split('\n');
      tail = (lines.pop() ?? '').slice(-8192);
      for (const line of lines) this.onLine(line);
    });
    void container.logs({ follow: true, stdout: true, stderr: false, ...(fromStart ? {} : { tail: 0 }) }).then(
      (stream) => {
        this.logStream = stream;
        this.docker.modem.demuxStream(stream, out, new PassThrough().resume());
        stream.on('end', () => {
          if (this.logStream !== stream || this.proxy?.id !== container.id) return;
          this.log?.warn({ proxy: container.id }, 'the egress proxy log ended; following it again');
          this.follow(container, false);
        });
      },
      (err) => this.log?.warn({ err }, 'could not follow the egress proxy log'),
    );
  }

  private onLine(line: string): void {
    const parsed = parseLogLine(line);
    if (!parsed) return;
    const buf = this.bySandboxIp.get(parsed.client);
    const marker = /^http:\/\/kiln-flush\.invalid\/([a-f0-9]+)$/.exec(parsed.url)?.[1];
    if (marker && !buf) {
      this.markers.get(marker)?.();
      return;
    }
    if (!buf) return;
    if (buf.events.length < MAX_BUFFERED) buf.events.push(parsed.event);
    else buf.dropped++;
  }

  /** Resolves once every request the proxy finished before now is in the buffers. */
  private flush(proxy: { ip: string }, timeoutMs = FLUSH_TIMEOUT_MS): Promise<void> {
    const token = randomBytes(8).toString('hex');
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.markers.delete(token);
        req.destroy();
        reject(new Error(`the egress proxy did not log a marker within ${timeoutMs} ms`));
      }, timeoutMs);
      this.markers.set(token, () => {
        clearTimeout(timer);
        this.markers.delete(token);
        resolve();
      });
      const req = request({
        host: proxy.ip,
        port: PORT,
        method: 'GET',
        path: `http://kiln-flush.invalid/${token}`,
        headers: { host: 'kiln-flush.invalid' },
      });
      req.on('response', (res) => res.resume());
      req.on('error', () => undefined);
      req.end();
    });
  }

  private async waitReady(proxy: { ip: string }): Promise<void> {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    for (;;) {
      try {
        await this.flush(proxy, 500);
        return;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`the egress proxy did not start: ${(err as Error).message}`);
      }
    }
  }

  /** A new internal network for the sandbox (the proxy joins it with `join`). */
  async reserve(sandboxId: string, allow: readonly string[]): Promise<EgressAttachment> {
    await this.ensure();
    this.reserving.add(sandboxId);
    try {
      return await this.createSandboxNetwork(sandboxId, allow);
    } finally {
      this.reserving.delete(sandboxId);
    }
  }

  private async createSandboxNetwork(sandboxId: string, allow: readonly string[]): Promise<EgressAttachment> {
    const network = `kiln-egress-${sandboxId}`;
    const slots = 2 ** (32 - this.opts.subnets.prefix) / 8;
    for (let attempt = 0; attempt < NET_ATTEMPTS; attempt++) {
      const base = this.opts.subnets.base + 8 * Math.floor(Math.random() * slots);
      try {
        await this.docker.createNetwork({
          Name: network,
          Driver: 'bridge',
          Internal: true,
          CheckDuplicate: true,
          Labels: { [NET_LABEL]: 'sandbox', 'kiln.owner': this.instance, 'kiln.sandbox': sandboxId },
          // No address of the host on it: only the proxy and the sandbox are there.
          Options: {
            'com.docker.network.bridge.inhibit_ipv4': 'true',
            'com.docker.network.bridge.enable_ip_masquerade': 'false',
          },
          IPAM: { Driver: 'default', Config: [{ Subnet: `${ipOf(base)}/29`, Gateway: ipOf(base + 1) }] },
        });
      } catch (err) {
        // Another network (this replica's, another's, anyone's) has that subnet: draw again.
        if (/overlap/i.test((err as Error).message)) continue;
        throw err;
      }
      const token = randomBytes(24).toString('base64url');
      const a = { network, proxyIp: ipOf(base + 2), sandboxIp: ipOf(base + 3), user: sandboxId, token, allow };
      this.attached.set(sandboxId, a);
      this.bySandboxIp.set(a.sandboxIp, { events: [], dropped: 0 });
      return a;
    }
    throw new Error('no free subnet for a sandbox network; widen KILN_EGRESS_SUBNETS');
  }

  /**
   * For a gVisor sandbox, which has no network: a Unix socket in a directory of its own under
   * `bridgeDir` (mounted into the sandbox), whose every connection this process carries to the
   * proxy's bridge port, prefixed with a PROXY header naming the address the sandbox's rules
   * carry. The proxy believes that header from this host's address only (squid.conf), so the
   * sandbox is known by that address and its credentials, as a runc sandbox is by its own.
   */
  async reserveBridge(sandboxId: string, allow: readonly string[]): Promise<EgressAttachment> {
    if (!this.opts.bridgeDir) throw new Error('this egress proxy has no bridge directory');
    await this.ensure();
    const bridgeDir = join(this.opts.bridgeDir, this.instance, sandboxId);
    const sandboxIp = this.bridgeAddress();
    const a: EgressAttachment = {
      bridgeDir,
      proxyIp: '127.0.0.1',
      sandboxIp,
      user: sandboxId,
      token: randomBytes(24).toString('base64url'),
      allow,
    };
    await rm(bridgeDir, { recursive: true, force: true });
    await mkdir(join(this.opts.bridgeDir, this.instance), { recursive: true, mode: 0o700 });
    await mkdir(bridgeDir, { mode: 0o755 });
    // Half-open both ways: a client that has sent its request (and shut its side) still gets the answer.
    const server = createServer({ allowHalfOpen: true }, (socket) => this.bridge(socket, sandboxIp, server));
    server.maxConnections = BRIDGE_MAX_CONNECTIONS;
    const path = join(bridgeDir, 'egress.sock');
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(path, () => resolve());
      });
      // The sandbox's bridge runs as the container's keeper uid; only this directory leads here.
      await chmod(path, 0o666);
    } catch (err) {
      server.close();
      await rm(bridgeDir, { recursive: true, force: true });
      throw err;
    }
    server.on('error', (err) => this.log?.warn({ err, sandbox: sandboxId }, 'egress bridge socket error'));
    this.bridges.set(sandboxId, server);
    this.attached.set(sandboxId, a);
    this.bySandboxIp.set(sandboxIp, { events: [], dropped: 0 });
    return a;
  }

  /** A bridge address no attached sandbox of this proxy has. */
  private bridgeAddress(): string {
    for (let i = 0; i < BRIDGE_ADDRESSES.size; i++) {
      const n = this.nextBridgeAddress++ % BRIDGE_ADDRESSES.size;
      const ip = ipOf(BRIDGE_ADDRESSES.base + n);
      if (!this.bySandboxIp.has(ip) && n % 256 !== 0 && n % 256 !== 255) return ip;
    }
    throw new Error('no free bridge address');
  }

  /** Carries one connection of a bridged sandbox to the proxy, announced as coming from its address. */
  private bridge(socket: Socket, sandboxIp: string, server: Server): void {
    const proxy = this.proxy;
    if (!proxy || !server.listening) {
      socket.destroy();
      return;
    }
    const upstream = connect({ host: proxy.ip, port: BRIDGE_PORT, allowHalfOpen: true });
    upstream.setNoDelay(true);
    socket.setNoDelay(true);
    // Squid reads the source address only; the port is the bridge's own count, for its log.
    this.bridgePort = (this.bridgePort % 64_511) + 1;
    upstream.write(`PROXY TCP4 ${sandboxIp} ${proxy.ip} ${1024 + this.bridgePort} ${BRIDGE_PORT}\r\n`);
    socket.pipe(upstream);
    upstream.pipe(socket);
    const end = () => {
      socket.destroy();
      upstream.destroy();
    };
    socket.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  }

  /** The proxy on the sandbox's network, with its rules: done while the sandbox's container is created. */
  async join(a: EgressAttachment): Promise<void> {
    const proxy = await this.ensure();
    if (a.network) await this.connect(proxy.id, a);
    await this.writeRules(proxy.id, a, a.allow);
  }

  private async connect(proxyId: string, a: EgressAttachment): Promise<void> {
    await this.docker
      .getNetwork(a.network!)
      .connect({ Container: proxyId, EndpointConfig: { IPAMConfig: { IPv4Address: a.proxyIp } } });
  }

  private async writeRules(proxyId: string, a: EgressAttachment, allow: readonly string[] | null): Promise<void> {
    const rules =
      allow === null
        ? { revoked: true }
        : {
            sha256: createHash('sha256').update(a.token).digest('hex'),
            ip: a.sandboxIp,
            allow: allowRules(allow),
          };
    const tar = oneFileTar(`${a.user}.json`, Buffer.from(JSON.stringify(rules)));
    await this.docker.getContainer(proxyId).putArchive(tar, { path: RULES_DIR });
  }

  /** Replaces the sandbox's patterns (its next request obeys them), making sure the proxy runs. */
  async setAllow(sandboxId: string, allow: readonly string[]): Promise<void> {
    const a = this.attached.get(sandboxId);
    if (!a) return;
    // Before every execution: a proxy found gone is recreated here, with every attachment.
    const proxy = await this.ensure();
    if (a.allow.length === allow.length && a.allow.every((p, i) => p === allow[i])) return;
    a.allow = [...allow];
    await this.writeRules(proxy.id, a, a.allow);
  }

  /** The sandbox's requests the proxy has logged so far (every one that ended before this call). */
  async take(sandboxId: string): Promise<EgressEvent[]> {
    const a = this.attached.get(sandboxId);
    const buf = a && this.bySandboxIp.get(a.sandboxIp);
    if (!buf) return [];
    // setAllow, before the execution, made sure the proxy runs: no second check here.
    const proxy = this.proxy ?? (await this.ensure());
    await this.flush(proxy).catch((err) => this.log?.warn({ err }, 'egress events may be incomplete'));
    const events = buf.events.splice(0);
    if (buf.dropped) {
      events.push({
        host: `(${buf.dropped} more requests)`,
        port: 0,
        method: '-',
        allowed: false,
        status: 0,
        bytes_in: 0,
        bytes_out: 0,
      });
      buf.dropped = 0;
    }
    return events;
  }

  /** Revokes the sandbox's rules and removes its network (after its container is gone). */
  async detach(sandboxId: string): Promise<void> {
    const a = this.attached.get(sandboxId);
    this.attached.delete(sandboxId);
    if (a) this.bySandboxIp.delete(a.sandboxIp);
    if (a && this.proxy) await this.writeRules(this.proxy.id, a, null).catch(() => undefined);
    const bridge = this.bridges.get(sandboxId);
    this.bridges.delete(sandboxId);
    if (bridge) {
      bridge.close();
      await rm(a?.bridgeDir ?? '', { recursive: true, force: true });
      return;
    }
    await this.removeNetwork(`kiln-egress-${sandboxId}`);
  }

  private async removeNetwork(name: string): Promise<void> {
    const net = this.docker.getNetwork(name);
    if (this.proxy) await net.disconnect({ Container: this.proxy.id, Force: true }).catch(() => undefined);
    await net.remove().catch((err: { statusCode?: number }) => {
      if (err.statusCode !== 404) throw err;
    });
  }

  /**
   * Removes the networks of this instance's sandboxes whose container is gone (left by a crash),
   * and, with `all`, the proxy and its egress network too (shutdown).
   */
  async sweep(opts: { all?: boolean } = {}): Promise<void> {
    const nets = await this.docker.listNetworks({
      filters: { label: [`${NET_LABEL}=sandbox`, `kiln.owner=${this.instance}`] },
    });
    const containers = new Set(
      (await this.docker.listContainers({ all: true, filters: { label: ['kiln.managed=1'] } })).map(
        (c) => c.Labels['kiln.sandbox'],
      ),
    );
    for (const n of nets) {
      const sandbox = n.Labels?.['kiln.sandbox'] ?? '';
      // A sandbox being created has its network before its container, and the engine lists that
      // network before this process hears it was made (reserving): neither is swept.
      const gone = !containers.has(sandbox) && !this.attached.has(sandbox) && !this.reserving.has(sandbox);
      if (opts.all || gone) await this.removeNetwork(n.Name).catch(() => undefined);
    }
    if (!opts.all) return;
    for (const bridge of this.bridges.values()) bridge.close();
    this.bridges.clear();
    if (this.opts.bridgeDir) await rm(join(this.opts.bridgeDir, this.instance), { recursive: true, force: true });
    (this.logStream as { destroy?: () => void } | undefined)?.destroy?.();
    this.logStream = undefined;
    await this.docker
      .getContainer(this.name)
      .remove({ force: true, v: true })
      .catch(() => undefined);
    this.proxy = undefined;
    await this.docker
      .getNetwork(`kiln-egress-out-${this.instance}`)
      .remove()
      .catch(() => undefined);
  }
}
