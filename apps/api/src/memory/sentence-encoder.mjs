// The built-in sentence encoder's forward pass for one text, written out op by op with the
// TensorFlow.js kernels and weights the package's graph uses (plain JavaScript: it runs in the
// encoder's thread, outside tsx's loaders).
//
// Why: a question is encoded while a search waits for it. The package runs its model through
// TensorFlow.js's graph executor, which walks 317 nodes for every text — sparse-to-dense packing,
// shape arithmetic, scatters and gathers that exist so a batch of texts of different lengths can
// share one pass. For one text none of that does anything, and it cost half of encoding a question
// (p50 15.2 → 7.2 ms over 87 questions on the 2-core machine; `npm run bench:recall` prints both).
// A batch (the background fill) still goes through the graph, which packs its texts' tokens.
//
// The same model, the same numbers: each step below is the graph's own op on the graph's own
// weights, in the graph's order, so a vector equals the graph's to the last bit or within 1e-5
// (tests/unit/sentence-encoder.test.ts compares them), and vectors stored by either stay comparable.
//
// The model (Universal Sentence Encoder lite, English): SentencePiece ids (at most 128 kept) →
// embeddings (256) → twice the embedding plus a sinusoidal timing signal → a transformer layer of
// width 256 with 4 heads whose residual is projected to 512 → a transformer layer of width 512
// with 4 heads (each layer: layer norm, attention, residual; layer norm, ReLU feed-forward of
// 1536, residual) → the mean over the tokens → tanh layer → L2 normalisation.
import * as tf from '@energetic-ai/core';

const GRAPH = 'module_apply_default/Encoder_en/KonaTransformer/Encode/';
const VARS = 'module/Encoder_en/KonaTransformer/Encode/';
/** The graph's ClipToMaxLength: tokens past it are dropped. */
const MAX_TOKENS = 128;

/**
 * `(text) => vector | null` for a model made by `initModel` of @energetic-ai/embeddings: null for
 * a text with no token (the caller asks the graph).
 */
export function directEncoder(model) {
  const weights = model.model.weights;
  const get = (name) => {
    const t = weights[name]?.[0];
    if (!t) throw new Error(`the sentence encoder's weights have no ${name}`);
    return t;
  };
  const pair = (kernel, bias) => [get(kernel), get(bias)];
  const layer = (i, width) => {
    const own = `${GRAPH}Layer_${i}/TransformerLayer/`;
    const stack = `${GRAPH}TransformerStack/Layer_${i}/TransformerLayer/`;
    const norm = (at) =>
      pair(
        `${own}${at}layer_prepostprocess/layer_norm/layer_norm_scale/ConcatPartitions/concat`,
        `${own}${at}layer_prepostprocess/layer_norm/layer_norm_bias/ConcatPartitions/concat`,
      );
    return {
      width,
      heads: 4,
      attentionNorm: norm(''),
      qkv: pair(
        `${VARS}Layer_${i}/TransformerLayer/MultiheadAttention/qkv_transform_single/kernel/part_0`,
        `${own}MultiheadAttention/qkv_transform_single/bias/ConcatPartitions/concat`,
      ),
      output: pair(
        `${VARS}Layer_${i}/TransformerLayer/MultiheadAttention/output_transform_single/kernel/part_0`,
        `${own}MultiheadAttention/output_transform_single/bias/ConcatPartitions/concat`,
      ),
      queryScale: get(`${stack}MultiheadAttention/mul/y`),
      ffnNorm: norm('FFN/'),
      ffn1: pair(`${stack}FFN/conv1/Tensordot/Reshape_1`, `${own}FFN/conv1/bias/ConcatPartitions/concat`),
      ffn2: pair(`${stack}FFN/conv2/Tensordot/Reshape_1`, `${own}FFN/conv2/bias/ConcatPartitions/concat`),
    };
  };
  const embeddings = get('module/Embeddings_en');
  const timescales = get(`${GRAPH}TransformerStack/Layer_0/AddTimingSignal/TimingSignal/ExpandDims_1`);
  const epsilon = get(`${GRAPH}TransformerStack/Layer_1/TransformerLayer/FFN/layer_prepostprocess/layer_norm/Cast/x`);
  const residual = pair(
    `${GRAPH}Layer_0/TransformerLayer/dense/kernel/ConcatPartitions/concat`,
    `${GRAPH}Layer_0/TransformerLayer/dense/bias/ConcatPartitions/concat`,
  );
  const layers = [layer(0, 256), layer(1, 512)];
  const hidden = pair(
    'module/Encoder_en/hidden_layers/tanh_layer_0/weights',
    'module/Encoder_en/hidden_layers/tanh_layer_0/bias',
  );
  const l2Floor = get('module_apply_default/Encoder_en/hidden_layers/l2_normalize/Maximum/y');

  const layerNorm = (x, [scale, bias]) => {
    const centred = tf.sub(x, tf.mean(x, -1, true));
    const rsd = tf.rsqrt(tf.add(tf.mean(tf.square(centred), -1, true), epsilon));
    return tf.add(tf.mul(tf.mul(scale, rsd), centred), bias);
  };
  // The graph's 1×1 convolution over [1, tokens, 1, channels].
  const conv = (x, [kernel, bias]) => {
    const [, t, c] = x.shape;
    return tf.reshape(tf.add(tf.conv2d(tf.reshape(x, [1, t, 1, c]), kernel, 1, 'valid'), bias), [
      1,
      t,
      kernel.shape[3],
    ]);
  };
  // The graph's Tensordot (a matrix product over the tokens' rows).
  const dense = (x, [kernel, bias]) => {
    const [, t, c] = x.shape;
    return tf.reshape(tf.add(tf.matMul(tf.reshape(x, [t, c]), kernel), bias), [1, t, kernel.shape[1]]);
  };
  const attention = (x, L) => {
    const t = x.shape[1];
    const heads = (part) => tf.transpose(tf.reshape(part, [1, t, L.heads, L.width / L.heads]), [0, 2, 1, 3]);
    const [q, k, v] = tf.split(conv(layerNorm(x, L.attentionNorm), L.qkv), [L.width, L.width, L.width], 2).map(heads);
    const mixed = tf.matMul(tf.softmax(tf.matMul(tf.mul(q, L.queryScale), k, false, true)), v);
    return conv(tf.reshape(tf.transpose(mixed, [0, 2, 1, 3]), [1, t, L.width]), L.output);
  };
  const feedForward = (x, L) => dense(tf.relu(dense(layerNorm(x, L.ffnNorm), L.ffn1)), L.ffn2);

  return (text) => {
    const ids = model.tokenizer.encode(text).slice(0, MAX_TOKENS);
    const t = ids.length;
    if (t === 0) return null;
    return tf.tidy(() => {
      const embedded = tf.reshape(tf.gather(embeddings, tf.tensor1d(ids, 'int32')), [1, t, 256]);
      const angles = tf.mul(tf.reshape(tf.range(0, t, 1, 'float32'), [t, 1]), timescales);
      const x = tf.add(embedded, tf.add(embedded, tf.concat([tf.sin(angles), tf.cos(angles)], 1)));
      const [first, second] = layers;
      let y = tf.add(attention(x, first), dense(x, residual));
      y = tf.add(feedForward(y, first), y);
      y = tf.add(attention(y, second), y);
      y = tf.add(feedForward(y, second), y);
      const h = tf.tanh(tf.add(tf.matMul(tf.div(tf.sum(y, 1), t), hidden[0]), hidden[1]));
      return Array.from(tf.mul(h, tf.rsqrt(tf.maximum(tf.sum(tf.square(h), -1, true), l2Floor))).dataSync());
    });
  };
}
