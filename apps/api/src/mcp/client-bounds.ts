/**
 * What an MCP server says about its tools reaches every model request: descriptions and input
 * schemas are the server's, so they are cut to size and rebuilt from the few JSON Schema keywords
 * function parameters use. A schema a model endpoint would refuse would fail every step of every
 * run of the workspace, so anything unexpected is dropped rather than passed on.
 */
export type JsonSchema = Record<string, unknown>;

const TYPES = new Set(['object', 'string', 'number', 'integer', 'boolean', 'array', 'null']);
const MAX_DEPTH = 4;
const MAX_PROPERTIES = 40;
const MAX_ENUM = 50;
const MAX_SCHEMA_CHARS = 4000;
const PROPERTY = /^[A-Za-z0-9_.-]{1,64}$/;

/** A tenant's or a server's text for a prompt: no control characters, one line per line, bounded. */
export function cleanText(s: string, max: number): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: removing them is the point
  const text = s.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029]/g, ' ').trim();
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function clean(s: unknown, depth: number): JsonSchema {
  if (!isObject(s)) return {};
  const out: JsonSchema = {};
  const types = (Array.isArray(s.type) ? s.type : [s.type]).filter((t) => typeof t === 'string' && TYPES.has(t));
  if (types.length === 1) out.type = types[0];
  else if (types.length > 1) out.type = types.slice(0, 7);
  if (typeof s.description === 'string') out.description = cleanText(s.description, 200);
  if (Array.isArray(s.enum)) {
    const values = s.enum.filter((v) => ['string', 'number', 'boolean'].includes(typeof v)).slice(0, MAX_ENUM);
    if (values.length) out.enum = values.map((v) => (typeof v === 'string' ? v.slice(0, 100) : v));
  }
  if (depth < MAX_DEPTH && isObject(s.properties)) {
    const props: Record<string, JsonSchema> = {};
    for (const [k, v] of Object.entries(s.properties).slice(0, MAX_PROPERTIES))
      if (PROPERTY.test(k)) props[k] = clean(v, depth + 1);
    out.properties = props;
    if (Array.isArray(s.required))
      out.required = s.required.filter((r): r is string => typeof r === 'string' && r in props);
  }
  if (depth < MAX_DEPTH && isObject(s.items)) out.items = clean(s.items, depth + 1);
  return out;
}

/** A tool's input schema as the model is offered it: an object schema of bounded size. */
export function cleanSchema(s: unknown): JsonSchema {
  const schema: JsonSchema = { ...clean(s, 0), type: 'object' };
  if (!isObject(schema.properties)) schema.properties = {};
  return JSON.stringify(schema).length <= MAX_SCHEMA_CHARS
    ? schema
    : { type: 'object', properties: {}, description: 'the server\u2019s argument schema was too large to show' };
}
