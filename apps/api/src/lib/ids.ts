import { randomFillSync } from 'node:crypto';

export type IdPrefix =
  | 'team'
  | 'key'
  | 'ws'
  | 'ses'
  | 'msg'
  | 'run'
  | 'apr'
  | 'sbx'
  | 'exe'
  | 'evo'
  | 'job'
  | 'aud'
  | 'use'
  | 'req'
  | 'tpl'
  | 'whk'
  | 'whd'
  | 'evt';

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz';
let lastTime = 0;
let counter = 0;
/** Random bytes drawn from the OS a few KB at a time: ids are made several times per agent step. */
const pool = Buffer.alloc(4096);
let used = pool.length;

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
  if (used + 9 > pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  let rand = '';
  for (let i = used; i < used + 9; i++) rand += ALPHABET[pool[i]! % 36];
  used += 9;
  return `${prefix}_${time}${seq}${rand}`;
}
