import type { EventData } from './views.ts';
/** A small client for the Kiln HTTP API (the CLI talks to nothing else). */
export class KilnClient {
  constructor(
    readonly baseUrl: string,
    private readonly key: string,
  ) {}

  async call<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    const res = await fetch(`${this.baseUrl}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${this.key}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    const json = text ? JSON.parse(text) : {};
    if (!res.ok) throw new Error(`${json.error?.code ?? res.status}: ${json.error?.message ?? text}`);
    return json as T;
  }

  /** Follows a run's SSE stream, yielding events until the run ends or `signal` aborts. */
  async *events(
    runId: string,
    signal: AbortSignal,
    after = 0,
  ): AsyncGenerator<{ id: number; event: string; data: EventData }> {
    const res = await fetch(`${this.baseUrl}/v1/runs/${runId}/events?after=${after}`, {
      headers: { authorization: `Bearer ${this.key}` },
      signal,
    });
    if (!res.ok || !res.body) throw new Error(`events: HTTP ${res.status}`);
    const decoder = new TextDecoder();
    let buf = '';
    for await (const chunk of res.body) {
      buf += decoder.decode(chunk as Uint8Array, { stream: true });
      let end: number;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const frame = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const fields = Object.fromEntries(
          frame.split('\n').map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 2)]),
        );
        if (fields.event && fields.event !== 'ping')
          yield { id: Number(fields.id), event: fields.event, data: JSON.parse(fields.data ?? '{}') };
      }
    }
  }

  /** A workspace by id or by name. */
  async workspace(idOrName: string): Promise<{ id: string; name: string }> {
    if (/^ws_/.test(idOrName)) return this.call('GET', `/v1/workspaces/${idOrName}`);
    const list = await this.call<{ data: { id: string; name: string }[] }>('GET', '/v1/workspaces?limit=100');
    const ws = list.data.find((w) => w.name === idOrName);
    if (!ws) throw new Error(`no workspace named ${idOrName}`);
    return ws;
  }
}
