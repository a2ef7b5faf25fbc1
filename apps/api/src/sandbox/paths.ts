import { posix } from 'node:path';
import { ApiError } from '../lib/errors.ts';

/** Where a sandbox may be written to or read from through the files API. */
const ROOTS = ['/workspace', '/tmp', '/home/sandbox'];

/** An absolute, normalised path under one of the sandbox's writable roots, or a 400. */
export function sandboxPath(path: string): string {
  if (!path.startsWith('/') || path.includes('\0') || path.length > 1024) {
    throw new ApiError('invalid_request', 'path must be an absolute path inside the sandbox');
  }
  if (path.split('/').includes('..') || posix.normalize(path) !== path) {
    throw new ApiError('invalid_request', 'path must be normalised: no "..", "." or repeated slashes');
  }
  if (!ROOTS.some((r) => path === r || path.startsWith(`${r}/`)) || ROOTS.includes(path)) {
    throw new ApiError('invalid_request', `path must be a file under ${ROOTS.join(', ')}`);
  }
  return path;
}
