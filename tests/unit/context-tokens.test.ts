import { getEncoding } from 'js-tiktoken';
import { describe, expect, it } from 'vitest';
import { countTokens, fits, messageTokens } from '../../apps/api/src/agent/context.ts';
import { ticksDuring } from '../support/ticks.ts';

/** Tokenizing is tenant-driven (a cell's output) and must neither hold the event loop nor grow quadratically. */
describe('token counting', () => {
  it("counts 'x' * 30000 (a long run of one character) with the event loop turning meanwhile", async () => {
    // js-tiktoken's BPE is quadratic in the length of one pre-token: in-thread, this text held
    // the loop for over a minute. Long pieces are split before BPE, and the work runs in a worker.
    // With 39 runs one character longer each: none is in the cache (a worker of the suite may have
    // counted one before), and together they are work the loop turns many times during even with
    // the tokenizer's thread warm (~3 ms for one run: a turn of another file's timers could outlast it).
    const texts = Array.from({ length: 40 }, (_, i) => 'x'.repeat(30_000 + i));
    const { value, ticks } = await ticksDuring(() => Promise.all(texts.map((t) => countTokens(t))));
    value.forEach((n, i) => {
      expect(n).toBeGreaterThan(texts[i]!.length / 64);
      expect(n).toBeLessThanOrEqual(texts[i]!.length);
    });
    expect(ticks).toBeGreaterThan(10);
  });

  it('bounds every shape of long run: separators, blank space, progress bars, zero-filled dumps', async () => {
    const letters = Array.from({ length: 20_000 }, (_, i) => String.fromCharCode(97 + ((i * 7919) % 26))).join('');
    // Each shape five times, a character longer each time (the first test says why).
    const texts = [
      '='.repeat(40_000),
      ' '.repeat(40_000),
      `[${'#'.repeat(40_000)}]`,
      '0'.repeat(40_000),
      `${'é'.repeat(20_000)}\n${'\u{1F600}'.repeat(10_000)}`,
      letters,
      '.\n/'.repeat(10_000),
    ].flatMap((t) => Array.from({ length: 5 }, (_, i) => `${t}${'.'.repeat(i)}`));
    const { value, ticks } = await ticksDuring(() => Promise.all(texts.map((t) => countTokens(t))));
    value.forEach((n, i) => {
      expect(n).toBeGreaterThan(0);
      expect(n).toBeLessThanOrEqual(Buffer.byteLength(texts[i]!));
    });
    expect(ticks).toBeGreaterThan(10);
  });

  it('counts ordinary text exactly as o200k_base does', async () => {
    const enc = getEncoding('o200k_base');
    const prose =
      'The quick brown fox jumps over the lazy dog. Ça coûte 12,50 € — 大丈夫です。\n\tdef f(x):\n        return x ** 2\n';
    const b64 = Buffer.from(Array.from({ length: 6000 }, (_, i) => (i * 7919) % 251)).toString('base64');
    for (const text of [prose, prose.repeat(50), b64, `say <|endoftext|> twice`])
      expect(await countTokens(text)).toBe(enc.encode(text, 'all').length);
  });

  it('answers from the byte bound without tokenizing when it can, and tokenizes when it must', async () => {
    const msgs = [{ role: 'user' as const, content: 'hello there' }];
    expect(await fits(msgs, 100)).toBe(true);
    const long = [{ role: 'user' as const, content: 'word '.repeat(2000) }];
    // 10,000 bytes are over a 5,000 budget by the bound, but about 2,000 tokens are not.
    expect(await fits(long, 5000)).toBe(true);
    expect(await fits(long, 1000)).toBe(false);
    expect(await messageTokens(long)).toBe(3 + 4 + (await countTokens('word '.repeat(2000))));
  });
});
