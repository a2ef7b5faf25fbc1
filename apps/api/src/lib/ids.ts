import { randomBytes } from 'node:crypto';

export type IdPrefix = 'team' | 'key' | 'ws' | 'ses' | 'msg' | 'run' | 'apr' | 'sbx' | 'exe' | 'evo' | 'job' | 'aud' | 'use' | 'req';

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz';
let lastTime = 0;
let counter = 0;

/**
 * Prefixed ids that sort by creation: 9 characters of milliseconds, 3 of a per-millisecond
 * counter (so ids made in the same millisecond by this process keep their order), 9 random.
 * Sorting by id sorts by time, so `after=<id>` cursors and transcripts need no extra column.
 */
export function newId(prefix: IdPrefix): string {
  const now = Date.now();
  if (now > lastTime) {
    lastTime = now;
    counter = 0;
  } else {
    counter++;
  }
  const time = lastTime.toString(36).padStart(9, '0');
  const seq = counter.toString(36).padStart(3, '0');
  let rand = '';
  for (const b of randomBytes(9)) rand += ALPHABET[b % 36];
  return `${prefix}_${time}${seq}${rand}`;
}
