import { innerCallEnv } from '../../http/rate-limit.ts';

/** How the MCP tools reach the API: the app's own fetch, in-process. */
export type AppFetch = (req: Request, env: unknown) => Response | Promise<Response>;

/** A failed API call as a tool reports it: the envelope's code first, then its message. */
export class ToolFailure extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export interface WorkspaceRef {
  id: string;
  name: string;
}

/** A list answer of the API. */
export interface Page<T> {
  data: T[];
  has_more: boolean;
  last_id: string | null;
}

const ID = /^[a-z]+_[0-9a-z]+$/;
/** Pages of the team's workspaces read to find one by name (100 each). */
const NAME_PAGES = 20;

/**
 * The caller's API, for one MCP request: every call is a request to the app's own /v1 routes with
 * the caller's key, so authentication, roles, tenancy, validation and audit are the API's own.
 * The calls share the MCP request's id (their audit rows and log lines name it) and are not
 * rate-limited again: the MCP request was.
 */
export class KilnApi {
  constructor(
    private readonly fetch: AppFetch,
    private readonly authorization: string,
    private readonly requestId: string,
  ) {}

  private async request(method: string, path: string, body?: { json: unknown } | { raw: string }): Promise<Response> {
    const headers: Record<string, string> = { authorization: this.authorization, 'x-request-id': this.requestId };
    let payload: string | undefined;
    if (body && 'json' in body) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body.json);
    } else if (body) {
      headers['content-type'] = 'application/octet-stream';
      payload = body.raw;
    }
    return this.fetch(new Request(`http://kiln.internal${path}`, { method, headers, body: payload }), innerCallEnv());
  }

  /** The JSON answer of a call; an error envelope throws a `ToolFailure` naming its code. */
  async call<T>(method: string, path: string, body?: { json: unknown } | { raw: string }): Promise<T> {
    const res = await this.request(method, path, body);
    const text = await res.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      // A non-JSON answer is reported below by its status.
    }
    if (res.status >= 400) {
      const err = (parsed as { error?: { code?: string; message?: string } } | null)?.error;
      throw new ToolFailure(err?.code ?? 'internal', err?.message ?? `the API answered ${res.status}`);
    }
    return parsed as T;
  }

  /** One page of the team's workspaces, oldest first. */
  private page(after: string | null): Promise<Page<WorkspaceRef>> {
    const q = new URLSearchParams({ limit: '100', order: 'asc', ...(after ? { after } : {}) });
    return this.call<Page<WorkspaceRef>>('GET', `/v1/workspaces?${q}`);
  }

  /** A workspace of the caller's team by id or by name; another team's is not found. */
  async workspace(ref: string): Promise<WorkspaceRef> {
    if (ID.test(ref)) {
      try {
        const ws = await this.call<WorkspaceRef>('GET', `/v1/workspaces/${ref}`);
        return { id: ws.id, name: ws.name };
      } catch (err) {
        if (!(err instanceof ToolFailure) || err.code !== 'not_found') throw err;
        // Not an id of this team: it may still be a name that looks like one.
      }
    }
    let after: string | null = null;
    for (let page = 0; page < NAME_PAGES; page++) {
      const list = await this.page(after);
      const found = list.data.find((w) => w.name === ref);
      if (found) return { id: found.id, name: found.name };
      if (!list.has_more) break;
      after = list.last_id;
    }
    throw new ToolFailure('not_found', `no workspace ${JSON.stringify(ref)} (by id or name) in this team`);
  }

  /** The team's workspaces, up to `max`. */
  async workspaces(max: number): Promise<WorkspaceRef[]> {
    const out: WorkspaceRef[] = [];
    let after: string | null = null;
    while (out.length < max) {
      const list = await this.page(after);
      out.push(...list.data.map((w) => ({ id: w.id, name: w.name })));
      if (!list.has_more) break;
      after = list.last_id;
    }
    return out.slice(0, max);
  }
}
