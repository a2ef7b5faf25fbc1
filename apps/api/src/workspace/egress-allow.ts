import { domainToASCII } from 'node:url';
import { z } from '@hono/zod-openapi';

/** The most `sandbox.allow` may hold; the server's KILN_EGRESS_MAX_ALLOW may lower it. */
export const MAX_ALLOW = 100;
const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/**
 * Why an egress pattern is not acceptable, or undefined when it is. A pattern is a lowercase
 * DNS name of at least two labels (`api.example.com`), or `*.` and such a name (every name
 * under it, not the name itself), optionally with `:443` or `:80` (else both). Names are
 * ASCII: an internationalised one is written in its punycode (xn--) form, which must be the
 * form IDNA gives it. No IP address (the last label is never all digits), no bare `*`, no
 * wildcard inside a label.
 */
export function allowProblem(pattern: string): string | undefined {
  const m = /^(\*\.)?([^:]+)(?::(\d+))?$/.exec(pattern);
  if (!m) return 'must be a DNS name, `*.` and a DNS name, optionally with :443 or :80';
  const [, star, host = '', port] = m;
  if (port !== undefined && port !== '443' && port !== '80') return 'the only ports are 443 and 80';
  if (host.length > 253) return 'a DNS name is at most 253 characters';
  if (host !== host.toLowerCase()) return 'must be lowercase';
  const labels = host.split('.');
  if (labels.length < 2) return star ? 'a wildcard needs at least two labels after `*.`' : 'needs at least two labels';
  const bad = labels.find((l) => !LABEL.test(l));
  if (bad !== undefined)
    return bad.includes('*')
      ? 'a wildcard is only the whole first label (`*.example.com`)'
      : `label ${JSON.stringify(bad)} must be 1-63 of a-z, 0-9 and - (not first or last)`;
  if (/^\d+$/.test(labels.at(-1)!)) return 'IP addresses are not allowed; name the host';
  // IDNA: an xn-- label must be valid punycode in its canonical form (Node applies UTS #46).
  if (labels.some((l) => l.startsWith('xn--')) && domainToASCII(host) !== host)
    return 'an xn-- label must be valid punycode (IDNA)';
  if (labels.some((l) => l.slice(2, 4) === '--' && !l.startsWith('xn--')))
    return 'labels with -- in the third and fourth place are reserved (IDNA)';
  return undefined;
}

export const AllowPattern = z
  .string()
  .min(1)
  .max(260)
  .superRefine((p, ctx) => {
    const problem = allowProblem(p);
    if (problem) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(p)}: ${problem}` });
  })
  .openapi({ description: 'api.example.com, *.example.com (names under it), optionally :443 or :80' });

/** One compiled pattern, as the proxy's rule helper reads it. */
export interface AllowRule {
  host: string;
  wildcard: boolean;
  ports: number[];
}

/** The patterns as rules: the host without `*.`, and the ports each allows. */
export function allowRules(patterns: readonly string[]): AllowRule[] {
  return patterns.map((p) => {
    const [name = '', port] = p.split(':');
    const wildcard = name.startsWith('*.');
    return { host: wildcard ? name.slice(2) : name, wildcard, ports: port ? [Number(port)] : [80, 443] };
  });
}
