import { describe, expect, it } from 'vitest';
import { Masker, patternsOf } from '../../apps/api/src/secrets/masker.mjs';
import { SecretMask } from '../../apps/api/src/secrets/masking.ts';
import { notRun } from '../../apps/api/src/sandbox/runner-client.ts';
import { ticksDuring } from '../support/ticks.ts';

const TOKEN = 'tok-9f8e7d6c5b4a';
const masker = (secrets: { name: string; value: string }[]) => new Masker(patternsOf(secrets));

/** Feeds `chunks` through one stream and returns what came out, joined. */
function streamed(m: Masker, chunks: string[]): string {
  const s = m.stream();
  return chunks.map((c) => s.push(c)).join('') + s.end();
}

describe('the secret masker', () => {
  const m = masker([{ name: 'TOKEN', value: TOKEN }]);

  it('masks a value printed plainly, wherever it is', () => {
    expect(m.mask(`key=${TOKEN}\n${TOKEN}`)).toBe('key=[secret:TOKEN]\n[secret:TOKEN]');
    expect(m.mask('nothing here')).toBe('nothing here');
  });

  it('masks a value split across chunks at every boundary, and holds back only what may be one', () => {
    const text = `a ${TOKEN} b`;
    for (let cut = 0; cut <= text.length; cut++)
      expect(streamed(m, [text.slice(0, cut), text.slice(cut)]), `cut at ${cut}`).toBe('a [secret:TOKEN] b');
    expect(streamed(m, [...text])).toBe('a [secret:TOKEN] b');
    const s = m.stream();
    expect(s.push('plain text, ')).toBe('plain text, ');
    expect(s.push(`then ${TOKEN.slice(0, 6)}`)).toBe('then ');
    expect(s.push('no more')).toBe(`${TOKEN.slice(0, 6)}no more`);
    expect(s.end()).toBe('');
  });

  it('masks the base64 forms, standard and url-safe, at the three alignments', () => {
    const value = 'p>s?w~o>r?d~42';
    const b = masker([{ name: 'PW', value }]);
    for (const prefix of ['', 'x', 'xy', 'xyz']) {
      const raw = Buffer.from(`${prefix}${value}!!`);
      for (const enc of [raw.toString('base64'), raw.toString('base64url')]) {
        const out = b.mask(`data: ${enc}`);
        expect(out, `${prefix.length}: ${enc}`).toContain('[secret:PW]');
        // What remains encodes the neighbouring bytes, plus at most one character (and padding) at each edge.
        const neighbours = Math.ceil(((prefix.length + 2) * 4) / 3);
        expect(out.replace('[secret:PW]', '').length).toBeLessThanOrEqual('data: '.length + neighbours + 4);
      }
    }
  });

  // A run names the longest value ending at each of its characters: one inside another is covered by it.
  it('masks overlapping and nested values as one run', () => {
    const o = masker([
      { name: 'A', value: 'abcdef' },
      { name: 'B', value: 'defghi' },
      { name: 'C', value: 'cdef' },
    ]);
    expect(o.mask('x abcdefghi y')).toBe('x [secret:A,B] y');
    expect(o.mask('abcdef defghi cdefg')).toBe('[secret:A] [secret:B] [secret:C]g');
    expect(streamed(o, ['x abc', 'defg', 'hi y'])).toBe('x [secret:A,B] y');
  });

  it('makes a bounded number of moves per input unit, and masks a large result off the event loop', async () => {
    // Near misses everywhere: a masker that re-examines input per position would make
    // (value length) moves per unit here; Aho-Corasick makes at most two.
    const long = `${'a'.repeat(300)}b`;
    const worst = masker([{ name: 'LONG', value: long }]);
    const near = 'a'.repeat(100_000);
    expect(worst.mask(`${near}${long}`)).toBe(`${near}[secret:LONG]`);
    expect(worst.moves).toBeLessThanOrEqual(2 * (near.length + long.length));
    const big = `${TOKEN.slice(0, -1)} `.repeat(200_000);
    const mask = new SecretMask([{ name: 'TOKEN', value: TOKEN }]);
    const result = { ...notRun(0, { type: 'X', message: TOKEN }, false), stdout: `${big}${TOKEN}` };
    const { value, ticks } = await ticksDuring(() => mask.result(result));
    expect(value.stdout.endsWith('[secret:TOKEN]')).toBe(true);
    expect(value.error?.message).toBe('[secret:TOKEN]');
    expect(ticks).toBeGreaterThan(1);
  });

  it('masks file contents as bytes and leaves other bytes as they were', async () => {
    const mask = new SecretMask([{ name: 'TOKEN', value: TOKEN }]);
    const data = Buffer.concat([Buffer.from([0xff, 0x00, 0xc3]), Buffer.from(`=${TOKEN};`), Buffer.from([0x80])]);
    const result = {
      ...notRun(0, { type: 'X', message: 'm' }, false),
      changes: { changed: [{ path: `out/${TOKEN}.txt`, data: data.toString('base64') }], deleted: [], skipped: [] },
    };
    const out = await mask.result(result);
    expect(out.changes!.changed[0]!.path).toBe('out/[secret:TOKEN].txt');
    expect(Buffer.from(out.changes!.changed[0]!.data, 'base64')).toEqual(
      Buffer.concat([Buffer.from([0xff, 0x00, 0xc3]), Buffer.from('=[secret:TOKEN];'), Buffer.from([0x80])]),
    );
  });
});
