/**
 * Requests the server makes to URLs a tenant chose (MCP servers in workspace settings, webhook
 * receivers). Such a URL is untrusted: it must not reach this host's own services (the API,
 * Postgres, dockerd's socket proxy, a cloud metadata endpoint) or a private network unless the
 * operator allowed that address (KILN_OUTBOUND_ALLOW). The check is made on the address the
 * connection actually uses: the lookup that resolves the name refuses a private answer, so a DNS
 * name that resolves to a public address when checked and a private one when used (rebinding)
 * gets nowhere, and redirects are not followed (each would be another URL to check).
 */
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { BlockList, isIP } from 'node:net';
import { Agent, fetch as undiciFetch } from 'undici';

/** Addresses that are not the public internet: loopback, private, link-local, CGNAT, multicast, reserved. */
const NON_PUBLIC: [string, number, 'ipv4' | 'ipv6'][] = [
  ['0.0.0.0', 8, 'ipv4'],
  ['10.0.0.0', 8, 'ipv4'],
  ['100.64.0.0', 10, 'ipv4'],
  ['127.0.0.0', 8, 'ipv4'],
  ['169.254.0.0', 16, 'ipv4'],
  ['172.16.0.0', 12, 'ipv4'],
  ['192.0.0.0', 24, 'ipv4'],
  ['192.0.2.0', 24, 'ipv4'],
  ['192.168.0.0', 16, 'ipv4'],
  ['198.18.0.0', 15, 'ipv4'],
  ['198.51.100.0', 24, 'ipv4'],
  ['203.0.113.0', 24, 'ipv4'],
  ['224.0.0.0', 4, 'ipv4'],
  ['240.0.0.0', 4, 'ipv4'],
  ['::', 128, 'ipv6'],
  ['::1', 128, 'ipv6'],
  ['64:ff9b::', 96, 'ipv6'],
  ['64:ff9b:1::', 48, 'ipv6'],
  ['100::', 64, 'ipv6'],
  ['2001:db8::', 32, 'ipv6'],
  ['fc00::', 7, 'ipv6'],
  ['fe80::', 10, 'ipv6'],
  ['ff00::', 8, 'ipv6'],
];

/** An IPv6 address's eight 16-bit groups (`::` expanded, a dotted IPv4 tail split in two). */
function groupsOf(address: string): number[] {
  let text = address.toLowerCase();
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const parts = (t: string) => (t ? t.split(':').map((h) => Number.parseInt(h, 16)) : []);
  const front = parts(head);
  const back = tail === undefined ? [] : parts(tail);
  return [...front, ...Array(8 - front.length - back.length).fill(0), ...back];
}

const v4 = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;

/**
 * The IPv4 address an IPv6 form carries, by which a packet may end up at that IPv4 host:
 * IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), 6to4 (2002:AABB:CCDD::/48), NAT64's
 * well-known prefix (64:ff9b::/96) and Teredo (2001:0::/32: its server's address, and its client's,
 * stored inverted). The local-use NAT64 prefix (64:ff9b:1::/48) is never public.
 */
export function embeddedIPv4(address: string): string[] {
  const g = groupsOf(address);
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  if (zeros(0, 5) && g[5] === 0xffff) return [v4(g[6]!, g[7]!)];
  if (zeros(0, 6) && (g[6] !== 0 || g[7]! > 1)) return [v4(g[6]!, g[7]!)];
  if (g[0] === 0x2002) return [v4(g[1]!, g[2]!)];
  if (g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6)) return [v4(g[6]!, g[7]!)];
  if (g[0] === 0x2001 && g[1] === 0) return [v4(g[2]!, g[3]!), v4(g[6]! ^ 0xffff, g[7]! ^ 0xffff)];
  return [];
}

/** One KILN_OUTBOUND_ALLOW entry: an address or a CIDR, IPv4 or IPv6. */
export function parseAllowEntry(entry: string): { address: string; prefix: number; family: 'ipv4' | 'ipv6' } | null {
  const [address = '', prefixText, extra] = entry.trim().split('/');
  if (extra !== undefined) return null;
  const v = isIP(address);
  if (!v) return null;
  const max = v === 4 ? 32 : 128;
  const prefix = prefixText === undefined ? max : Number(prefixText);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > max || (prefixText ?? '').match(/[^0-9]/)) return null;
  return { address, prefix, family: v === 4 ? 'ipv4' : 'ipv6' };
}

/** How an operator lets tenants reach a private address (a local receiver, say), said with every refusal. */
const ALLOW_HINT =
  ' (the server operator can allow private addresses and ranges with KILN_OUTBOUND_ALLOW, e.g. KILN_OUTBOUND_ALLOW=127.0.0.1 to try a receiver on this host)';

export class OutboundRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OutboundRefused';
  }
}

/** Which addresses a tenant's URL may reach: public ones, and the non-public ones the operator allowed. */
export class OutboundPolicy {
  private readonly blocked = new BlockList();
  private readonly allowed = new BlockList();

  /**
   * `allow`: KILN_OUTBOUND_ALLOW's entries (addresses or CIDRs), already validated by the config;
   * `resolve`: the name lookup whose answers are filtered (the system's; tests give names of their own).
   */
  constructor(
    allow: readonly string[] = [],
    private readonly resolve: typeof dnsLookup = dnsLookup,
  ) {
    for (const [a, p, f] of NON_PUBLIC) this.blocked.addSubnet(a, p, f);
    for (const entry of allow) {
      const e = parseAllowEntry(entry);
      if (!e) throw new Error(`not an address or CIDR: ${entry}`);
      this.allowed.addSubnet(e.address, e.prefix, e.family);
    }
  }

  /** Whether a connection to this resolved address is permitted. */
  permits(address: string): boolean {
    const v = isIP(address);
    if (!v) return false;
    const family = v === 4 ? 'ipv4' : 'ipv6';
    if (this.allowed.check(address, family)) return true;
    // An IPv6 form that carries an IPv4 address (mapped, compatible, 6to4, NAT64, Teredo) is
    // judged by the IPv4 address it carries (every one of them, for Teredo).
    const carried = family === 'ipv6' ? embeddedIPv4(address) : [];
    if (carried.length) return carried.every((a) => this.permits(a));
    return !this.blocked.check(address, family);
  }

  /** Checks a URL's form and, when its host is an address literal, the address. Names are checked when resolved. */
  checkUrl(raw: string | URL): URL {
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      throw new OutboundRefused('not a URL');
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new OutboundRefused('only http and https URLs');
    if (url.username || url.password) throw new OutboundRefused('credentials in the URL are not allowed (use headers)');
    const host = url.hostname.replace(/^\[|\]$/g, '');
    if (isIP(host) && !this.permits(host)) throw new OutboundRefused(`${host} is not a public address${ALLOW_HINT}`);
    // localhost and *.localhost are loopback by definition (RFC 6761): said now, not at the first connect.
    const name = host.toLowerCase().replace(/\.$/, '');
    if ((name === 'localhost' || name.endsWith('.localhost')) && !this.permits('127.0.0.1') && !this.permits('::1'))
      throw new OutboundRefused(`${host} is this host (loopback), not a public address${ALLOW_HINT}`);
    return url;
  }

  /** A dns.lookup that answers only permitted addresses, for the connections of `fetch()` below. */
  private lookup = (
    hostname: string,
    options: { all?: boolean; family?: number } | number,
    callback: (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void,
  ): void => {
    const opts = typeof options === 'number' ? { family: options } : options;
    this.resolve(hostname, { family: opts.family ?? 0, all: true }, (err, addresses) => {
      if (err) return callback(err, '');
      const ok = addresses.filter((a) => this.permits(a.address));
      if (!ok.length) {
        const e = new OutboundRefused(
          `${hostname} resolves only to addresses that are not public${ALLOW_HINT}`,
        ) as Error & NodeJS.ErrnoException;
        e.code = 'EKILNOUTBOUND';
        return callback(e, '');
      }
      if (opts.all) return callback(null, ok);
      callback(null, ok[0]!.address, ok[0]!.family);
    });
  };

  private agent?: Agent;

  /**
   * A fetch for tenant URLs: only http(s), only permitted addresses (checked at connect time),
   * no redirects (a 3xx is returned as it is), and a whole-request timeout unless the caller
   * passes its own signal.
   */
  fetch(timeoutMs: number): typeof globalThis.fetch {
    this.agent ??= new Agent({ connect: { lookup: this.lookup as never }, connections: 16 });
    const dispatcher = this.agent;
    return (async (input: string | URL | Request, init?: RequestInit) => {
      const url = typeof input === 'string' || input instanceof URL ? input : input.url;
      this.checkUrl(url);
      const signal = init?.signal ?? AbortSignal.timeout(timeoutMs);
      const requestInit =
        input instanceof Request ? { method: input.method, headers: input.headers, body: input.body } : {};
      return undiciFetch(String(url), {
        ...(requestInit as object),
        ...(init as object),
        signal,
        redirect: 'manual',
        dispatcher,
        ...(requestInit.body || init?.body ? { duplex: 'half' } : {}),
      } as never);
    }) as unknown as typeof globalThis.fetch;
  }

  async close(): Promise<void> {
    await this.agent?.close();
  }
}
