import OpenAI from 'openai';
import { OffThread } from '../lib/off-thread.ts';

/** Turns texts into vectors: an endpoint's model or the built-in encoder, when KILN_EMBEDDINGS_MODEL names one. */
export interface Embedder {
  model: string;
  /** Chunks' texts (the background fill, vectors.ts). */
  embed(texts: string[]): Promise<number[][]>;
  /** A search's query, when it has a way of its own that chunks being embedded do not hold up. */
  embedQuery?(text: string): Promise<number[]>;
}

const BATCH = 64;

/** An embeddings client for any OpenAI-compatible endpoint. */
export function openAiEmbedder(opts: { model: string; baseURL?: string; apiKey?: string }): Embedder {
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: opts.apiKey ?? 'unused', maxRetries: 2, timeout: 30_000 });
  return {
    model: opts.model,
    async embed(texts) {
      const out: number[][] = [];
      for (let i = 0; i < texts.length; i += BATCH) {
        const res = await client.embeddings.create({ model: opts.model, input: texts.slice(i, i + BATCH) });
        out.push(...res.data.sort((a, b) => a.index - b.index).map((d) => d.embedding));
      }
      return out;
    },
  };
}

/** The built-in encoder's name, as `KILN_EMBEDDINGS_MODEL` takes it and as indexes record it. */
export const BUILTIN_EMBEDDINGS = 'builtin-use-lite-512';
/** Texts per message to the encoder's thread (its input tensors grow with the batch's tokens). */
const LOCAL_BATCH = 16;
/** Of a text, at most this much is encoded (a chunk's search text; the encoder is made for sentences). */
const LOCAL_TEXT_CHARS = 2_000;

/**
 * Two threads of the encoder: one for chunks, one for queries. A search never waits behind a
 * workspace's chunks being embedded (a batch holds its thread for ~0.3 s; an import, for minutes).
 */
const encoderThread = (name: string) =>
  new OffThread<{ texts: string[] }, number[][]>(new URL('./embed.worker.mjs', import.meta.url), name);
const encoder = encoderThread('sentence encoder');
const queryEncoder = encoderThread('query encoder');
const encodable = (t: string) => t.slice(0, LOCAL_TEXT_CHARS) || ' ';

/**
 * The built-in sentence encoder (Universal Sentence Encoder lite, 512 dimensions), in threads of
 * its own: vectors with no outside service and no download at run time.
 */
export function localEmbedder(): Embedder {
  return {
    model: BUILTIN_EMBEDDINGS,
    async embed(texts) {
      const out: number[][] = [];
      for (let i = 0; i < texts.length; i += LOCAL_BATCH)
        out.push(...(await encoder.run({ texts: texts.slice(i, i + LOCAL_BATCH).map(encodable) })));
      return out;
    },
    async embedQuery(text) {
      const [v] = await queryEncoder.run({ texts: [encodable(text)] });
      return v!;
    },
  };
}

export function cosine(a: number[], b: number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length && i < b.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}
