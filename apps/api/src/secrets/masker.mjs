// Masks secret values (and their base64 forms) in text, in one pass, also across the chunks of a
// stream. Plain JavaScript (masker.d.mts has its types): it runs on the event loop for output as
// it streams and in its own thread (mask.worker.mjs) for large results, where Node starts workers
// outside the TypeScript loaders.
//
// Matching is Aho-Corasick over UTF-16 code units: each input unit is looked at once, so the cost
// is linear in the input (plus the patterns' total length to build). Every unit covered by any
// match is masked; overlapping matches merge into one mask naming each secret, e.g. `[secret:A,B]`.

const ROOT = 0;
const ALPHABET = 0x10000;

/**
 * The strings that give a value away: the value itself, and the part of its base64 encoding
 * (standard and url-safe) that depends on nothing but the value, at each of the three byte
 * alignments the value can have inside a longer encoded text. `bytes`: patterns are the UTF-8
 * bytes as latin1 (for masking file contents read as latin1), else the value's own text.
 */
export function patternsOf(secrets, { bytes = false } = {}) {
  const out = [];
  for (const { name, value } of secrets) {
    const raw = Buffer.from(value, 'utf8');
    const forms = new Set([bytes ? raw.toString('latin1') : value]);
    for (let k = 0; k < 3; k++) {
      const enc = Buffer.concat([Buffer.alloc(k), raw]).toString('base64');
      const part = enc.slice(Math.ceil((8 * k) / 6), Math.floor((8 * (k + raw.length)) / 6));
      if (part.length < 4) continue;
      forms.add(part);
      forms.add(part.replace(/\+/g, '-').replace(/\//g, '_'));
    }
    for (const text of forms) out.push({ name, text });
  }
  return out;
}

export class Masker {
  /** @param {{ name: string, text: string }[]} patterns */
  constructor(patterns) {
    this.patterns = patterns.filter((p) => p.text.length > 0);
    let nodes = 1;
    for (const p of this.patterns) nodes += p.text.length;
    // A trie kept as first-child / next-sibling lists (most nodes have one child), with a
    // dense table at the root, where nearly every input unit starts.
    this.unit = new Uint16Array(nodes);
    this.child = new Int32Array(nodes).fill(-1);
    this.sibling = new Int32Array(nodes).fill(-1);
    this.fail = new Int32Array(nodes);
    this.depth = new Int32Array(nodes);
    // The longest pattern that ends at this node (itself or through its fail links), or -1.
    this.out = new Int32Array(nodes).fill(-1);
    this.root = new Int32Array(ALPHABET).fill(ROOT);
    this.size = 1;
    this.longest = 0;
    // Trie moves made while masking (forward and along fail links): at most two per input unit.
    this.moves = 0;
    for (let i = 0; i < this.patterns.length; i++) this.insert(this.patterns[i].text, i);
    this.link();
    this.moves = 0;
  }

  get empty() {
    return this.patterns.length === 0;
  }

  /** Masks one whole text. */
  mask(text) {
    if (this.empty) return text;
    const s = this.stream();
    return s.push(text) + s.end();
  }

  /** A masker for one stream: `push` returns what is safe to pass on now, `end` the rest. */
  stream() {
    return new MaskStream(this);
  }

  childOf(node, unit) {
    if (node === ROOT) {
      const n = this.root[unit];
      return n === ROOT ? -1 : n;
    }
    for (let c = this.child[node]; c !== -1; c = this.sibling[c]) if (this.unit[c] === unit) return c;
    return -1;
  }

  insert(text, index) {
    let node = ROOT;
    for (let i = 0; i < text.length; i++) {
      const u = text.charCodeAt(i);
      let next = this.childOf(node, u);
      if (next === -1) {
        next = this.size++;
        this.unit[next] = u;
        this.depth[next] = this.depth[node] + 1;
        if (node === ROOT) this.root[u] = next;
        this.sibling[next] = this.child[node];
        this.child[node] = next;
      }
      node = next;
    }
    const prev = this.out[node];
    if (prev === -1 || this.patterns[prev].text.length < text.length) this.out[node] = index;
    this.longest = Math.max(this.longest, text.length);
  }

  link() {
    const queue = new Int32Array(this.size);
    let head = 0;
    let tail = 0;
    for (let c = this.child[ROOT]; c !== -1; c = this.sibling[c]) {
      this.fail[c] = ROOT;
      queue[tail++] = c;
    }
    while (head < tail) {
      const node = queue[head++];
      if (this.out[node] === -1) this.out[node] = this.out[this.fail[node]];
      for (let c = this.child[node]; c !== -1; c = this.sibling[c]) {
        this.fail[c] = this.step(this.fail[node], this.unit[c]);
        queue[tail++] = c;
      }
    }
  }

  /** The next state from `node` on input unit `u`. */
  step(node, u) {
    for (;;) {
      this.moves++;
      const next = this.childOf(node, u);
      if (next !== -1) return next;
      if (node === ROOT) return ROOT;
      node = this.fail[node];
    }
  }
}

class MaskStream {
  constructor(masker) {
    this.m = masker;
    this.state = ROOT;
    this.pos = 0; // input units consumed
    this.held = ''; // input not yet passed on, from `heldAt`
    this.heldAt = 0;
    this.runs = []; // masked ranges in `held`: { s, e, names }, sorted, disjoint (absolute offsets)
  }

  push(chunk) {
    const m = this.m;
    if (m.empty) return chunk;
    let state = this.state;
    const base = this.pos;
    for (let i = 0; i < chunk.length; i++) {
      state = m.step(state, chunk.charCodeAt(i));
      const hit = m.out[state];
      if (hit !== -1) {
        const p = m.patterns[hit];
        this.cover(base + i + 1 - p.text.length, base + i + 1, p.name);
      }
    }
    this.state = state;
    this.pos += chunk.length;
    this.held += chunk;
    // A match still to come starts no earlier than the input the current state spans; a
    // masked range reaching past that point may still grow.
    let safe = this.pos - m.depth[state];
    for (const r of this.runs) if (r.e > safe) safe = Math.min(safe, r.s);
    return this.emit(safe);
  }

  end() {
    const rest = this.m.empty ? '' : this.emit(this.pos);
    this.state = ROOT;
    return rest;
  }

  cover(s, e, name) {
    const runs = this.runs;
    const names = new Set([name]);
    while (runs.length && runs[runs.length - 1].e > s) {
      const r = runs.pop();
      s = Math.min(s, r.s);
      e = Math.max(e, r.e);
      for (const n of r.names) names.add(n);
    }
    runs.push({ s, e, names });
  }

  /** Passes on the held input before `upTo`, masked. */
  emit(upTo) {
    let out = '';
    let at = this.heldAt;
    let done = 0;
    for (const r of this.runs) {
      if (r.e > upTo) break;
      out += `${this.held.slice(at - this.heldAt, r.s - this.heldAt)}[secret:${[...r.names].sort().join(',')}]`;
      at = r.e;
      done++;
    }
    if (done) this.runs.splice(0, done);
    out += this.held.slice(at - this.heldAt, upTo - this.heldAt);
    this.held = this.held.slice(upTo - this.heldAt);
    this.heldAt = upTo;
    return out;
  }
}
