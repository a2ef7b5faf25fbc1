import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/**
 * A scripted OpenAI-compatible HTTP server (the one fake the rules allow): the real `openai`
 * SDK talks to it over the real wire format. Embeddings are a deterministic bag of words in
 * 512 dimensions, with a small synonym table so that similarity can be meaning-like in tests.
 */
export interface FakeOpenAI {
  url: string;
  requests: { path: string; body: any }[];
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

export async function startFakeOpenAI(): Promise<FakeOpenAI> {
  const requests: FakeOpenAI['requests'] = [];
  const server: Server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const body = await readBody(req);
    requests.push({ path: req.url ?? '', body });
    const send = (status: number, payload: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(payload));
    };
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
  return { url: `http://127.0.0.1:${port}/v1`, requests, close: () => new Promise((r) => server.close(() => r())) };
}
