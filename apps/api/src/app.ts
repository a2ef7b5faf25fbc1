import { forwardToHolder, type Replicas } from './http/replicas.ts';
import { HTTPException } from 'hono/http-exception';
import { bodyLimit } from 'hono/body-limit';
import { secureHeaders } from 'hono/secure-headers';
import type { Logger } from 'pino';
import type { Config } from './config.ts';
import type { Db } from './db/client.ts';
import { auditTrail } from './http/audit-trail.ts';
import { KeyCache } from './auth/key-cache.ts';
import type { CacheNews } from './db/cache-news.ts';
import { authn } from './http/authn.ts';
import { dashboardRouter } from './http/dashboard.ts';
import { docsRouter } from './http/docs.ts';
import { ApiError, errorBody } from './lib/errors.ts';
import { idempotency } from './http/idempotency.ts';
import { rateLimit } from './http/rate-limit.ts';
import { requestLog } from './http/request-log.ts';
import type { KilnMetrics } from './metrics/metrics.ts';
import { metricsRouter } from './routes/metrics/metrics.index.ts';
import { createRouter } from './http/router.ts';
import { mcpHandler, mcpRoute } from './routes/mcp/server.ts';
import { auditRouter } from './routes/audit/audit.index.ts';
import { healthRouter } from './routes/health/health.index.ts';
import { sandboxesRouter } from './routes/sandboxes/sandboxes.index.ts';
import { sessionsRouter } from './routes/sessions/sessions.index.ts';
import type { SandboxEngine } from './sandbox/engine.ts';
import type { EvolutionService } from './evolution/service.ts';
import { evolutionsRouter } from './routes/evolutions/evolutions.index.ts';
import type { RunEventLog } from './agent/events.ts';
import type { AgentService } from './agent/service.ts';
import { approvalsRouter } from './routes/approvals/approvals.index.ts';
import { messagesRouter } from './routes/messages/messages.index.ts';
import { runsRouter } from './routes/runs/runs.index.ts';
import { usageRouter } from './routes/usage/usage.index.ts';
import { workspaceRepoRouter } from './routes/workspace-repo/workspace-repo.index.ts';
import type { WorkspaceService } from './workspace/service.ts';
import { teamsRouter } from './routes/teams/teams.index.ts';
import { systemRouter } from './routes/system/system.index.ts';
import { nodesRouter } from './routes/nodes/nodes.index.ts';
import type { FleetBackend } from './sandbox/node/fleet.ts';
import type { NodeRegistry } from './sandbox/node/registry.ts';
import type { SelfUpdates } from './platform/self-update.ts';
import { workspacesRouter } from './routes/workspaces/workspaces.index.ts';
import { workspaceSecretsRouter } from './routes/workspace-secrets/workspace-secrets.index.ts';
import type { Sealer } from './secrets/sealing.ts';
import type { SecretStore } from './secrets/store.ts';
import { templatesRouter } from './routes/templates/templates.index.ts';
import type { TemplateService } from './templates/service.ts';
import { webhooksRouter } from './routes/webhooks/webhooks.index.ts';
import type { WebhookService } from './webhooks/service.ts';

export interface AppDeps {
  config: Pick<Config, 'bodyLimitBytes' | 'rateLimit' | 'metrics'>;
  db: Db;
  logger: Logger;
  engine: SandboxEngine;
  workspaces: WorkspaceService;
  agent: AgentService;
  /** Every run's events, in order; the run and message routes list and stream them. */
  events: RunEventLog;
  evolution: EvolutionService;
  /** Workspace secrets: their routes write and list them, executions get them. */
  secrets: SecretStore;
  /** The secrets key's sealer: idempotent answers are stored sealed (they may carry a secret shown once). */
  sealer: Sealer;
  /** Sandbox templates (their routes; a workspace's sandbox.template is checked against them). */
  templates: TemplateService;
  /** Webhooks (their routes). */
  webhooks: WebhookService;
  /** Platform self-update; without it the /v1/system routes are not mounted (in-process test apps). */
  updates?: SelfUpdates;
  /** Where the built dashboard is (default apps/dashboard/dist). */
  dashboardDir?: string;
  /** This app's metrics: requests are observed, and GET /metrics serves them. */
  metrics: KilnMetrics;
  /** Injectable clock for the rate limiter. */
  now?: () => number;
  /** News of writes that make cached keys, sessions and settings stale, for every replica. */
  news: CacheNews;
  /** The sandbox node registry (its routes), and the fleet when sandboxes are placed on nodes. */
  nodes: { registry: NodeRegistry; fleet?: FleetBackend };
  /** The API replicas sharing the database: a request about a session held by another goes there. */
  replicas: Replicas;
}

/** Maps anything thrown to the API's error envelope; only 5xx are logged as errors. */
function toApiError(err: Error, contentType: string | undefined): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof HTTPException) {
    if (err.status === 413) return new ApiError('payload_too_large', err.message);
    // curl -d sends a form content type: say what to send instead of just "unsupported".
    if (err.status === 415) {
      const sent = contentType ? `Content-Type ${contentType.split(';')[0]!.trim().slice(0, 100)}` : 'no Content-Type';
      return new ApiError(
        'unsupported_media_type',
        `the body must be JSON sent with the header "Content-Type: application/json" (this request had ${sent})`,
      );
    }
    if (err.status < 500) return new ApiError('invalid_request', err.message || 'invalid request');
  }
  return new ApiError('internal', 'internal error');
}

/**
 * Every response says: no framing, no MIME sniffing, no referrer, and for pages a policy that
 * lets them load only this server's own scripts, styles and API (the dashboard renders tenant
 * data; should any reach the DOM as markup, the browser still runs none of it).
 */
const PAGE_CSP = {
  defaultSrc: ["'self'"],
  scriptSrc: ["'self'"],
  styleSrc: ["'self'"],
  imgSrc: ["'self'", 'data:'],
  connectSrc: ["'self'"],
  fontSrc: ["'self'"],
  objectSrc: ["'none'"],
  baseUri: ["'none'"],
  formAction: ["'self'"],
  frameAncestors: ["'none'"],
};
const headers = (styleSrc: string[]) =>
  secureHeaders({
    contentSecurityPolicy: { ...PAGE_CSP, styleSrc },
    xFrameOptions: 'DENY',
    referrerPolicy: 'no-referrer',
    strictTransportSecurity: false,
  });
const pageHeaders = headers(PAGE_CSP.styleSrc);
// Swagger UI sets inline style attributes; its scripts are still only this server's files.
const docsHeaders = headers(["'self'", "'unsafe-inline'"]);

export function createApp({
  config,
  db,
  nodes,
  engine,
  workspaces,
  agent,
  events,
  evolution,
  secrets,
  sealer,
  templates,
  webhooks,
  updates,
  logger,
  now,
  dashboardDir,
  metrics,
  news,
  replicas,
}: AppDeps) {
  const app = createRouter();

  app.use('*', requestLog(logger, metrics));
  app.use('*', (c, next) =>
    (c.req.path === '/docs' || c.req.path.startsWith('/docs/') ? docsHeaders : pageHeaders)(c, next),
  );
  app.use(
    '*',
    bodyLimit({
      maxSize: config.bodyLimitBytes,
      onError: () => {
        throw new ApiError('payload_too_large', `request body is larger than ${config.bodyLimitBytes} bytes`);
      },
    }),
  );
  const keys = new KeyCache(db, news);
  // One limiter for the API and /mcp: a team's MCP requests and API requests share its bucket.
  const limit = rateLimit(config.rateLimit, now);
  // A request about a session whose sandbox another replica holds goes there once authenticated,
  // before this one counts, stores or audits it: the holder does.
  app.use(
    '/v1/*',
    authn(keys),
    forwardToHolder(db, replicas, (s) => engine.holds(s), {
      log: logger,
      counted: (outcome) => metrics.replicaForward(outcome),
    }),
    limit,
    idempotency(db, sealer),
    auditTrail(db),
  );
  // The MCP tools act through the /v1 routes (in-process, with the caller's key): those requests
  // are audited there, in the API's own terms, under this request's id (see docs/mcp.md).
  app.use('/mcp', authn(keys), limit);

  app.route('/', healthRouter(db, engine));
  app.route('/', teamsRouter(db, news));
  app.route('/', workspacesRouter(db, workspaces, engine, templates, news));
  app.route('/', templatesRouter(templates));
  app.route('/', workspaceRepoRouter(db, workspaces, secrets));
  app.route('/', workspaceSecretsRouter(db, secrets));
  app.route('/', sessionsRouter(db, engine, workspaces, news));
  app.route('/', sandboxesRouter(engine));
  // The routes read run events from the event log itself, which the agent service holds for now.
  app.route('/', messagesRouter(db, agent, events));
  app.route('/', runsRouter(agent, events));
  app.route('/', approvalsRouter(agent));
  app.route('/', usageRouter(db));
  app.route('/', evolutionsRouter(db, evolution));
  app.route('/', auditRouter(db));
  app.route('/', webhooksRouter(webhooks));
  if (updates) app.route('/', systemRouter(db, updates));
  app.route('/', nodesRouter(nodes.registry, nodes.fleet));
  const mcp = mcpHandler({
    fetch: (req, env) => app.fetch(req, env),
    events,
    maxBodyBytes: config.bodyLimitBytes,
    logger,
  });
  app.openAPIRegistry.registerPath(mcpRoute);
  app.on(['GET', 'POST', 'DELETE'], '/mcp', (c) =>
    mcp.serve(c.req.raw, {
      keyId: c.get('principal').keyId,
      authorization: c.req.header('authorization') ?? '',
      requestId: c.get('requestId'),
      log: c.get('log'),
    }),
  );
  app.route('/', metricsRouter(metrics, keys, config.metrics.token));

  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', {
    type: 'http',
    scheme: 'bearer',
    description: 'A Kiln API key',
  });
  // The document names the server it was fetched from, so a client generated from it needs no other setting.
  app.doc31('/openapi.json', (c) => ({
    openapi: '3.1.0',
    info: {
      title: 'Kiln API',
      version: '1',
      description: 'Self-hosted AI agents with hardened Python sandboxes and git-backed self-evolution.',
    },
    servers: [{ url: new URL(c.req.url).origin, description: 'this Kiln server' }],
  }));
  app.route('/', docsRouter());
  app.route('/', dashboardRouter(dashboardDir));

  app.notFound((c) =>
    c.json(errorBody(new ApiError('not_found', `no route for ${c.req.method} ${c.req.path}`), c.get('requestId')), 404),
  );
  app.onError((err, c) => {
    const e = toApiError(err, c.req.header('content-type'));
    if (e.status >= 500) c.get('log').error({ err }, 'request failed');
    for (const [k, v] of Object.entries(e.headers)) c.header(k, v);
    return c.json(errorBody(e, c.get('requestId')), e.status);
  });
  return app;
}
