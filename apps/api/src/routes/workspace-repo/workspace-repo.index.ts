import { z } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import type { Db } from '../../db/client.ts';
import type { AppEnv } from '../../http/env.ts';
import { ApiError } from '../../lib/errors.ts';
import { createRouter } from '../../http/router.ts';
import { workspaceOf, workspaceScope } from '../../http/workspace-scope.ts';
import { decodeCursor, encodeCursor, MAX_DEPTH, type QueryVector } from '../../memory/search.ts';
import { workspaceMask } from '../../secrets/masking.ts';
import type { SecretSource } from '../../secrets/store.ts';
import { checkRelativePath } from '../../workspace/paths.ts';
import type { CommitInfo, CommitOutcome } from '../../workspace/git-repos.ts';
import type { CommitRow, WorkspaceService } from '../../workspace/service.ts';
import * as r from './workspace-repo.routes.ts';

export const commitView = (c: CommitInfo | CommitRow) => ({
  sha: c.sha,
  kind: c.kind,
  author: c.author,
  summary: c.summary,
  paths: c.paths,
  session_id: c.sessionId,
  run_id: c.runId,
  evolution_id: c.evolutionId,
  created_at: c.createdAt.toISOString(),
});

const outcomeView = (o: CommitOutcome) => ({
  commit: o.commit ? commitView(o.commit) : null,
  redactions: o.redactions,
  refused: o.refused,
});

/** A PUT /files body sent as JSON: the shape GET /files answers a file with. */
const JsonFile = z.object({ content: z.string(), encoding: z.enum(['utf-8', 'base64']).default('utf-8') }).strict();

const RAW_HINT =
  'to store a file\'s bytes as they are (a .json file too), send them with "Content-Type: application/octet-stream" ' +
  "(curl --data-binary @FILE -H 'Content-Type: application/octet-stream')";

/**
 * The bytes a PUT /files writes: the body as sent, or, when it is sent as JSON, the file it
 * describes (`{"content": "…", "encoding": "utf-8" | "base64"}`, as GET answers). A JSON body of
 * another shape is refused rather than committed as the file's text.
 */
function fileBytes(body: Buffer, contentType: string | undefined): Buffer {
  const type = (contentType ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== 'application/json') return body;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    throw new ApiError('invalid_request', `the body was sent as JSON but is not JSON; ${RAW_HINT}`);
  }
  const file = JsonFile.safeParse(parsed);
  if (!file.success)
    throw new ApiError(
      'invalid_request',
      `a JSON body is the file as {"content": "…", "encoding": "utf-8" | "base64"} (encoding defaults to utf-8); ${RAW_HINT}`,
    );
  return Buffer.from(file.data.content, file.data.encoding === 'base64' ? 'base64' : 'utf8');
}

export function workspaceRepoRouter(db: Db, service: WorkspaceService, secrets: SecretSource) {
  const scoped = workspaceScope(db);
  // A search's query is encoded (after authentication and the rate limit) while its workspace is
  // looked up and its parameters validated: once a search's words take one statement, the
  // question's vector is what it waits for. A query the validation will refuse is not encoded; one
  // whose workspace is not found was encoded for nothing (the caller is authenticated and
  // rate-limited: it costs what a search would).
  const early = new WeakMap<Request, { q: string; vector: QueryVector }>();
  const encodeEarly: MiddlewareHandler<AppEnv> = async (c, next) => {
    const q = r.SearchQuery.shape.q.safeParse(c.req.query('q'));
    const vector = q.success ? service.startQueryVector(q.data) : undefined;
    if (q.success && vector) early.set(c.req.raw, { q: q.data, vector });
    await next();
  };
  const router = createRouter();
  router.use('/v1/workspaces/:workspace/memory/search', encodeEarly);
  return router
    .openapi(scoped(r.getFiles), async (c) => {
      const ws = workspaceOf(c);
      const q = c.req.valid('query');
      const path = checkRelativePath(q.path, { allowRoot: true });
      const info = path ? await service.stat(ws.id, path) : { isDirectory: () => true, isFile: () => false, size: 0 };
      if (!info) throw ApiError.notFound(`path ${path}`);
      // Names and bytes leave masked: a value may have been put in a file (or its name) before it
      // became a secret, and MCP read_file hands what this answers to a model.
      const mask = await workspaceMask(secrets, ws.id);
      if (info.isDirectory()) {
        const entries = (await service.listDir(ws.id, path)).map((e) => ({
          ...e,
          name: mask.text(e.name),
          path: mask.text(e.path),
        }));
        return c.json({ path, type: 'dir' as const, entries }, 200);
      }
      const data = await mask.bytes(await service.readFile(ws.id, path));
      if (q.raw === 'true')
        return c.body(new Uint8Array(data), 200, { 'content-type': 'application/octet-stream' }) as never;
      const text = data.toString('utf8');
      const binary = data.includes(0) || !Buffer.from(text, 'utf8').equals(data);
      return c.json(
        {
          path,
          type: 'file' as const,
          size: data.length,
          encoding: binary ? ('base64' as const) : ('utf-8' as const),
          content: binary ? data.toString('base64') : text,
        },
        200,
      );
    })
    .openapi(scoped(r.putFile), async (c) => {
      const ws = workspaceOf(c);
      const path = c.req.valid('query').path;
      const data = fileBytes(Buffer.from(await c.req.arrayBuffer()), c.req.header('content-type'));
      const outcome = await service.writeFile(ws, path, data, { author: 'user', actor: c.get('principal').keyId });
      c.set('audit', {
        action: 'workspace.file.write',
        resourceType: 'workspace',
        resourceId: ws.id,
        after: { path, bytes: data.length, commit: outcome.commit?.sha ?? null, redactions: outcome.redactions.length },
      });
      return c.json(outcomeView(outcome), 200);
    })
    .openapi(scoped(r.deleteFile), async (c) => {
      const ws = workspaceOf(c);
      const path = c.req.valid('query').path;
      const outcome = await service.deleteFile(ws, path, { author: 'user', actor: c.get('principal').keyId });
      c.set('audit', {
        action: 'workspace.file.delete',
        resourceType: 'workspace',
        resourceId: ws.id,
        after: { path, commit: outcome.commit?.sha ?? null },
      });
      return c.json(outcomeView(outcome), 200);
    })
    .openapi(scoped(r.listCommits), async (c) => {
      const ws = workspaceOf(c);
      const q = c.req.valid('query');
      const rows = await service.listCommits(ws, q);
      const has_more = rows.length > q.limit;
      const data = rows.slice(0, q.limit).map(commitView);
      return c.json({ data, has_more, last_id: data.at(-1)?.sha ?? null }, 200);
    })
    .openapi(scoped(r.getCommit), async (c) => {
      const { commit, diff, diffTruncated } = await service.getCommit(workspaceOf(c), c.req.valid('param').sha);
      return c.json({ ...commitView(commit), diff, diff_truncated: diffTruncated }, 200);
    })
    .openapi(scoped(r.revert), async (c) => {
      const ws = workspaceOf(c);
      const { sha } = c.req.valid('param');
      const outcome = await service.revert(ws, sha, { author: 'user', actor: c.get('principal').keyId });
      c.set('audit', {
        action: 'workspace.revert',
        resourceType: 'workspace',
        resourceId: ws.id,
        after: { reverted: sha, commit: outcome.commit?.sha },
      });
      return c.json(outcomeView(outcome), 201);
    })
    .openapi(scoped(r.getMemoryUsage), async (c) => {
      const { entries, bytes, budget } = await service.memoryUsage(workspaceOf(c));
      return c.json(
        { path: 'MEMORY.md' as const, entries, bytes, max_entries: budget.maxEntries, max_bytes: budget.maxBytes },
        200,
      );
    })
    .openapi(scoped(r.listSkills), async (c) => {
      const skills = await service.skills(workspaceOf(c));
      return c.json({ data: skills }, 200);
    })
    .openapi(scoped(r.searchMemory), async (c) => {
      const started = early.get(c.req.raw);
      early.delete(c.req.raw);
      const ws = workspaceOf(c);
      const { q, k, path, since, until, cursor, debug } = c.req.valid('query');
      const filters = { path, since, until };
      const offset = cursor === undefined ? 0 : decodeCursor(cursor, q, filters);
      if (offset === null)
        throw new ApiError(
          'invalid_request',
          'cursor: not a cursor of this query and these filters (pass next_cursor back with the same q, path, since and until)',
        );
      const page = await service.search(ws, q, {
        k,
        offset,
        ...filters,
        debug: debug === 'true',
        ...(started?.q === q ? { queryVector: started.vector } : {}),
      });
      const next = page.hasMore && offset + k < MAX_DEPTH ? encodeCursor(offset + k, q, filters) : null;
      return c.json({ data: page.hits, has_more: next !== null, next_cursor: next }, 200);
    });
}
