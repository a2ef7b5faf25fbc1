import { ruleMatches } from '../workspace/rule-pattern.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';

export type Decision = 'allow' | 'ask' | 'deny';

/**
 * What happens to a piece of code before it runs: a matching `deny` rule wins over everything,
 * then a matching `ask`, then a matching `allow`; without a match, the workspace's mode decides.
 * Rules run on RE2 (linear in the code). A stored rule RE2 cannot compile (saved before rules
 * were checked with RE2) fails closed: as `deny` or `ask` it matches everything, as `allow` nothing.
 * Rules see the lines Python sees: it ends a line at \r\n and at a lone \r as at \n, so both
 * become \n first (else `$` would not match before them and `^import os$` would miss a CRLF line).
 */
export function decideCode(policy: WorkspaceSettings['approval'], code: string): { decision: Decision; rule?: string } {
  const lines = code.replace(/\r\n?/g, '\n');
  for (const behavior of ['deny', 'ask', 'allow'] as const) {
    const rule = policy.rules.find(
      (r) => r.behavior === behavior && (ruleMatches(r.match, lines) ?? behavior !== 'allow'),
    );
    if (rule) return { decision: behavior, rule: rule.match };
  }
  return { decision: policy.mode === 'auto' ? 'allow' : policy.mode };
}
