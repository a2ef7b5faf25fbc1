import type { EmbeddingsModel } from '@energetic-ai/embeddings';

/**
 * The built-in encoder's forward pass for one text, op by op on the graph's weights: the graph's
 * vector for it, or null for a text with no token (the caller asks the graph).
 */
export function directEncoder(model: EmbeddingsModel): (text: string) => number[] | null;
