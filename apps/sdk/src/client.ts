import createClient, { type Client } from 'openapi-fetch';
import { errorFrom, isAbort, KilnConnectionError } from './errors.ts';
import type { components, operations, paths } from './openapi.ts';
import { paginate } from './pagination.ts';
import { streamRun, type RunEvent, type StreamOptions } from './stream.ts';

type Schemas = components['schemas'];
export type Workspace = Schemas['Workspace'];
export type WorkspaceSettings = Schemas['WorkspaceSettings'];
export type Session = Schemas['Session'];
export type ExecResult = Schemas['ExecResult'];
export type Message = Schemas['Message'];
export type Run = Schemas['Run'];
export type Approval = Schemas['Approval'];
export type Commit = Schemas['Commit'];
export type CommitOutcome = Schemas['CommitOutcome'];
export type Evolution = Schemas['Evolution'];
export type Template = Schemas['Template'];
export type WorkspaceSecret = Schemas['WorkspaceSecret'];
export type AuditEvent = Schemas['AuditEvent'];
export type Team = Schemas['Team'];

/** An operation's JSON request body, query and path parameters, by operationId. */
type Body<O extends keyof operations> = operations[O] extends {
  requestBody?: { content: { 'application/json': infer B } };
}
  ? B
  : never;
type Query<O extends keyof operations> = NonNullable<operations[O]['parameters']['query']>;

/** The file or directory `files.read`/`files.list` answer with. */
export type FileEntry = operations['getWorkspaceFiles']['responses'][200]['content']['application/json'];
export type Directory = Extract<FileEntry, { type: 'dir' }>;
export type File = Extract<FileEntry, { type: 'file' }>;
export type ApprovalDecision = 'approve' | 'deny' | 'approve_session';

export interface KilnOptions {
  /** The server, e.g. http://127.0.0.1:7700 (no trailing /v1). */
  baseUrl: string;
  /** A Kiln API key (team or org admin), sent as `Authorization: Bearer …`. */
  apiKey: string;
  /** Another fetch (a proxy's, a test's); default the global one. */
  fetch?: (input: Request) => Promise<Response>;
  /** Headers sent with every request. */
  headers?: Record<string, string>;
}

type Answer<T> = { data?: T; error?: unknown; response: Response };

/** The answer's data, or the typed error of an error answer. */
async function ok<T>(p: Promise<Answer<T>>): Promise<T> {
  const r = await p;
  if (r.error !== undefined || !r.response.ok) throw errorFrom(r.response, r.error);
  return r.data as T;
}

/**
 * A client for a Kiln server: `raw` is openapi-fetch's typed client for every route of the
 * OpenAPI document (`kiln.raw.GET('/v1/runs/{run}', { params: { path: { run } } })`), and the
 * resource helpers below wrap the common ones, answering with the data and throwing a
 * `KilnError` subclass on an error answer (`KilnConnectionError` when there was no answer).
 */
export function createKiln(options: KilnOptions) {
  const baseUrl = options.baseUrl.replace(/\/+$/, '');
  const raw: Client<paths> = createClient<paths>({
    baseUrl,
    fetch: options.fetch,
    headers: { ...options.headers, authorization: `Bearer ${options.apiKey}` },
  });
  raw.use({
    // fetch threw: no answer at all. An abort stays the caller's AbortError.
    onError: ({ error, request }) => {
      if (isAbort(error)) return error as Error;
      const e = error as Error & { cause?: Error };
      const reason = e?.cause?.message ?? e?.message ?? String(error);
      return new KilnConnectionError(`no answer from ${request.method} ${request.url}: ${reason}`, { cause: error });
    },
  });

  const ws = (workspace: string) => ({ path: { workspace } });

  const workspaces = {
    list: (query?: Query<'listWorkspaces'>) => ok(raw.GET('/v1/workspaces', { params: { query } })),
    /** Every workspace, page after page. */
    all: (query?: Query<'listWorkspaces'>) => paginate((q?: Query<'listWorkspaces'>) => workspaces.list(q), query),
    get: (workspace: string) => ok(raw.GET('/v1/workspaces/{workspace}', { params: ws(workspace) })),
    /** The team's workspace with this name (a NotFoundError if there is none). */
    async byName(name: string): Promise<Workspace> {
      for await (const w of workspaces.all({ limit: 100 })) if (w.name === name) return w;
      throw errorFrom(new Response(null, { status: 404 }), {
        error: { type: 'not_found_error', code: 'not_found', message: `no workspace named ${name}` },
      });
    },
    /** By id (`ws_…`) or by name. */
    resolve: (idOrName: string) =>
      /^ws_[0-9a-z]+$/.test(idOrName) ? workspaces.get(idOrName) : workspaces.byName(idOrName),
    create: (body: Body<'createWorkspace'>) => ok(raw.POST('/v1/workspaces', { body })),
    update: (workspace: string, body: Body<'updateWorkspace'>) =>
      ok(raw.PATCH('/v1/workspaces/{workspace}', { params: ws(workspace), body })),
    delete: (workspace: string) => ok(raw.DELETE('/v1/workspaces/{workspace}', { params: ws(workspace) })),
  };

  const files = {
    /** A directory's entries (the root without `path`). */
    async list(workspace: string, path?: string): Promise<Directory['entries']> {
      const d = await ok(
        raw.GET('/v1/workspaces/{workspace}/files', { params: { ...ws(workspace), query: { path } } }),
      );
      if (d.type !== 'dir') throw new TypeError(`${path} is a file, not a directory`);
      return d.entries;
    },
    /** A file: `content` is UTF-8 text, or base64 when `encoding` says so (binary files). */
    async read(workspace: string, path: string): Promise<File> {
      const f = await ok(
        raw.GET('/v1/workspaces/{workspace}/files', { params: { ...ws(workspace), query: { path } } }),
      );
      if (f.type !== 'file') throw new TypeError(`${path} is a directory, not a file`);
      return f;
    },
    /** A file's bytes, as stored. */
    async bytes(workspace: string, path: string): Promise<Uint8Array> {
      const b = await ok(
        raw.GET('/v1/workspaces/{workspace}/files', {
          params: { ...ws(workspace), query: { path, raw: 'true' } },
          parseAs: 'arrayBuffer',
        }),
      );
      return new Uint8Array(b);
    },
    /** Writes (and commits, as Kiln-Author: user) a file; `commit` is null when nothing changed. */
    write: (workspace: string, path: string, content: string | Uint8Array) =>
      ok(
        raw.PUT('/v1/workspaces/{workspace}/files', {
          params: { ...ws(workspace), query: { path } },
          body: content as string,
          bodySerializer: (b: string | Uint8Array) => b,
          headers: { 'content-type': 'application/octet-stream' },
        }),
      ),
    delete: (workspace: string, path: string) =>
      ok(raw.DELETE('/v1/workspaces/{workspace}/files', { params: { ...ws(workspace), query: { path } } })),
  };

  const commits = {
    list: (workspace: string, query?: Query<'listCommits'>) =>
      ok(raw.GET('/v1/workspaces/{workspace}/commits', { params: { ...ws(workspace), query } })),
    all: (workspace: string, query?: Query<'listCommits'>) =>
      paginate((q?: Query<'listCommits'>) => commits.list(workspace, q), query),
    get: (workspace: string, sha: string) =>
      ok(raw.GET('/v1/workspaces/{workspace}/commits/{sha}', { params: { path: { workspace, sha } } })),
    /** Reverts a commit with a new one. */
    revert: (workspace: string, sha: string) =>
      ok(raw.POST('/v1/workspaces/{workspace}/commits/{sha}/revert', { params: { path: { workspace, sha } } })),
  };

  const sess = (session: string) => ({ path: { session } });
  const sessions = {
    create: (workspace: string, body: Body<'createSession'> = {}) =>
      ok(raw.POST('/v1/workspaces/{workspace}/sessions', { params: ws(workspace), body })),
    list: (workspace: string, query?: Query<'listSessions'>) =>
      ok(raw.GET('/v1/workspaces/{workspace}/sessions', { params: { ...ws(workspace), query } })),
    all: (workspace: string, query?: Query<'listSessions'>) =>
      paginate((q?: Query<'listSessions'>) => sessions.list(workspace, q), query),
    get: (session: string) => ok(raw.GET('/v1/sessions/{session}', { params: sess(session) })),
    /** Ends the session and removes its sandbox. */
    end: (session: string) => ok(raw.DELETE('/v1/sessions/{session}', { params: sess(session) })),
    /** Runs Python in the session's sandbox (variables persist between calls); an exception is in `error`. */
    exec: (session: string, code: string, opts: { timeout_s?: number; signal?: AbortSignal } = {}) =>
      ok(
        raw.POST('/v1/sessions/{session}/exec', {
          params: sess(session),
          body: { code, ...(opts.timeout_s === undefined ? {} : { timeout_s: opts.timeout_s }) },
          signal: opts.signal,
        }),
      ) as Promise<ExecResult>,
    keepalive: (session: string) => ok(raw.POST('/v1/sessions/{session}/keepalive', { params: sess(session) })),
  };

  const messages = {
    /** Posts a user message: the answer has the run it started (follow it with `runs.stream`). */
    send: (session: string, content: string) =>
      ok(raw.POST('/v1/sessions/{session}/messages', { params: sess(session), body: { content } })) as Promise<{
        message: Message;
        run: Run;
      }>,
    list: (session: string, query?: Query<'listMessages'>) =>
      ok(raw.GET('/v1/sessions/{session}/messages', { params: { ...sess(session), query } })),
  };

  const runs = {
    list: (query?: Query<'listRuns'>) => ok(raw.GET('/v1/runs', { params: { query } })),
    all: (query?: Query<'listRuns'>) => paginate((q?: Query<'listRuns'>) => runs.list(q), query),
    get: (run: string) => ok(raw.GET('/v1/runs/{run}', { params: { path: { run } } })),
    cancel: (run: string) => ok(raw.POST('/v1/runs/{run}/cancel', { params: { path: { run } } })),
    /** The run's stored events after `after`, as a list (no waiting). */
    async events(run: string, after = 0): Promise<RunEvent[]> {
      const r = await ok(
        raw.GET('/v1/runs/{run}/events', {
          params: { path: { run }, query: { after } },
          headers: { accept: 'application/json' },
        }),
      );
      return (r as { data: RunEvent[] }).data;
    },
    /**
     * The run's events as they happen (SSE), from `after`, until the terminal event
     * (run.completed, run.failed, run.cancelled). A broken connection is resumed from the last
     * event received (Last-Event-ID), so no event is lost or repeated; `signal` stops it.
     */
    stream: (run: string, opts: StreamOptions = {}) =>
      streamRun(
        (after, signal) =>
          raw.GET('/v1/runs/{run}/events', {
            params: { path: { run }, query: { after } },
            headers: { accept: 'text/event-stream', ...(after > 0 ? { 'last-event-id': String(after) } : {}) },
            parseAs: 'stream',
            signal,
          }),
        opts,
      ),
  };

  const approvals = {
    list: (query?: Query<'listApprovals'>) => ok(raw.GET('/v1/approvals', { params: { query } })),
    all: (query?: Query<'listApprovals'>) => paginate((q?: Query<'listApprovals'>) => approvals.list(q), query),
    /**
     * Decides a pending approval: `approve`, `deny` (`reject` is the same), or
     * `approve_session` (approve, and stop asking in this session).
     */
    decide: (approval: string, decision: ApprovalDecision | 'reject', reason?: string) =>
      ok(
        raw.POST('/v1/approvals/{approval}', {
          params: { path: { approval } },
          body: { decision: decision === 'reject' ? 'deny' : decision, ...(reason === undefined ? {} : { reason }) },
        }),
      ),
  };

  const evo = (workspace: string, evolution: string) => ({ path: { workspace, evolution } });
  const evolutions = {
    list: (workspace: string, query?: Query<'listEvolutions'>) =>
      ok(raw.GET('/v1/workspaces/{workspace}/evolutions', { params: { ...ws(workspace), query } })),
    all: (workspace: string, query?: Query<'listEvolutions'>) =>
      paginate((q?: Query<'listEvolutions'>) => evolutions.list(workspace, q), query),
    get: (workspace: string, evolution: string) =>
      ok(raw.GET('/v1/workspaces/{workspace}/evolutions/{evolution}', { params: evo(workspace, evolution) })),
    /** Queues the post-session review now (a job; follow it with `get`). */
    review: (workspace: string, body: Body<'reviewWorkspace'> = {}) =>
      ok(raw.POST('/v1/workspaces/{workspace}/review', { params: ws(workspace), body })),
    /** Queues a dream (memory consolidation) now. */
    dream: (workspace: string, body: Body<'dreamWorkspace'> = {}) =>
      ok(raw.POST('/v1/workspaces/{workspace}/dream', { params: ws(workspace), body })),
    /** Reverts what a review or dream committed. */
    undo: (workspace: string, evolution: string) =>
      ok(raw.POST('/v1/workspaces/{workspace}/evolutions/{evolution}/undo', { params: evo(workspace, evolution) })),
  };

  const tpl = (template: string) => ({ path: { template } });
  const templates = {
    list: (query?: Query<'listTemplates'>) => ok(raw.GET('/v1/templates', { params: { query } })),
    get: (template: string) => ok(raw.GET('/v1/templates/{template}', { params: tpl(template) })),
    /** Creates a template and queues its build. */
    create: (body: Body<'createTemplate'>) => ok(raw.POST('/v1/templates', { body })),
    update: (template: string, body: Body<'updateTemplate'>) =>
      ok(raw.PUT('/v1/templates/{template}', { params: tpl(template), body })),
    delete: (template: string) => ok(raw.DELETE('/v1/templates/{template}', { params: tpl(template) })),
    log: (template: string) => ok(raw.GET('/v1/templates/{template}/log', { params: tpl(template) })),
  };

  const secrets = {
    /** The names (never the values) of a workspace's secrets. */
    list: (workspace: string) => ok(raw.GET('/v1/workspaces/{workspace}/secrets', { params: ws(workspace) })),
    put: (workspace: string, name: string, value: string) =>
      ok(
        raw.PUT('/v1/workspaces/{workspace}/secrets/{name}', {
          params: { path: { workspace, name } },
          body: { value } as Body<'putWorkspaceSecret'>,
        }),
      ),
    delete: (workspace: string, name: string) =>
      ok(raw.DELETE('/v1/workspaces/{workspace}/secrets/{name}', { params: { path: { workspace, name } } })),
  };

  const hook = (webhook: string) => ({ path: { webhook } });
  const whd = (webhook: string, delivery: string) => ({ path: { webhook, delivery } });
  const webhooks = {
    /** Creates a webhook; the answer's `secret` (whsec_…) is shown this once: keep it to verify signatures. */
    create: (body: Body<'createWebhook'>) => ok(raw.POST('/v1/webhooks', { body })),
    list: (query?: Query<'listWebhooks'>) => ok(raw.GET('/v1/webhooks', { params: { query } })),
    all: (query?: Query<'listWebhooks'>) => paginate((q?: Query<'listWebhooks'>) => webhooks.list(q), query),
    get: (webhook: string) => ok(raw.GET('/v1/webhooks/{webhook}', { params: hook(webhook) })),
    update: (webhook: string, body: Body<'updateWebhook'>) =>
      ok(raw.PATCH('/v1/webhooks/{webhook}', { params: hook(webhook), body })),
    delete: (webhook: string) => ok(raw.DELETE('/v1/webhooks/{webhook}', { params: hook(webhook) })),
    /** A new signing secret (shown this once); the old one stops at once. */
    rotateSecret: (webhook: string) => ok(raw.POST('/v1/webhooks/{webhook}/rotate-secret', { params: hook(webhook) })),
    /** Sends a `webhook.test` event (delivered and retried like any other). */
    test: (webhook: string) => ok(raw.POST('/v1/webhooks/{webhook}/test', { params: hook(webhook) })),
    deliveries: {
      list: (webhook: string, query?: Query<'listWebhookDeliveries'>) =>
        ok(raw.GET('/v1/webhooks/{webhook}/deliveries', { params: { ...hook(webhook), query } })),
      all: (webhook: string, query?: Query<'listWebhookDeliveries'>) =>
        paginate((q?: Query<'listWebhookDeliveries'>) => webhooks.deliveries.list(webhook, q), query),
      get: (webhook: string, delivery: string) =>
        ok(raw.GET('/v1/webhooks/{webhook}/deliveries/{delivery}', { params: whd(webhook, delivery) })),
      /** Delivers the same payload again, as a new delivery (a new webhook-id). */
      replay: (webhook: string, delivery: string) =>
        ok(raw.POST('/v1/webhooks/{webhook}/deliveries/{delivery}/replay', { params: whd(webhook, delivery) })),
    },
  };

  const usage = {
    get: (query?: Query<'getUsage'>) => ok(raw.GET('/v1/usage', { params: { query } })),
    daily: (query?: Query<'getDailyUsage'>) => ok(raw.GET('/v1/usage/daily', { params: { query } })),
  };

  const audit = {
    list: (query?: Query<'listAuditEvents'>) => ok(raw.GET('/v1/audit', { params: { query } })),
    all: (query?: Query<'listAuditEvents'>) => paginate((q?: Query<'listAuditEvents'>) => audit.list(q), query),
  };

  return {
    raw,
    baseUrl,
    workspaces,
    files,
    commits,
    sessions,
    messages,
    runs,
    approvals,
    evolutions,
    templates,
    secrets,
    webhooks,
    usage,
    audit,
    /** Every item of any list operation, page after page, following `last_id` while `has_more`. */
    paginate,
  };
}

export type Kiln = ReturnType<typeof createKiln>;
