/** String helpers for text a model or a tenant wrote: plain searches, no pattern built from input, linear in its length. */

/** ASCII letters lowered, nothing else: offsets in the result are offsets in the text. */
const asciiLower = (s: string) => s.replace(/[A-Z]+/g, (m) => m.toLowerCase());

/**
 * The text between the first <name> and the first </name> after it (case-insensitive), or null.
 * Plain searches, no pattern: the reply is the model's, and this stays linear in its length.
 */
export function tag(reply: string, name: string): string | null {
  const lower = asciiLower(reply);
  const open = `<${name}>`;
  const at = lower.indexOf(open);
  if (at < 0) return null;
  const end = lower.indexOf(`</${name}>`, at + open.length);
  return end < 0 ? null : reply.slice(at + open.length, end).trim();
}

/** The reply without everything from the first <name> to the last </name>. */
export function withoutBlock(reply: string, name: string): string {
  const lower = asciiLower(reply);
  const at = lower.indexOf(`<${name}>`);
  const close = `</${name}>`;
  const end = at < 0 ? -1 : lower.lastIndexOf(close);
  return end < at + name.length + 2 ? reply : reply.slice(0, at) + reply.slice(end + close.length);
}

/**
 * A front-matter field: the first line that starts with `key:`, its value after any blank space
 * (a value on the next line counts, as in YAML's plain form), up to the end of that line.
 * Plain string work, no pattern built from the key: a skill's text is the tenant's.
 */
export function frontField(front: string, key: string): string | undefined {
  for (let at = 0; at < front.length; ) {
    const nl = front.indexOf('\n', at);
    const end = nl < 0 ? front.length : nl;
    if (front.startsWith(`${key}:`, at)) {
      let v = at + key.length + 1;
      while (v < front.length && /\s/.test(front[v]!)) v++;
      const stop = front.indexOf('\n', v);
      const value = front.slice(v, stop < 0 ? front.length : stop).trim();
      if (value) return value;
    }
    at = end + 1;
  }
  return undefined;
}
