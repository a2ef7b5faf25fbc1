import type { ExecOutcome } from '../sandbox/engine.ts';
import type { CommitOutcome } from '../workspace/git-repos.ts';
import type { SearchHit } from '../memory/search.ts';

/** What the model reads after running code: the `Kiln System: [Execution …]` format, plus what Kiln did with the result. */
export function execFeedback(
  r: ExecOutcome,
  commit: (CommitOutcome & { ignored?: { path: string; reason: string }[] }) | null,
): string {
  const out = r.stdout.trimEnd() || '(no output)';
  const lines: string[] = [];
  if (!r.error) {
    lines.push('Kiln System: [Execution Success]', 'Standard Output:', out);
    if (r.stderr.trim()) lines.push('Standard Error:', r.stderr.trimEnd());
  } else {
    lines.push(`Kiln System: [Execution Error] ${r.error.type}: ${r.error.message} (exit code ${r.exit_code})`);
    if (r.stderr.trim()) lines.push('Standard Error:', r.stderr.trimEnd());
    lines.push('Standard Output:', out);
  }
  if (r.truncated)
    lines.push(
      `[Note] Output was cut to its head and tail (stdout ${r.stdout_bytes} bytes, stderr ${r.stderr_bytes} bytes in full).`,
    );
  if (r.restarted) lines.push('[Note] The interpreter was restarted: variables from earlier steps are gone.');
  if (r.artifacts.length) lines.push(`[Note] ${r.artifacts.length} figure(s) were shown to the user.`);
  const refused = [...new Set((r.egress ?? []).filter((e) => !e.allowed).map((e) => `${e.host}:${e.port}`))];
  if (refused.length)
    lines.push(`[Network] refused by the workspace's egress allowlist: ${refused.slice(0, 20).join(', ')}`);
  if (commit?.commit) lines.push(`[Committed] ${commit.commit.sha.slice(0, 12)}: ${commit.commit.paths.join(', ')}`);
  for (const red of commit?.redactions ?? [])
    lines.push(
      `[Redacted] a ${red.type} in ${red.path}:${red.line} was replaced before the commit. Never write secrets to files.`,
    );
  for (const ref of [...(commit?.refused ?? []), ...(commit?.ignored ?? [])])
    lines.push(`[Not committed] ${ref.path}: ${ref.reason}`);
  return lines.join('\n');
}

/**
 * What the model reads after a memory search: each hit's file and lines (so it can open the
 * file for more), its date and heading, and the matching lines themselves.
 */
export function searchFeedback(query: string, hits: SearchHit[]): string {
  if (!hits.length)
    return `Kiln System: [Memory Search] nothing found for "${query}". Try other words (names, things, identifiers), fewer words, or no filters.`;
  return [
    `Kiln System: [Memory Search] ${hits.length} result(s) for "${query}", best first:`,
    ...hits.map((h) => {
      const where = h.start_line === h.end_line ? `${h.start_line}` : `${h.start_line}-${h.end_line}`;
      const about = [h.date, h.heading ? `"${h.heading}"` : null].filter(Boolean).join(', ');
      return `--- /workspace/${h.path}:${where}${about ? ` (${about})` : ''}\n${h.snippet}`;
    }),
  ].join('\n');
}

export const SEARCH_REFUSED = (problem: string) =>
  `Kiln System: [Memory Search] not run: ${problem}. Call it again with valid arguments.`;

export const DENIED_BY_POLICY = (rule?: string) =>
  `Kiln System: [Denied by policy] This code was not run: the workspace's approval policy does not allow it${rule ? ` (rule ${JSON.stringify(rule)})` : ''}. Find another way, or finish and explain what you need.`;

export const DENIED_BY_USER = (reason?: string | null) =>
  `Kiln System: [User Denied] A person refused to run this code${reason ? `: ${reason}` : ''}. Reconsider your approach and confirm the next step with the user.`;

export const APPROVAL_EXPIRED = (seconds: number) =>
  `Kiln System: [Approval Expired] Nobody decided within ${seconds} s, so the code was not run. This was not a refusal: nobody answered. Finish and tell the user what is waiting for approval, or try a step that needs none.`;

export const FINISHED = 'Kiln System: [Finished]';

export const NOT_RUN_AFTER_FINISH =
  'Kiln System: [Not run] An earlier call of the same message finished the task, so this call was not carried out.';

export const NOT_RUN_RUN_ENDED =
  'Kiln System: [Not run] The run ended (cancelled, failed or interrupted) before this call was carried out.';
