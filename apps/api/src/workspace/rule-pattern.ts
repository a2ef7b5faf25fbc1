import { RE2JS } from 're2js';

/**
 * Approval rules are tenant-written regular expressions matched against model-written code, on
 * the API's event loop. They run on RE2 (re2js): matching takes time linear in the code whatever
 * the pattern, where a backtracking engine (RegExp) takes exponential time on a rule such as
 * `^(a+)+$` and holds every request of every team meanwhile. RE2 has no lookaround and no
 * backreferences; `^` and `$` match at line boundaries, as the `m` flag always made them.
 */
const FLAGS = RE2JS.MULTILINE;

const compiled = new Map<string, RE2JS | Error>();
const MAX_COMPILED = 2_000;

/** The compiled rule, or the reason RE2 refuses it; compiled once per distinct pattern. */
function compiledRule(match: string): RE2JS | Error {
  let re = compiled.get(match);
  if (re === undefined) {
    try {
      re = RE2JS.compile(match, FLAGS);
    } catch (err) {
      re = err instanceof Error ? err : new Error(String(err));
    }
    if (compiled.size >= MAX_COMPILED) compiled.delete(compiled.keys().next().value!);
    compiled.set(match, re);
  }
  return re;
}

/** Why RE2 cannot compile a rule, or undefined when it can. */
export function ruleProblem(match: string): string | undefined {
  const re = compiledRule(match);
  return re instanceof Error ? re.message : undefined;
}

/** Does the rule match anywhere in the text? Undefined when the rule does not compile. */
export function ruleMatches(match: string, text: string): boolean | undefined {
  const re = compiledRule(match);
  return re instanceof Error ? undefined : re.test(text);
}
