import { ruleMatches } from '../workspace/rule-pattern.ts';
import type { WorkspaceSettings } from '../workspace/settings.ts';

export type Decision = 'allow' | 'ask' | 'deny';

/**
 * What happens to a piece of code before it runs: a matching `deny` rule wins over everything,
 * then a matching `ask`, then a matching `allow`; without a match, the workspace's mode decides.
 * Rules run on RE2 (linear in the code). A stored rule RE2 cannot compile (saved before rules
 * were checked with RE2) fails closed: as `deny` or `ask` it matches everything, as `allow` nothing.
 */
export function decideCode(policy: WorkspaceSettings['approval'], code: string): { decision: Decision; rule?: string } {
  for (const behavior of ['deny', 'ask', 'allow'] as const) {
    const rule = policy.rules.find((r) => r.behavior === behavior && (ruleMatches(r.match, code) ?? behavior !== 'allow'));
    if (rule) return { decision: behavior, rule: rule.match };
  }
  return { decision: policy.mode === 'auto' ? 'allow' : policy.mode };
}
