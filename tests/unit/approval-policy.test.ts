import { describe, expect, it } from 'vitest';
import { decideCode } from '../../apps/api/src/agent/policy.ts';
import type { WorkspaceSettings } from '../../apps/api/src/workspace/settings.ts';

type Rule = WorkspaceSettings['approval']['rules'][number];
const policy = (
  rules: Rule[],
  mode: WorkspaceSettings['approval']['mode'] = 'auto',
): WorkspaceSettings['approval'] => ({ mode, rules, timeout_s: 600 });

/** Approval rules are tenant input run against model-written code: their cost must be linear. */
describe('approval rules', () => {
  it('a catastrophic-backtracking rule is checked in linear time (the call returns, with the right answer)', () => {
    // With a backtracking engine, `^(a+)+$` against a run of `a` that ends in `!` takes 2^n steps:
    // 40 characters would hold the event loop for days.
    const rules: Rule[] = [{ match: '^(a+)+$', behavior: 'deny' }];
    expect(decideCode(policy(rules), `print(1)\n${'a'.repeat(40)}!`)).toEqual({ decision: 'allow' });
    expect(decideCode(policy(rules), `${'a'.repeat(100_000)}!`)).toEqual({ decision: 'allow' });
    // The multiline flag is kept: `^` and `$` match at line boundaries.
    expect(decideCode(policy(rules), `print(1)\n${'a'.repeat(40)}\nprint(2)`)).toEqual({
      decision: 'deny',
      rule: '^(a+)+$',
    });
  });

  it('a stored rule that no longer compiles fails closed for deny and ask, and is ignored for allow', () => {
    // Rules stored before rules were checked with RE2 may use what RE2 lacks (lookaround, backreferences).
    expect(decideCode(policy([{ match: '(?=.*rm)', behavior: 'deny' }]), 'print(1)')).toEqual({
      decision: 'deny',
      rule: '(?=.*rm)',
    });
    expect(decideCode(policy([{ match: '(a)\\1', behavior: 'ask' }]), 'print(1)')).toEqual({
      decision: 'ask',
      rule: '(a)\\1',
    });
    expect(decideCode(policy([{ match: '(', behavior: 'deny' }]), 'print(1)')).toEqual({ decision: 'deny', rule: '(' });
    expect(decideCode(policy([{ match: '(?<=x)print', behavior: 'allow' }], 'ask'), 'print(1)')).toEqual({
      decision: 'ask',
    });
  });

  it('deny wins over ask over allow; without a match the mode decides', () => {
    const rules: Rule[] = [
      { match: '^print\\(', behavior: 'allow' },
      { match: 'subprocess', behavior: 'ask' },
      { match: 'shutil\\.rmtree', behavior: 'deny' },
    ];
    expect(decideCode(policy(rules, 'ask'), 'print(1)')).toEqual({ decision: 'allow', rule: '^print\\(' });
    expect(decideCode(policy(rules, 'auto'), 'print(1)\nimport subprocess')).toEqual({
      decision: 'ask',
      rule: 'subprocess',
    });
    expect(decideCode(policy(rules, 'auto'), 'import subprocess, shutil\nshutil.rmtree("/")')).toEqual({
      decision: 'deny',
      rule: 'shutil\\.rmtree',
    });
    expect(decideCode(policy(rules, 'deny'), 'x = 1')).toEqual({ decision: 'deny' });
  });
});

describe('deciding a piece of code', () => {
  it('without rules, the mode decides: auto runs, ask asks, deny refuses; no rule is named', () => {
    expect(decideCode(policy([], 'auto'), 'print(1)')).toStrictEqual({ decision: 'allow' });
    expect(decideCode(policy([], 'ask'), 'print(1)')).toStrictEqual({ decision: 'ask' });
    expect(decideCode(policy([], 'deny'), 'print(1)')).toStrictEqual({ decision: 'deny' });
  });

  it('the order of behaviours does not depend on the order of the rules', () => {
    const rules: Rule[] = [
      { match: 'os', behavior: 'allow' },
      { match: 'os', behavior: 'ask' },
      { match: 'os', behavior: 'deny' },
    ];
    expect(decideCode(policy(rules), 'import os')).toEqual({ decision: 'deny', rule: 'os' });
    expect(decideCode(policy(rules.slice(0, 2)), 'import os')).toEqual({ decision: 'ask', rule: 'os' });
    expect(decideCode(policy([...rules].reverse().slice(1)), 'import os')).toEqual({ decision: 'ask', rule: 'os' });
  });

  it('among matching rules of one behaviour, the first listed is the one named', () => {
    const rules: Rule[] = [
      { match: 'never-here', behavior: 'deny' },
      { match: 'rmtree', behavior: 'deny' },
      { match: 'shutil', behavior: 'deny' },
    ];
    const code = 'import shutil\nshutil.rmtree("/")';
    expect(decideCode(policy(rules), code)).toEqual({ decision: 'deny', rule: 'rmtree' });
  });

  it('a rule is searched for anywhere in the code, case-sensitively unless it says otherwise', () => {
    expect(decideCode(policy([{ match: 'rm', behavior: 'deny' }]), 'shutil.rmtree(p)').decision).toBe('deny');
    expect(decideCode(policy([{ match: 'Subprocess', behavior: 'deny' }]), 'import subprocess').decision).toBe('allow');
    const insensitive: Rule[] = [{ match: '(?i)Subprocess', behavior: 'deny' }];
    expect(decideCode(policy(insensitive), 'import subprocess').decision).toBe('deny');
  });

  it('an allow rule lets through code the mode would stop, but only code it matches', () => {
    const rules: Rule[] = [{ match: '^print\\([^)]*\\)$', behavior: 'allow' }];
    expect(decideCode(policy(rules, 'deny'), 'print("hi")')).toEqual({ decision: 'allow', rule: '^print\\([^)]*\\)$' });
    expect(decideCode(policy(rules, 'deny'), 'import os')).toEqual({ decision: 'deny' });
  });

  it('a broken allow rule does not hide a working one after it; a broken ask rule loses to a matching deny', () => {
    const allow: Rule[] = [
      { match: '(?<=x)print', behavior: 'allow' },
      { match: 'print', behavior: 'allow' },
    ];
    expect(decideCode(policy(allow, 'ask'), 'print(1)')).toEqual({ decision: 'allow', rule: 'print' });
    const mixed: Rule[] = [
      { match: '(a)\\1', behavior: 'ask' },
      { match: 'rmtree', behavior: 'deny' },
    ];
    expect(decideCode(policy(mixed), 'shutil.rmtree(p)')).toEqual({ decision: 'deny', rule: 'rmtree' });
  });

  it('sees lines as Python does: an anchored rule matches a line ended by CRLF or a lone CR', () => {
    const deny = policy([{ match: '^import os$', behavior: 'deny' }]);
    for (const code of ['import os\r\nprint(1)\r\n', 'print(1)\rimport os\rprint(2)', 'import os\r'])
      expect(decideCode(deny, code), JSON.stringify(code)).toEqual({ decision: 'deny', rule: '^import os$' });
    expect(decideCode(deny, 'import osx\r\n')).toEqual({ decision: 'allow' });
  });

  it('empty code: only a rule that matches the empty text applies', () => {
    expect(decideCode(policy([{ match: 'import', behavior: 'deny' }], 'ask'), '')).toEqual({ decision: 'ask' });
    expect(decideCode(policy([{ match: '^$', behavior: 'deny' }]), '')).toEqual({ decision: 'deny', rule: '^$' });
  });

  it('matches text outside ASCII: accented letters, scripts by class, emoji', () => {
    expect(decideCode(policy([{ match: 'café', behavior: 'ask' }]), 'print("café")').decision).toBe('ask');
    expect(decideCode(policy([{ match: '\\p{Greek}+', behavior: 'ask' }]), 'λ = 1').decision).toBe('ask');
    expect(decideCode(policy([{ match: '\\p{Greek}', behavior: 'ask' }]), 'l = 1').decision).toBe('allow');
    expect(decideCode(policy([{ match: '^x = "😀"$', behavior: 'deny' }]), 'y = 1\nx = "😀"\n').decision).toBe('deny');
  });

  it('a hundred backtracking-prone rules against a megabyte of code: the one matching at its end is found', () => {
    const rules: Rule[] = Array.from({ length: 100 }, (_, i) => ({ match: `(x+x+)+y${i}$`, behavior: 'deny' }));
    const code = `${'x'.repeat(1_000_000)}y99`;
    expect(decideCode(policy(rules), code)).toEqual({ decision: 'deny', rule: '(x+x+)+y99$' });
    expect(decideCode(policy(rules), 'x'.repeat(1_000_000))).toEqual({ decision: 'allow' });
  });
});
