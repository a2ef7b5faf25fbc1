import { frontField } from '../lib/text.ts';
import { checkMemoryBudget, type MemoryBudget } from '../memory/budget.ts';
import { PROMPT_FILES } from '../workspace/kinds.ts';
import { checkRelativePath, isBuiltinSkillPath } from '../workspace/paths.ts';
import type { WorkingTree, WorkspaceReader } from '../workspace/service.ts';

/** Raised for a write the guard refuses; the reviewer is told why and may try something else. */
export class GuardError extends Error {}

const WRITABLE =
  'MEMORY.md, memory/, skills/ (not skills/builtin/), knowledge/ and the prompt files (AGENT.md, RULE.md, USER.md, SPEC.md, PYTHON.md)';

/**
 * The code-level write guard of an evolution: only memory, skills, knowledge and prompt files,
 * never a built-in skill, never anything that leaves the workspace (shape checked here, links
 * out refused again when the file is written).
 */
export function checkEvolutionPath(raw: string): string {
  let path: string;
  try {
    path = checkRelativePath(raw);
  } catch (err) {
    throw new GuardError((err as Error).message);
  }
  if (isBuiltinSkillPath(path)) throw new GuardError(`${path}: skills/builtin/ is read-only`);
  const ok = path === 'MEMORY.md' || PROMPT_FILES.has(path) || /^(memory|skills|knowledge)\/./.test(path);
  if (!ok) throw new GuardError(`${path}: outside what self-evolution may change (${WRITABLE})`);
  return path;
}

/** A skill file must say what it is: front matter with a name and a description. */
function checkSkillFile(path: string, text: string): void {
  if (!path.endsWith('/SKILL.md')) return;
  const front = /^---\n([\s\S]*?)\n---/.exec(text)?.[1];
  const has = (k: string) => front !== undefined && frontField(front, k) !== undefined;
  if (!has('name') || !has('description')) {
    throw new GuardError(
      `${path}: a SKILL.md starts with front matter naming the skill: ---\\nname: …\\ndescription: …\\n---`,
    );
  }
}

/**
 * The files an evolution works on: reads see the workspace with the evolution's own edits on
 * top; edits are only staged (checked by the guard as they are made) and reach the repository
 * in one piece through `apply`, inside the commit. A failed evolution therefore leaves nothing.
 */
export class GuardedFiles {
  private readonly staged = new Map<string, Buffer | null>();

  constructor(
    private readonly files: WorkspaceReader,
    private readonly limits: { maxFileBytes: number; budget: MemoryBudget },
  ) {}

  async read(raw: string): Promise<string | null> {
    const path = checkEvolutionRead(raw);
    if (this.staged.has(path)) return this.staged.get(path)?.toString('utf8') ?? null;
    return (await this.files.readFile(path).catch(() => null))?.toString('utf8') ?? null;
  }

  /** Files under a directory (recursively, at most 200), with this evolution's edits applied. */
  async list(raw: string): Promise<string[]> {
    const base = raw.replace(/^\.?\/*$/, '') === '' ? '' : checkEvolutionRead(raw);
    const out = new Set<string>();
    const walk = async (dir: string, depth: number): Promise<void> => {
      const entries = await this.files.listDir(dir).catch(() => []);
      for (const e of entries) {
        if (out.size >= 200) return;
        if (e.type === 'dir' && depth < 4) await walk(e.path, depth + 1);
        else if (e.type === 'file') out.add(e.path);
      }
    };
    await walk(base, 0);
    for (const [p, data] of this.staged) {
      if (base && !p.startsWith(`${base}/`)) continue;
      if (data === null) out.delete(p);
      else out.add(p);
    }
    return [...out].sort();
  }

  async write(raw: string, content: string): Promise<string> {
    const path = checkEvolutionPath(raw);
    // Text files end with a newline, whatever the model's formatting left off.
    const data = Buffer.from(content.endsWith('\n') ? content : `${content}\n`, 'utf8');
    if (data.length > this.limits.maxFileBytes)
      throw new GuardError(`${path}: ${data.length} bytes is over the ${this.limits.maxFileBytes}-byte file limit`);
    if (!content.trim())
      throw new GuardError(`${path}: refusing to write an empty file (use delete_file to remove one)`);
    checkSkillFile(path, content);
    if (path === 'MEMORY.md') {
      const check = await checkMemoryBudget(
        data.toString('utf8'),
        async () => (await this.read('MEMORY.md')) ?? '',
        this.limits.budget,
      );
      if (!check.ok) throw new GuardError(check.message!);
    }
    this.staged.set(path, data);
    return path;
  }

  async delete(raw: string): Promise<string> {
    const path = checkEvolutionPath(raw);
    if ((await this.read(path)) === null) throw new GuardError(`${path}: no such file`);
    this.staged.set(path, null);
    return path;
  }

  /** The paths this evolution would change (an edit that restores the original still counts until committed; git drops it). */
  changed(): string[] {
    return [...this.staged.keys()].sort();
  }

  /** Writes the staged edits into the working tree (the callback of `WorkspaceService.change`, right before the commit). */
  async apply(tree: WorkingTree): Promise<void> {
    for (const [path, data] of this.staged) {
      if (data === null)
        await tree.deleteFile(path).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'ENOENT') throw err;
        });
      else await tree.writeFile(path, data);
    }
  }
}

/** Reading is allowed anywhere in the workspace except .git (and never outside it). */
function checkEvolutionRead(raw: string): string {
  try {
    return checkRelativePath(raw);
  } catch (err) {
    throw new GuardError((err as Error).message);
  }
}
