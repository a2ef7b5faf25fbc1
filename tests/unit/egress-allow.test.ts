import { describe, expect, it } from 'vitest';
import { parseCidr } from '../../apps/api/src/lib/cidr.ts';
import { oneFileTar, parseLogLine } from '../../apps/api/src/sandbox/docker/egress.ts';
import { allowProblem, allowRules } from '../../apps/api/src/workspace/egress-allow.ts';

describe('egress allow patterns', () => {
  it('accepts lowercase DNS names, wildcards of a whole first label and ports 443 or 80', () => {
    for (const p of [
      'api.example.com',
      '*.example.com',
      'a-b.c0.example',
      'xn--bcher-kva.example',
      'x.example.com:443',
      '*.example.com:80',
    ])
      expect(allowProblem(p), p).toBeUndefined();
  });

  it('refuses IPs, bare or partial wildcards, upper case, other ports, bad labels and non-canonical punycode', () => {
    const cases: [string, RegExp][] = [
      ['10.0.0.1', /IP addresses/],
      ['*', /DNS name|two labels/],
      ['*.com', /two labels after/],
      ['a*.example.com', /whole first label/],
      ['a.*.example.com', /whole first label/],
      ['Example.com', /lowercase/],
      ['example.com:8080', /443 and 80/],
      ['localhost', /two labels/],
      ['-a.example.com', /not first or last/],
      [`${'a'.repeat(64)}.example.com`, /1-63/],
      [`${'a.'.repeat(127)}com`, /253/],
      ['xn--a.example.com', /punycode/],
      ['ab--c.example.com', /reserved/],
      ['bücher.example', /1-63 of a-z/],
      ['[::1]', /1-63|DNS name|two labels/],
    ];
    for (const [p, why] of cases) expect(allowProblem(p), p).toMatch(why);
  });

  it('compiles patterns to the rules the proxy helper reads', () => {
    expect(allowRules(['api.example.com', '*.example.org:443', 'plain.example.net:80'])).toEqual([
      { host: 'api.example.com', wildcard: false, ports: [80, 443] },
      { host: 'example.org', wildcard: true, ports: [443] },
      { host: 'plain.example.net', wildcard: false, ports: [80] },
    ]);
  });
});

describe('egress proxy plumbing', () => {
  it('parses the proxy access log: CONNECT and plain requests, refusals, and nothing else', () => {
    expect(parseLogLine('KILN-EGRESS 10.231.0.3 CONNECT api.example.com:443 200 812 4410 TCP_TUNNEL sbx_1')).toEqual({
      client: '10.231.0.3',
      url: 'api.example.com:443',
      event: {
        host: 'api.example.com',
        port: 443,
        method: 'CONNECT',
        allowed: true,
        status: 200,
        bytes_out: 812,
        bytes_in: 4410,
      },
    });
    expect(
      parseLogLine(
        'KILN-EGRESS 10.231.0.3 GET http://x.example.com:8080/a 403 120 3400 TCP_DENIED a user name with spaces',
      )?.event,
    ).toMatchObject({
      host: 'x.example.com',
      port: 8080,
      allowed: false,
      status: 403,
    });
    expect(
      parseLogLine('KILN-EGRESS 10.231.0.3 GET cache_object://Api.Example.com/info 403 1 2 TCP_DENIED -')?.event,
    ).toMatchObject({
      host: 'api.example.com',
      port: 0,
    });
    expect(
      parseLogLine('KILN-EGRESS 10.231.0.3 GET ftp://u@files.example.com/x 403 1 2 TCP_DENIED -')?.event,
    ).toMatchObject({
      host: 'files.example.com',
      port: 21,
    });
    // The proxy's decision, not the answer: an allowed origin's own 403 was let through; a bare
    // connection, a malformed request and a missing login were answered by the proxy itself.
    const decided = (line: string) => parseLogLine(`KILN-EGRESS 10.231.0.3 ${line} -`)?.event.allowed;
    expect(decided('GET http://api.example.com/x 403 10 20 TCP_MISS')).toBe(true);
    expect(decided('CONNECT api.example.com:443 200 10 20 TCP_TUNNEL_ABORTED')).toBe(true);
    expect(decided('- error:transaction-end-before-headers 0 0 0 NONE_NONE')).toBe(false);
    expect(decided('HELLO error:invalid-request 400 15 3372 NONE_NONE')).toBe(false);
    expect(decided('GET http://api.example.com/ 400 15 3372 TAG_NONE')).toBe(false);
    expect(decided('GET http://api.example.com/ 407 92 3492 TCP_DENIED')).toBe(false);
    expect(parseLogLine('2026/12/01 12:00:00| Starting Squid')).toBeUndefined();
    expect(parseLogLine('KILN-EGRESS too few fields')).toBeUndefined();
  });

  it('reads CIDRs for the sandbox network pool', () => {
    expect(parseCidr('10.231.0.0/16')).toEqual({ base: (10 * 256 + 231) * 65536, prefix: 16 });
    expect(parseCidr('10.231.7.9/24')).toEqual({ base: ((10 * 256 + 231) * 256 + 7) * 256, prefix: 24 });
    expect(parseCidr('10.300.0.0/16')).toBeUndefined();
    expect(parseCidr('example')).toBeUndefined();
  });

  it('writes a one-file ustar archive that tar reads back', async () => {
    const tar = oneFileTar('sbx_1.json', Buffer.from('{"a":1}'));
    expect(tar.length % 512).toBe(0);
    expect(tar.subarray(257, 262).toString()).toBe('ustar');
    const { execFileSync } = await import('node:child_process');
    expect(execFileSync('tar', ['-xO', '-f', '-'], { input: tar }).toString()).toBe('{"a":1}');
  });
});
