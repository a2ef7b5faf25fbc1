import { lstat, realpath } from 'node:fs/promises';
import { dirname, join, posix, relative, sep } from 'node:path';
import { ApiError } from '../lib/errors.ts';
import { BUILTIN_SKILLS } from './kinds.ts';

/**
 * A workspace-relative path checked for shape: no absolute paths, no "..", no empty or odd
 * segments, and no segment git itself refuses or reads as configuration (see `segmentRefusal`).
 * Returns it normalised ("" for the root).
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
  const refusal = pathRefusal(path);
  if (refusal) throw bad(refusal.why);
  return posix.normalize(path);
}

/** The first segment of a path git refuses or reads as configuration (see `segmentRefusal`): the path up to it, and why. */
export function pathRefusal(path: string): { upTo: string; why: string } | null {
  const segments = path.split('/');
  for (let i = 0; i < segments.length; i++) {
    const why = segmentRefusal(segments[i]!);
    if (why) return { upTo: segments.slice(0, i + 1).join('/'), why };
  }
  return null;
}

// Control characters (git quotes them everywhere, a terminal may act on them) and lone UTF-16
// surrogates (they reach the filesystem as U+FFFD: a different name from the one checked).
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const UNSTORABLE = /[\u0000-\u001f\u007f]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
// Code points HFS+ ignores in names (git's next_hfs_char): ".g\u200cit" is ".git" there.
const HFS_IGNORED = /[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]/g;
// Files git reads as configuration from the working tree: a tenant writing one would change
// what git does with every other file (hide it, convert it, fail on it).
const RESERVED = [
  { name: 'gitattributes', hash: 'gi7d29' },
  { name: 'gitignore', hash: 'gi250a' },
  { name: 'gitmodules', hash: 'gi7eba' },
].map(({ name, hash }) => ({ name, short: (s: string) => isShortName(s, name, hash) }));

/**
 * Is `s` (lower case) one of the 8.3 short names NTFS may give `.<name>`: its first six letters
 * and "~1" to "~4", or (git's is_ntfs_dot_generic) up to six letters of `hash`, "~", then
 * digits not starting with 0, eight characters in all.
 */
function isShortName(s: string, name: string, hash: string): boolean {
  if (s.length !== 8) return false;
  if (s.startsWith(`${name.slice(0, 6)}~`) && '1234'.includes(s[7]!)) return true;
  for (let k = 0; k <= 6; k++) {
    if (s.startsWith(`${hash.slice(0, k)}~`) && /^[1-9][0-9]*$/.test(s.slice(k + 1))) return true;
  }
  return false;
}
/** The temporary files of atomic writes, never committed (see WorkspaceRepos.writeFile): `.kiln-*.tmp`. */
export const isTempName = (name: string) => /^\.kiln-.*\.tmp$/s.test(name);

/**
 * Why git would refuse (or obey) a path segment, or null. A port of git's verify_path rules
 * with core.protectNTFS and core.protectHFS on (workspace git runs with both): ".git" in any
 * case, followed by dots, spaces or an NTFS stream (":..."), its 8.3 short name "git~1", or
 * spelled with code points HFS+ ignores; the same spellings of .gitattributes, .gitignore and
 * .gitmodules (plus their 8.3 short names), which are reserved at any depth.
 */
function segmentRefusal(segment: string): string | null {
  if (UNSTORABLE.test(segment)) return 'contains a control character or an unpaired surrogate';
  if (Buffer.byteLength(segment) > 255) return 'has a name longer than 255 bytes';
  if (isTempName(segment)) return 'uses the name of a temporary file';
  // NTFS ignores trailing dots and spaces and everything from a stream separator on.
  const ntfs = segment
    .replace(/:.*$/s, '')
    .replace(/[. ]+$/, '')
    .toLowerCase();
  const hfs = segment.replace(HFS_IGNORED, '').toLowerCase();
  if (ntfs === '.git' || ntfs === 'git~1' || hfs === '.git') return 'must not touch .git';
  for (const { name, short } of RESERVED) {
    if (ntfs === `.${name}` || hfs === `.${name}` || short(ntfs))
      return `.${name} is reserved: git reads it as configuration`;
  }
  return null;
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
    throw new ApiError(
      'invalid_request',
      `path ${JSON.stringify(path)} leads out of the workspace through a symbolic link`,
    );
  }
  return target;
}
