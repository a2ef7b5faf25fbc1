import OpenAI from 'openai';
import { OffThread } from '../lib/off-thread.ts';

/** Turns texts into vectors: an endpoint's model or the built-in encoder, when KILN_EMBEDDINGS_MODEL names one. */
export interface Embedder {
  model: string;
  /**
   * Chunks' texts (the background fill, vectors.ts), a vector each. An empty one: the model
   * refuses that text however short it is cut (the chunk is found by its words alone).
   */
  embed(texts: string[]): Promise<number[][]>;
  /** A search's query, when it has a way of its own that chunks being embedded do not hold up. */
  embedQuery?(text: string): Promise<number[]>;
  /** Loads what a first query needs (the built-in encoder's model, in its query thread). */
  warm?(): Promise<void>;
}

/** Dimensions a stored vector may have (OpenAI's largest model gives 3,072; pgvector indexes up to 16,000). */
const MAX_DIMENSIONS = 16_000;

/** A vector the database and pgvector take: finite numbers, a sane size. An endpoint's answer is not ours. */
export const usableVector = (v: unknown): v is number[] =>
  Array.isArray(v) && v.length > 0 && v.length <= MAX_DIMENSIONS && v.every(Number.isFinite);

/** Texts per request to an endpoint. */
const BATCH = 64;
/**
 * Of a text, at most this many UTF-8 bytes go to an endpoint: at most 8,000 tokens for any
 * tokenizer that reads bytes (OpenAI's embedding models take 8,192 a text). 8,000 characters of
 * Chinese are ~24,000 bytes, and were refused whole.
 */
const ENDPOINT_TEXT_BYTES = 8_000;
/** Bytes of one request's texts together (OpenAI takes 300,000 tokens a request). */
const ENDPOINT_REQUEST_BYTES = 200_000;
/** A text the endpoint refuses is cut in half and sent again, down to this many bytes. */
const ENDPOINT_MIN_BYTES = 256;
/** What an endpoint's model surely takes: asked when it refuses a text even at ENDPOINT_MIN_BYTES. */
const PROBE_TEXT = 'memory';

const utf8 = new TextEncoder();

/** The longest start of `text` of at most `bytes` UTF-8 bytes, never cutting a character. */
export function cutToBytes(text: string, bytes: number): string {
  if (text.length * 3 <= bytes) return text;
  const { read } = utf8.encodeInto(text, new Uint8Array(bytes));
  return text.slice(0, read);
}

/** The endpoint refused what it was sent (a text too long for the model, say), as opposed to being down, limiting or misconfigured. */
const refusedInput = (err: unknown) => err instanceof OpenAI.APIError && [400, 413, 422].includes(err.status ?? 0);

/**
 * An embeddings client for any OpenAI-compatible endpoint. Texts are cut to what the model takes:
 * at most ENDPOINT_TEXT_BYTES, and less once the endpoint has refused a text of that size and taken
 * its half (models served with a 512-token context, say): that size is kept for the texts after it.
 * A request the endpoint refuses is split until the text it refuses is found, and that text is cut
 * in half until it is taken. One it refuses even at ENDPOINT_MIN_BYTES gets an empty vector when
 * the endpoint still takes a plain word, so one tenant's odd file never stops its workspace's
 * other vectors; when it refuses that too, the call fails (the fill tries again later).
 */
export function openAiEmbedder(opts: { model: string; baseURL?: string; apiKey?: string }): Embedder {
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: opts.apiKey ?? 'unused', maxRetries: 2, timeout: 30_000 });
  let textBytes = ENDPOINT_TEXT_BYTES;
  const request = async (texts: string[]) => {
    const res = await client.embeddings.create({ model: opts.model, input: texts });
    if (res.data.length !== texts.length)
      throw new Error(`the embeddings endpoint gave ${res.data.length} vectors for ${texts.length} texts`);
    return res.data.sort((a, b) => a.index - b.index).map((d) => d.embedding);
  };
  /** One text the endpoint refused in a request: cut in half until it is taken. */
  const alone = async (text: string): Promise<number[]> => {
    for (let bytes = Math.floor(Math.min(textBytes, Buffer.byteLength(text)) / 2); ; bytes = Math.floor(bytes / 2)) {
      try {
        const [v] = await request([cutToBytes(text, bytes)]);
        // Texts that long are refused: cut the next ones before they are sent.
        textBytes = Math.min(textBytes, Math.max(bytes, ENDPOINT_MIN_BYTES));
        return v!;
      } catch (err) {
        if (!refusedInput(err)) throw err;
        if (bytes > ENDPOINT_MIN_BYTES) continue;
        // Refused however short: this text, or everything (a model the endpoint does not serve)?
        await request([PROBE_TEXT]);
        return [];
      }
    }
  };
  const some = async (texts: string[]): Promise<number[][]> => {
    const cut = texts.map((t) => cutToBytes(t, textBytes));
    try {
      return await request(cut);
    } catch (err) {
      if (!refusedInput(err)) throw err;
      if (texts.length === 1) return [await alone(texts[0]!)];
      const half = Math.ceil(texts.length / 2);
      return [...(await some(texts.slice(0, half))), ...(await some(texts.slice(half)))];
    }
  };
  return {
    model: opts.model,
    async embed(texts) {
      const out: number[][] = [];
      for (let i = 0; i < texts.length; ) {
        // A request of at most BATCH texts and ENDPOINT_REQUEST_BYTES (at least one text).
        let j = i;
        for (let bytes = 0; j < texts.length && j - i < BATCH; j++) {
          bytes += Math.min(textBytes, Buffer.byteLength(texts[j]!));
          if (bytes > ENDPOINT_REQUEST_BYTES && j > i) break;
        }
        out.push(...(await some(texts.slice(i, j))));
        i = j;
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
 * its own: vectors with no outside service and no download at run time. `chunkThreads` (default
 * 1): how many threads share the chunks' batches. The server uses one, so that a workspace's
 * import holds one core and leaves the other to the API; `npm run bench:recall` fills its 100k
 * chunks of filler with two (BENCH_RECALL_FILL_THREADS).
 */
export function localEmbedder(opts: { chunkThreads?: number } = {}): Embedder {
  const threads = [
    encoder,
    ...Array.from({ length: Math.max(0, (opts.chunkThreads ?? 1) - 1) }, (_, i) =>
      encoderThread(`sentence encoder ${i + 2}`),
    ),
  ];
  return {
    model: BUILTIN_EMBEDDINGS,
    async embed(texts) {
      const groups: string[][] = [];
      for (let i = 0; i < texts.length; i += LOCAL_BATCH) groups.push(texts.slice(i, i + LOCAL_BATCH).map(encodable));
      const out: number[][][] = [];
      // Each thread takes the next group when it is free; the vectors keep the texts' order.
      let next = 0;
      await Promise.all(
        threads.map(async (thread) => {
          for (let g = next++; g < groups.length; g = next++) out[g] = await thread.run({ texts: groups[g]! });
        }),
      );
      return out.flat();
    },
    async embedQuery(text) {
      const [v] = await queryEncoder.run({ texts: [encodable(text)] });
      return v!;
    },
    async warm() {
      await queryEncoder.run({ texts: ['warm'] });
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
