import type { WorkspaceSettings } from '../workspace/settings.ts';

export type Decision = 'allow' | 'ask' | 'deny';

/**
 * What happens to a piece of code before it runs: a matching `deny` rule wins over everything,
 * then a matching `ask`, then a matching `allow`; without a match, the workspace's mode decides.
 */
export function decideCode(policy: WorkspaceSettings['approval'], code: string): { decision: Decision; rule?: string } {
  for (const behavior of ['deny', 'ask', 'allow'] as const) {
    const rule = policy.rules.find((r) => r.behavior === behavior && new RegExp(r.match, 'm').test(code));
    if (rule) return { decision: behavior, rule: rule.match };
  }
  return { decision: policy.mode === 'auto' ? 'allow' : policy.mode };
}
