import { ruleMatches } from '../workspace/rule-pattern.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';

export type Decision = 'allow' | 'ask' | 'deny';
type Policy = WorkspaceSettings['approval'];
type Rule = Policy['rules'][number];

/** deny wins over everything, then ask, then allow; without a match, the workspace's mode decides. */
function decide(policy: Policy, matches: (r: Rule) => boolean | undefined, label: (r: Rule) => string) {
  for (const behavior of ['deny', 'ask', 'allow'] as const) {
    // A stored rule RE2 cannot compile (undefined) fails closed: as deny or ask it matches, as allow it does not.
    const rule = policy.rules.find((r) => r.behavior === behavior && (matches(r) ?? behavior !== 'allow'));
    if (rule) return { decision: behavior, rule: label(rule) };
  }
  return { decision: policy.mode === 'auto' ? ('allow' as const) : policy.mode };
}

/**
 * What happens to a piece of code before it runs: a matching `deny` rule wins over everything,
 * then a matching `ask`, then a matching `allow`; without a match, the workspace's mode decides.
 * Only rules about code (no `tool`) apply. Rules run on RE2 (linear in the code). A stored rule
 * RE2 cannot compile (saved before rules were checked with RE2) fails closed: as `deny` or `ask`
 * it matches everything, as `allow` nothing.
 * Rules see the lines Python sees: it ends a line at \r\n and at a lone \r as at \n, so both
 * become \n first (else `$` would not match before them and `^import os$` would miss a CRLF line).
 */
export function decideCode(policy: Policy, code: string): { decision: Decision; rule?: string } {
  const lines = code.replace(/\r\n?/g, '\n');
  return decide(
    policy,
    (r) => (r.tool === undefined && r.match !== undefined ? ruleMatches(r.match, lines) : false),
    (r) => r.match!,
  );
}

/** Does a rule's `tool` (server.tool, server.* or *) name this tool of this server? Plain comparisons. */
function toolRuleNames(pattern: string, server: string, tool: string): boolean {
  if (pattern === '*') return true;
  const dot = pattern.indexOf('.');
  const [s, t] = [pattern.slice(0, dot), pattern.slice(dot + 1)];
  return s === server && (t === '*' || t === tool);
}

/**
 * The same order for a call of an MCP tool: only rules with a `tool` that names it apply; one
 * with a `match` as well applies only when the pattern is found in the call's arguments (JSON).
 */
export function decideTool(
  policy: Policy,
  call: { server: string; tool: string; arguments: unknown },
): { decision: Decision; rule?: string } {
  let json: string | undefined;
  return decide(
    policy,
    (r) => {
      if (r.tool === undefined || !toolRuleNames(r.tool, call.server, call.tool)) return false;
      if (r.match === undefined) return true;
      json ??= JSON.stringify(call.arguments ?? {});
      return ruleMatches(r.match, json);
    },
    (r) => (r.match === undefined ? `tool ${r.tool}` : `tool ${r.tool} matching ${r.match}`),
  );
}
