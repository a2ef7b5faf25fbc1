export type CommitKind = 'memory' | 'skill' | 'knowledge' | 'prompt' | 'source' | 'user' | 'system';
export type CommitAuthor = 'agent' | 'user' | 'system';

export const PROMPT_FILES = new Set(['AGENT.md', 'RULE.md', 'USER.md', 'SPEC.md', 'PYTHON.md']);
export const BUILTIN_SKILLS = 'skills/builtin/';

/** What a path in a workspace is, for the Kiln-Kind trailer. */
function kindOfPath(path: string): CommitKind {
  if (path === 'MEMORY.md' || path.startsWith('memory/')) return 'memory';
  if (path.startsWith('skills/')) return 'skill';
  if (path.startsWith('knowledge/')) return 'knowledge';
  if (PROMPT_FILES.has(path)) return 'prompt';
  if (path.startsWith('tools/')) return 'source';
  return 'user';
}

const PRECEDENCE: CommitKind[] = ['prompt', 'skill', 'knowledge', 'memory', 'source', 'user'];

/** Every kind a change touches (one trailer each) and the one it is listed under. */
export function kindsOf(paths: string[]): { primary: CommitKind; all: CommitKind[] } {
  const all = PRECEDENCE.filter((k) => paths.some((p) => kindOfPath(p) === k));
  return { primary: all[0] ?? 'user', all };
}
