import { randomBytes } from 'node:crypto';

export type IdPrefix = 'team' | 'key' | 'ws' | 'ses' | 'msg' | 'run' | 'apr' | 'sbx' | 'exe' | 'evo' | 'job' | 'aud' | 'use' | 'req';

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz';

/**
 * Prefixed, time-ordered ids (`ws_` + 9 chars of milliseconds + 12 random), so sorting by id
 * sorts by creation time and `after=<id>` cursors need no extra column.
 */
export function newId(prefix: IdPrefix): string {
  const time = Date.now().toString(36).padStart(9, '0');
  const bytes = randomBytes(12);
  let rand = '';
  for (const b of bytes) rand += ALPHABET[b % 36];
  return `${prefix}_${time}${rand}`;
}
