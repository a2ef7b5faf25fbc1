import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/**
 * A scripted OpenAI-compatible HTTP server (the one fake the rules allow): the real `openai`
 * SDK talks to it over the real wire format. Embeddings are a deterministic bag of words in
 * 512 dimensions, with a small synonym table so that similarity can be meaning-like in tests.
 */
/** One scripted model answer. */
export interface Reply {
  content?: string;
  tool_calls?: { name: string; arguments: Record<string, unknown> | string }[];
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
  /** Queues answers for the next chat completions, in order. */
  script(...replies: Reply[]): void;
  /** Answers still queued. */
  pending(): number;
  /** Resolves once `n` chat requests have arrived in total. */
  chatRequests(n: number): Promise<void>;
  /** Resolves once `n` held (`hang`) requests have been given up by their client in total. */
  hangsClosed(n: number): Promise<void>;
  close(): Promise<void>;
}

const DIM = 512;
const SYNONYMS: Record<string, string> = { automobile: 'car', vehicle: 'car', kitten: 'cat', feline: 'cat' };

function hashWord(w: string): number {
  let h = 2166136261;
  for (const ch of w) h = Math.imul(h ^ ch.codePointAt(0)!, 16777619);
  return Math.abs(h) % DIM;
}

export function fakeEmbedding(text: string): number[] {
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

function chatChunks(reply: Reply, model: string, includeUsage: boolean): string[] {
  const id = `chatcmpl-${Math.random().toString(36).slice(2)}`;
  const base = { id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model };
  const frame = (delta: object, finish: string | null = null) =>
    `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] })}\n\n`;
  const out = [frame({ role: 'assistant', content: '' })];
  const text = reply.content ?? '';
  // Split the text into a few pieces so clients really have to assemble deltas.
  for (let i = 0; i < text.length; i += Math.max(1, Math.ceil(text.length / 4))) out.push(frame({ content: text.slice(i, i + Math.ceil(text.length / 4)) }));
  (reply.tool_calls ?? []).forEach((call, index) => {
    const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments);
    const half = Math.ceil(args.length / 2);
    out.push(frame({ tool_calls: [{ index, id: `call_${index}_${id.slice(-6)}`, type: 'function', function: { name: call.name, arguments: args.slice(0, half) } }] }));
    out.push(frame({ tool_calls: [{ index, function: { arguments: args.slice(half) } }] }));
  });
  out.push(frame({}, reply.tool_calls?.length ? 'tool_calls' : 'stop'));
  if (includeUsage) {
    const usage = reply.usage ?? { prompt_tokens: 100, completion_tokens: Math.max(1, Math.ceil(text.length / 4)) };
    out.push(`data: ${JSON.stringify({ ...base, choices: [], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } })}\n\n`);
  }
  out.push('data: [DONE]\n\n');
  return out;
}

export async function startFakeOpenAI(): Promise<FakeOpenAI> {
  const requests: FakeOpenAI['requests'] = [];
  const queue: Reply[] = [];
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
      const reply = queue.shift();
      if (!reply) return send(500, { error: { message: 'the fake model has no scripted answer left', type: 'server_error' } });
      if (reply.hang) {
        req.socket.on('close', () => {
          res.destroy();
          closedHangs++;
          arrivals.emit('hang-closed');
        });
        return;
      }
      if (reply.until) await reply.until;
      if (reply.status) return send(reply.status, { error: { type: 'invalid_request_error', code: null, ...reply.error } });
      const usage = reply.usage ?? { prompt_tokens: 100, completion_tokens: Math.max(1, Math.ceil((reply.content ?? '').length / 4)) };
      if (body.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
        for (const chunk of chatChunks(reply, body.model, Boolean(body.stream_options?.include_usage))) res.write(chunk);
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
              tool_calls: reply.tool_calls?.map((c, i) => ({ id: `call_${i}`, type: 'function', function: { name: c.name, arguments: typeof c.arguments === 'string' ? c.arguments : JSON.stringify(c.arguments) } })),
            },
          },
        ],
        usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens },
      });
    }
    if (req.method === 'POST' && req.url === '/v1/embeddings') {
      const inputs: string[] = Array.isArray(body.input) ? body.input : [body.input];
      return send(200, {
        object: 'list',
        model: body.model,
        // The SDK asks for base64-encoded float32 unless told otherwise, as the real API allows.
        data: inputs.map((t, index) => {
          const v = fakeEmbedding(t);
          const embedding = body.encoding_format === 'base64' ? Buffer.from(new Float32Array(v).buffer).toString('base64') : v;
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
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
