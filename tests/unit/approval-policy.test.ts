import { describe, expect, it } from 'vitest';
import { decideCode } from '../../apps/api/src/agent/policy.ts';
import type { WorkspaceSettings } from '../../apps/api/src/workspace/settings.ts';

type Rule = WorkspaceSettings['approval']['rules'][number];
const policy = (rules: Rule[], mode: WorkspaceSettings['approval']['mode'] = 'auto'): WorkspaceSettings['approval'] => ({ mode, rules, timeout_s: 600 });

/** Approval rules are tenant input run against model-written code: their cost must be linear. */
describe('approval rules', () => {
  it('a catastrophic-backtracking rule is checked in linear time (the call returns, with the right answer)', () => {
    // With a backtracking engine, `^(a+)+$` against a run of `a` that ends in `!` takes 2^n steps:
    // 40 characters would hold the event loop for days.
    const rules: Rule[] = [{ match: '^(a+)+$', behavior: 'deny' }];
    expect(decideCode(policy(rules), `print(1)\n${'a'.repeat(40)}!`)).toEqual({ decision: 'allow' });
    expect(decideCode(policy(rules), `${'a'.repeat(100_000)}!`)).toEqual({ decision: 'allow' });
    // The multiline flag is kept: `^` and `$` match at line boundaries.
    expect(decideCode(policy(rules), `print(1)\n${'a'.repeat(40)}\nprint(2)`)).toEqual({ decision: 'deny', rule: '^(a+)+$' });
  });

  it('a stored rule that no longer compiles fails closed for deny and ask, and is ignored for allow', () => {
    // Rules stored before rules were checked with RE2 may use what RE2 lacks (lookaround, backreferences).
    expect(decideCode(policy([{ match: '(?=.*rm)', behavior: 'deny' }]), 'print(1)')).toEqual({ decision: 'deny', rule: '(?=.*rm)' });
    expect(decideCode(policy([{ match: '(a)\\1', behavior: 'ask' }]), 'print(1)')).toEqual({ decision: 'ask', rule: '(a)\\1' });
    expect(decideCode(policy([{ match: '(', behavior: 'deny' }]), 'print(1)')).toEqual({ decision: 'deny', rule: '(' });
    expect(decideCode(policy([{ match: '(?<=x)print', behavior: 'allow' }], 'ask'), 'print(1)')).toEqual({ decision: 'ask' });
  });

  it('deny wins over ask over allow; without a match the mode decides', () => {
    const rules: Rule[] = [
      { match: '^print\\(', behavior: 'allow' },
      { match: 'subprocess', behavior: 'ask' },
      { match: 'shutil\\.rmtree', behavior: 'deny' },
    ];
    expect(decideCode(policy(rules, 'ask'), 'print(1)')).toEqual({ decision: 'allow', rule: '^print\\(' });
    expect(decideCode(policy(rules, 'auto'), 'print(1)\nimport subprocess')).toEqual({ decision: 'ask', rule: 'subprocess' });
    expect(decideCode(policy(rules, 'auto'), 'import subprocess, shutil\nshutil.rmtree("/")')).toEqual({ decision: 'deny', rule: 'shutil\\.rmtree' });
    expect(decideCode(policy(rules, 'deny'), 'x = 1')).toEqual({ decision: 'deny' });
  });
});
