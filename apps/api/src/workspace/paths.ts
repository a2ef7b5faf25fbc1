import { lstat, realpath } from 'node:fs/promises';
import { dirname, join, posix, relative, sep } from 'node:path';
import { ApiError } from '../http/errors.ts';
import { BUILTIN_SKILLS } from './kinds.ts';

/**
 * A workspace-relative path checked for shape: no absolute paths, no "..", no ".git", no
 * empty or odd segments. Returns it normalised ("" for the root).
 */
export function checkRelativePath(input: string, opts: { allowRoot?: boolean } = {}): string {
  const path = input.replace(/^\.\/+/, '').replace(/\/+$/, '');
  const bad = (why: string) => new ApiError('invalid_request', `path ${JSON.stringify(input)}: ${why}`);
  if (input.includes('\0') || input.includes('\\')) throw bad('contains a NUL byte or a backslash');
  if (input.startsWith('/')) throw bad('must be relative to the workspace');
  if (path.length > 1024) throw bad('is too long');
  if (path === '' || path === '.') {
    if (opts.allowRoot) return '';
    throw bad('names the workspace itself');
  }
  const segments = path.split('/');
  if (segments.some((s) => s === '..')) throw bad('must not contain ".."');
  if (segments.some((s) => s === '' || s === '.')) throw bad('must not contain empty or "." segments');
  if (segments.some((s) => s.toLowerCase() === '.git')) throw bad('must not touch .git');
  return posix.normalize(path);
}

export const isBuiltinSkillPath = (path: string) => path === 'skills/builtin' || path.startsWith(BUILTIN_SKILLS);

/**
 * The absolute location of a checked path inside `root`, refusing any symlink on the way
 * that leads out of the workspace (for a path that does not exist yet, its nearest existing
 * ancestor is checked).
 */
export async function resolveInside(root: string, path: string): Promise<string> {
  const rootReal = await realpath(root);
  const target = join(rootReal, path);
  let probe = target;
  for (;;) {
    try {
      await lstat(probe);
      break;
    } catch {
      const up = dirname(probe);
      if (up === probe) break;
      probe = up;
    }
  }
  const real = await realpath(probe).catch(() => probe);
  const rel = relative(rootReal, real);
  if (rel === '..' || rel.startsWith(`..${sep}`) || rel.startsWith(sep)) {
    throw new ApiError('invalid_request', `path ${JSON.stringify(path)} leads out of the workspace through a symbolic link`);
  }
  return target;
}
