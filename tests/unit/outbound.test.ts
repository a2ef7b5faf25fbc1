import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { embeddedIPv4, OutboundPolicy, parseAllowEntry } from '../../apps/api/src/lib/outbound.ts';

describe('outbound policy (tenant-chosen URLs)', () => {
  let server: Server;
  let port: number;
  beforeAll(async () => {
    server = createServer((req, res) => {
      if (req.url === '/redirect') {
        res.writeHead(302, { location: `http://127.0.0.1:${port}/ok` }).end();
        return;
      }
      res.end(`ok ${req.method}`);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise((r) => server.close(r)));

  it('refuses loopback, private, link-local, mapped and reserved addresses; permits public ones', () => {
    const p = new OutboundPolicy();
    for (const a of ['127.0.0.1', '10.1.2.3', '172.20.0.1', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0'])
      expect(p.permits(a), a).toBe(false);
    for (const a of ['::1', '::', 'fe80::1', 'fd00::1', '::ffff:127.0.0.1', '::ffff:10.0.0.1'])
      expect(p.permits(a), a).toBe(false);
    for (const a of ['1.1.1.1', '8.8.8.8', '2606:4700::1111', '::ffff:1.1.1.1']) expect(p.permits(a), a).toBe(true);
    expect(p.permits('not-an-ip')).toBe(false);
  });

  it('judges an IPv6 form that carries an IPv4 address by that address (mapped, compatible, 6to4, NAT64, Teredo)', () => {
    const p = new OutboundPolicy();
    for (const url of [
      'http://[::127.0.0.1]/',
      'http://[::7f00:1]/',
      'http://[::ffff:7f00:1]/',
      'http://[::10.0.0.1]/',
      'http://[2002:7f00:1::]/',
      'http://[2002:a9fe:a9fe::1]/',
      'http://[64:ff9b::10.0.0.1]/',
      'http://[64:ff9b::7f00:1]/',
      'http://[64:ff9b:1::808:808]/',
      // Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted).
      'http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/',
      // Teredo with a private server.
      'http://[2001:0:a00:1::1]/',
    ])
      expect(() => p.checkUrl(url), url).toThrow(/not a public address.*KILN_OUTBOUND_ALLOW/);
    for (const a of ['2002:808:808::1', '64:ff9b::8.8.8.8', '2001:0:4136:e378:8000:63bf:f7f7:f7f7'])
      expect(p.permits(a), a).toBe(true);
    expect(embeddedIPv4('2001:db8::1')).toEqual([]);
    // The operator's allowance covers the IPv6 forms of an allowed IPv4 address too.
    expect(new OutboundPolicy(['127.0.0.1']).permits('::ffff:127.0.0.1')).toBe(true);
    expect(new OutboundPolicy(['127.0.0.1']).permits('2002:7f00:1::')).toBe(true);
  });

  it('permits exactly the non-public addresses the operator allowed', () => {
    const p = new OutboundPolicy(['127.0.0.1', '10.0.0.0/8']);
    expect(p.permits('127.0.0.1')).toBe(true);
    expect(p.permits('127.0.0.2')).toBe(false);
    expect(p.permits('10.9.9.9')).toBe(true);
    expect(p.permits('192.168.0.1')).toBe(false);
    expect(() => new OutboundPolicy(['10.0.0.0/33'])).toThrow(/not an address/);
    expect(parseAllowEntry('fd00::/8')).toEqual({ address: 'fd00::', prefix: 8, family: 'ipv6' });
    for (const bad of ['localhost', '10.0.0.0/x', '1.2.3.4/8/9', '']) expect(parseAllowEntry(bad), bad).toBeNull();
  });

  it('checks the URL form before anything is sent', () => {
    const p = new OutboundPolicy();
    expect(() => p.checkUrl('file:///etc/passwd')).toThrow(/only http/);
    expect(() => p.checkUrl('http://user:pw@example.com/')).toThrow(/credentials/);
    expect(() => p.checkUrl('http://[::1]:80/')).toThrow(/not a public address/);
    expect(() => p.checkUrl('nonsense')).toThrow(/not a URL/);
    expect(p.checkUrl('https://example.com/x').hostname).toBe('example.com');
    for (const local of ['http://localhost:9/x', 'http://LOCALHOST./', 'https://api.localhost/'])
      expect(() => p.checkUrl(local), local).toThrow(/loopback/);
    expect(new OutboundPolicy(['127.0.0.1']).checkUrl('http://localhost:9/').port).toBe('9');
  });

  it('fetch refuses a loopback literal and a name that resolves to loopback, at connect time', async () => {
    // A name whose DNS answer is this host's loopback (what a rebinding name answers when used).
    const rebinding = ((
      host: string,
      _opts: object,
      cb: (e: null, a: { address: string; family: number }[]) => void,
    ) => {
      expect(host).toBe('rebind.example');
      cb(null, [{ address: '127.0.0.1', family: 4 }]);
    }) as unknown as typeof import('node:dns').lookup;
    const f = new OutboundPolicy([], rebinding).fetch(5000);
    await expect(f(`http://127.0.0.1:${port}/ok`)).rejects.toThrow(/not a public address/);
    // The name passes the URL check and is refused by the connection's own lookup.
    const err = await f(`http://rebind.example:${port}/ok`).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect(String((err as Error & { cause?: Error }).cause?.message ?? (err as Error).message)).toMatch(/not public/);
    // The same answer, allowed by the operator, connects.
    const allowed = new OutboundPolicy(['127.0.0.1'], rebinding);
    expect(await (await allowed.fetch(5000)(`http://rebind.example:${port}/ok`)).text()).toBe('ok GET');
    await allowed.close();
  });

  it('fetch reaches an allowed address and does not follow redirects', async () => {
    const p = new OutboundPolicy(['127.0.0.1']);
    const f = p.fetch(5000);
    const ok = await f(`http://127.0.0.1:${port}/ok`, { method: 'POST', body: 'x' });
    expect(await ok.text()).toBe('ok POST');
    const res = await f(`http://127.0.0.1:${port}/redirect`);
    expect(res.status).toBe(302);
    await p.close();
  });
});
