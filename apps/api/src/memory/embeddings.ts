import OpenAI from 'openai';

/** Turns texts into vectors; only present when KILN_EMBEDDINGS_MODEL is configured. */
export interface Embedder {
  model: string;
  embed(texts: string[]): Promise<number[][]>;
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
