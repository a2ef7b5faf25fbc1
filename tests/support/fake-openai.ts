import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/**
 * A scripted OpenAI-compatible HTTP server (the one fake the rules allow): the real `openai`
 * SDK talks to it over the real wire format. Embeddings are a deterministic bag of words in
 * 512 dimensions, with a small synonym table so that similarity can be meaning-like in tests.
 */
/** One scripted model answer. */
interface Reply {
  content?: string;
  /** `id`: the call's id as the server sends it (by default one of its own for each call). */
  tool_calls?: { name: string; arguments: Record<string, unknown> | string; id?: string }[];
  /** Answer with this HTTP error instead (429, 500, 400 + code for context overflow). */
  status?: number;
  error?: { message: string; code?: string; type?: string };
  /** Hold the answer until the client goes away (for cancel tests). */
  hang?: boolean;
  /** Answer only once this settles (to hold a run in flight while something else happens). */
  until?: Promise<unknown>;
  usage?: { prompt_tokens: number; completion_tokens: number };
}

export interface FakeOpenAI {
  url: string;
  requests: { path: string; body: any }[];
  /** Chat requests only, in order. */
  chats(): any[];
  /** Requests refused as a real endpoint would (400), chat and embeddings, in order. */
  refusals: Refusal[];
  /** Queues answers for the next chat completions, in order. */
  script(...replies: Reply[]): void;
  /** Answers still queued. */
  pending(): number;
  /** Resolves once `n` chat requests have arrived in total. */
  chatRequests(n: number): Promise<void>;
  /** Resolves once `n` held (`hang`) requests have been given up by their client in total. */
  hangsClosed(n: number): Promise<void>;
  /** Rejects when a refused request is still in `refusals` (take expected ones out first). */
  close(): Promise<void>;
  /** How the embeddings model behaves (a test may change it). */
  embeddings: EmbeddingsModel;
}

/** The embeddings model behind the fake: its context, and what a test makes it do. */
interface EmbeddingsModel {
  /** Tokens one input may have (OpenAI's embedding models: 8,192; models served with a 512-token context exist). */
  contextTokens: number;
  /** Refuse (400) a request holding a text this matches, at any length (a content filter, a broken tokenizer). */
  refuses?: (text: string) => boolean;
  /** Answer NaN in the vector of a text this matches (a broken model). */
  nan?: (text: string) => boolean;
}

/** OpenAI's limits on one embeddings request. */
const EMBEDDING_CONTEXT = 8192;
const EMBEDDING_INPUTS_MAX = 2048;
const EMBEDDING_REQUEST_TOKENS = 300_000;
/**
 * A text's tokens as counted here: its UTF-8 bytes. Every token of a byte-level tokenizer (OpenAI's)
 * is at least one byte, so this is never fewer than the real count, and the fake refuses at least
 * what a real endpoint refuses.
 */
const tokensOf = (text: string) => Buffer.byteLength(text, 'utf8');

/** Why a real OpenAI-compatible endpoint would refuse this embeddings request (null: it would not). */
function embeddingsRefusal(body: any, model: EmbeddingsModel = { contextTokens: EMBEDDING_CONTEXT }): Refusal | null {
  if (!isObject(body)) return refuse('We could not parse the JSON body of your request.', null);
  if (typeof body.model !== 'string' || !body.model) return refuse('you must provide a model parameter', null);
  const input = body.input;
  if (input === undefined) return refuse("Missing required parameter: 'input'.", 'input', 'missing_required_parameter');
  const texts = typeof input === 'string' ? [input] : input;
  if (!Array.isArray(texts) || !texts.length || texts.some((t) => typeof t !== 'string' || !t.length))
    return refuse(
      "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.",
      null,
    );
  if (texts.length > EMBEDDING_INPUTS_MAX)
    return refuse(
      `Invalid 'input': array too long. Expected an array with maximum length ${EMBEDDING_INPUTS_MAX}, but got an array with length ${texts.length} instead.`,
      'input',
      'array_above_max_length',
    );
  if (body.encoding_format !== undefined && !['float', 'base64'].includes(body.encoding_format))
    return refuse(
      `Invalid value: '${body.encoding_format}'. Supported values are: 'float' and 'base64'.`,
      'encoding_format',
      'invalid_value',
    );
  for (const t of texts as string[]) {
    const n = tokensOf(t);
    if (n > model.contextTokens)
      return refuse(
        `This model's maximum context length is ${model.contextTokens} tokens, however you requested ${n} tokens (${n} in your prompt; 0 for the completion). Please reduce your prompt; or completion length.`,
        null,
      );
    if (model.refuses?.(t)) return refuse('The input could not be processed.', 'input', 'invalid_input');
  }
  const total = (texts as string[]).reduce((n, t) => n + tokensOf(t), 0);
  if (total > EMBEDDING_REQUEST_TOKENS)
    return refuse(
      `Requested ${total} tokens, max ${EMBEDDING_REQUEST_TOKENS} tokens per request`,
      null,
      'max_tokens_per_request',
    );
  return null;
}

const DIM = 512;
const SYNONYMS: Record<string, string> = { automobile: 'car', vehicle: 'car', kitten: 'cat', feline: 'cat' };

function hashWord(w: string): number {
  let h = 2166136261;
  for (const ch of w) h = Math.imul(h ^ ch.codePointAt(0)!, 16777619);
  return Math.abs(h) % DIM;
}

function fakeEmbedding(text: string): number[] {
  const v = new Array<number>(DIM).fill(0);
  for (const raw of text.toLowerCase().match(/[\p{L}\p{N}_]+/gu) ?? []) v[hashWord(SYNONYMS[raw] ?? raw)]! += 1;
  return v;
}

async function readBody(req: IncomingMessage): Promise<any> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString();
  return text ? JSON.parse(text) : {};
}

/** A 400 in OpenAI's error shape: what a real endpoint answers a request it refuses. */
export interface Refusal {
  message: string;
  type: 'invalid_request_error';
  param: string | null;
  code: string | null;
}

const refuse = (message: string, param: string | null, code: string | null = null): Refusal => ({
  message,
  type: 'invalid_request_error',
  param,
  code,
});
const ROLES = ['system', 'developer', 'user', 'assistant', 'tool'];
const TOOL_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
/** OpenAI's limit on the functions of one request. */
const MAX_TOOLS = 128;
const SCHEMA_TYPES = new Set(['object', 'string', 'number', 'integer', 'boolean', 'array', 'null']);
const isObject = (v: unknown): v is Record<string, any> => typeof v === 'object' && v !== null && !Array.isArray(v);
const filled = (content: unknown) =>
  typeof content === 'string' ? content.length > 0 : Array.isArray(content) && content.length > 0;

/** What is wrong with a JSON schema, as far as function parameters go (null: nothing). */
function schemaProblem(s: unknown, at: string): string | null {
  if (!isObject(s)) return `${at} is not a JSON schema object`;
  const types = s.type === undefined ? [] : Array.isArray(s.type) ? s.type : [s.type];
  for (const t of types) if (!SCHEMA_TYPES.has(t)) return `${at}.type ${JSON.stringify(t)} is not a JSON schema type`;
  if (s.properties !== undefined) {
    if (!isObject(s.properties)) return `${at}.properties must be an object`;
    for (const [k, v] of Object.entries(s.properties)) {
      const p = schemaProblem(v, `${at}.properties.${k}`);
      if (p) return p;
    }
  }
  if (
    s.required !== undefined &&
    (!Array.isArray(s.required) || s.required.some((r: unknown) => typeof r !== 'string'))
  )
    return `${at}.required must be an array of strings`;
  if (s.items !== undefined) return schemaProblem(s.items, `${at}.items`);
  if (s.enum !== undefined && (!Array.isArray(s.enum) || !s.enum.length)) return `${at}.enum must be a non-empty array`;
  return null;
}

/**
 * Why a real OpenAI-compatible endpoint would refuse this chat request (null: it would not).
 * At least as strict as the real ones, so no test passes on a request a real endpoint refuses:
 * every assistant `tool_calls` must be answered, each id once, by tool messages directly after
 * it and before any other message; a tool message must answer a call of the assistant message
 * it follows; roles, contents and tool definitions must be well-formed.
 */
export function refusal(body: any): Refusal | null {
  if (!isObject(body)) return refuse('We could not parse the JSON body of your request.', null);
  if (typeof body.model !== 'string' || !body.model)
    return refuse("Missing required parameter: 'model'.", 'model', 'missing_required_parameter');
  if (!Array.isArray(body.messages))
    return refuse("Missing required parameter: 'messages'.", 'messages', 'missing_required_parameter');
  if (!body.messages.length)
    return refuse(
      "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
      'messages',
      'empty_array',
    );
  if (body.tools !== undefined) {
    if (!Array.isArray(body.tools) || !body.tools.length)
      return refuse("Invalid 'tools': empty array. Expected an array with minimum length 1.", 'tools', 'empty_array');
    if (body.tools.length > MAX_TOOLS)
      return refuse(
        `Invalid 'tools': array too long. Expected an array with maximum length ${MAX_TOOLS}, but got an array with length ${body.tools.length} instead.`,
        'tools',
        'array_above_max_length',
      );
    const names = new Set<string>();
    for (const [i, tool] of body.tools.entries()) {
      const fn = isObject(tool) ? tool.function : undefined;
      if (!isObject(tool) || tool.type !== 'function' || !isObject(fn))
        return refuse(
          `Invalid 'tools[${i}]': expected {type: 'function', function: {...}}.`,
          `tools[${i}]`,
          'invalid_type',
        );
      if (typeof fn.name !== 'string' || !TOOL_NAME.test(fn.name)) {
        return refuse(
          `Invalid 'tools[${i}].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.`,
          `tools[${i}].function.name`,
          'invalid_value',
        );
      }
      if (names.has(fn.name))
        return refuse(`Invalid 'tools': duplicate function name '${fn.name}'.`, 'tools', 'invalid_value');
      names.add(fn.name);
      if (fn.description !== undefined && typeof fn.description !== 'string')
        return refuse(
          `Invalid type for 'tools[${i}].function.description'.`,
          `tools[${i}].function.description`,
          'invalid_type',
        );
      if (fn.parameters !== undefined) {
        const problem =
          isObject(fn.parameters) && fn.parameters.type !== 'object'
            ? `schema must be a JSON Schema of 'type: "object"'`
            : schemaProblem(fn.parameters, 'parameters');
        if (problem)
          return refuse(
            `Invalid schema for function '${fn.name}': ${problem}.`,
            `tools[${i}].function.parameters`,
            'invalid_function_parameters',
          );
      }
    }
  }
  const called = new Set<string>();
  /** Ids of the last assistant message's calls still waiting for their tool message. */
  const open = new Set<string>();
  for (const [i, m] of body.messages.entries()) {
    if (!isObject(m))
      return refuse(`Invalid type for 'messages[${i}]': expected an object.`, `messages[${i}]`, 'invalid_type');
    if (!ROLES.includes(m.role)) {
      return refuse(
        `Invalid value: '${m.role}'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'.`,
        `messages[${i}].role`,
        'invalid_value',
      );
    }
    if (m.role === 'tool') {
      if (typeof m.tool_call_id !== 'string' || !m.tool_call_id)
        return refuse(
          `Missing required parameter: 'messages[${i}].tool_call_id'.`,
          `messages[${i}].tool_call_id`,
          'missing_required_parameter',
        );
      if (!open.delete(m.tool_call_id)) {
        return refuse(
          "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
          `messages.[${i}].role`,
        );
      }
      if (!filled(m.content))
        return refuse(
          `Invalid 'messages[${i}].content': a tool message needs content.`,
          `messages[${i}].content`,
          'invalid_value',
        );
      continue;
    }
    if (open.size) {
      return refuse(
        `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${[...open].join(', ')}`,
        `messages.[${i}].role`,
      );
    }
    if (m.role !== 'assistant') {
      if (!filled(m.content))
        return refuse(
          `Invalid value for 'messages[${i}].content': expected a non-empty string or array of content parts.`,
          `messages[${i}].content`,
          'invalid_value',
        );
      continue;
    }
    if (m.tool_calls === undefined || m.tool_calls === null) {
      if (!filled(m.content))
        return refuse(
          `Invalid value for 'messages[${i}].content': expected a string, got ${JSON.stringify(m.content ?? null)}.`,
          `messages[${i}].content`,
          'invalid_value',
        );
      continue;
    }
    if (!Array.isArray(m.tool_calls) || !m.tool_calls.length)
      return refuse(
        `Invalid 'messages[${i}].tool_calls': empty array. Expected an array with minimum length 1.`,
        `messages[${i}].tool_calls`,
        'empty_array',
      );
    if (m.content !== null && m.content !== undefined && typeof m.content !== 'string' && !Array.isArray(m.content)) {
      return refuse(`Invalid type for 'messages[${i}].content'.`, `messages[${i}].content`, 'invalid_type');
    }
    for (const [j, c] of m.tool_calls.entries()) {
      const at = `messages[${i}].tool_calls[${j}]`;
      if (
        !isObject(c) ||
        typeof c.id !== 'string' ||
        !c.id ||
        c.type !== 'function' ||
        !isObject(c.function) ||
        typeof c.function.name !== 'string' ||
        typeof c.function.arguments !== 'string'
      ) {
        return refuse(
          `Invalid '${at}': expected {id, type: 'function', function: {name, arguments: string}}.`,
          at,
          'invalid_value',
        );
      }
      if (called.has(c.id))
        return refuse(`Invalid '${at}.id': duplicate tool call id '${c.id}'.`, `${at}.id`, 'invalid_value');
      called.add(c.id);
      open.add(c.id);
    }
  }
  if (open.size) {
    return refuse(
      `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${[...open].join(', ')}`,
      `messages.[${body.messages.length}].role`,
    );
  }
  return null;
}

function chatChunks(reply: Reply, model: string, includeUsage: boolean): string[] {
  const id = `chatcmpl-${Math.random().toString(36).slice(2)}`;
  const base = { id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model };
  const frame = (delta: object, finish: string | null = null) =>
    `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] })}\n\n`;
  const out = [frame({ role: 'assistant', content: '' })];
  const text = reply.content ?? '';
  // Split the text into a few pieces so clients really have to assemble deltas.
  for (let i = 0; i < text.length; i += Math.max(1, Math.ceil(text.length / 4)))
    out.push(frame({ content: text.slice(i, i + Math.ceil(text.length / 4)) }));
  (reply.tool_calls ?? []).forEach((call, index) => {
    const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments);
    const half = Math.ceil(args.length / 2);
    out.push(
      frame({
        tool_calls: [
          {
            index,
            id: call.id ?? `call_${index}_${id.slice(-6)}`,
            type: 'function',
            function: { name: call.name, arguments: args.slice(0, half) },
          },
        ],
      }),
    );
    out.push(frame({ tool_calls: [{ index, function: { arguments: args.slice(half) } }] }));
  });
  out.push(frame({}, reply.tool_calls?.length ? 'tool_calls' : 'stop'));
  if (includeUsage) {
    const usage = reply.usage ?? { prompt_tokens: 100, completion_tokens: Math.max(1, Math.ceil(text.length / 4)) };
    out.push(
      `data: ${JSON.stringify({ ...base, choices: [], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } })}\n\n`,
    );
  }
  out.push('data: [DONE]\n\n');
  return out;
}

export async function startFakeOpenAI(): Promise<FakeOpenAI> {
  const requests: FakeOpenAI['requests'] = [];
  const queue: Reply[] = [];
  const refusals: Refusal[] = [];
  const embeddings: EmbeddingsModel = { contextTokens: EMBEDDING_CONTEXT };
  const arrivals = new EventEmitter();
  let closedHangs = 0;
  const server: Server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const body = await readBody(req);
    requests.push({ path: req.url ?? '', body });
    const send = (status: number, payload: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(payload));
    };
    if (req.method === 'POST' && req.url === '/v1/chat/completions') {
      arrivals.emit('chat');
      // Refused before a scripted answer is used, as a real endpoint refuses it before thinking.
      const refused = refusal(body);
      if (refused) {
        refusals.push(refused);
        return send(400, { error: refused });
      }
      const reply = queue.shift();
      if (!reply)
        return send(500, { error: { message: 'the fake model has no scripted answer left', type: 'server_error' } });
      if (reply.hang) {
        req.socket.on('close', () => {
          res.destroy();
          closedHangs++;
          arrivals.emit('hang-closed');
        });
        return;
      }
      if (reply.until) await reply.until;
      if (reply.status)
        return send(reply.status, { error: { type: 'invalid_request_error', code: null, ...reply.error } });
      const usage = reply.usage ?? {
        prompt_tokens: 100,
        completion_tokens: Math.max(1, Math.ceil((reply.content ?? '').length / 4)),
      };
      if (body.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
        for (const chunk of chatChunks(reply, body.model, Boolean(body.stream_options?.include_usage)))
          res.write(chunk);
        return res.end();
      }
      return send(200, {
        id: 'chatcmpl-fake',
        object: 'chat.completion',
        created: Math.floor(Date.now() / 1000),
        model: body.model,
        choices: [
          {
            index: 0,
            finish_reason: reply.tool_calls?.length ? 'tool_calls' : 'stop',
            message: {
              role: 'assistant',
              content: reply.content ?? null,
              tool_calls: reply.tool_calls?.map((c, i) => ({
                id: c.id ?? `call_${i}_${Math.random().toString(36).slice(2, 8)}`,
                type: 'function',
                function: {
                  name: c.name,
                  arguments: typeof c.arguments === 'string' ? c.arguments : JSON.stringify(c.arguments),
                },
              })),
            },
          },
        ],
        usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens },
      });
    }
    if (req.method === 'POST' && req.url === '/v1/embeddings') {
      const refused = embeddingsRefusal(body, embeddings);
      if (refused) {
        refusals.push(refused);
        return send(400, { error: refused });
      }
      const inputs: string[] = Array.isArray(body.input) ? body.input : [body.input];
      return send(200, {
        object: 'list',
        model: body.model,
        // The SDK asks for base64-encoded float32 unless told otherwise, as the real API allows.
        data: inputs.map((t, index) => {
          const v = embeddings.nan?.(t) ? fakeEmbedding(t).map((x, i) => (i === 0 ? Number.NaN : x)) : fakeEmbedding(t);
          const embedding =
            body.encoding_format === 'base64' ? Buffer.from(new Float32Array(v).buffer).toString('base64') : v;
          return { object: 'embedding', index, embedding };
        }),
        usage: { prompt_tokens: inputs.join(' ').length, total_tokens: inputs.join(' ').length },
      });
    }
    send(404, { error: { message: `no fake for ${req.method} ${req.url}`, type: 'invalid_request_error' } });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    refusals,
    embeddings,
    chats: () => requests.filter((r) => r.path === '/v1/chat/completions').map((r) => r.body),
    script: (...replies) => queue.push(...replies),
    pending: () => queue.length,
    chatRequests: (n) =>
      new Promise<void>((resolve) => {
        const check = () => {
          if (requests.filter((r) => r.path === '/v1/chat/completions').length >= n) {
            arrivals.off('chat', check);
            resolve();
          }
        };
        arrivals.on('chat', check);
        check();
      }),
    hangsClosed: (n) =>
      new Promise<void>((resolve) => {
        const check = () => {
          if (closedHangs >= n) {
            arrivals.off('hang-closed', check);
            resolve();
          }
        };
        arrivals.on('hang-closed', check);
        check();
      }),
    // A refusal nobody looked at fails the test file: a run that failed on it may have passed a test.
    close: () =>
      new Promise((resolve, reject) => {
        server.closeAllConnections();
        server.close(() =>
          refusals.length
            ? reject(
                new Error(
                  `the fake refused ${refusals.length} request(s) as a real endpoint would: ${JSON.stringify(refusals)}`,
                ),
              )
            : resolve(),
        );
      }),
  };
}
