import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { pausedFields } from '../sandboxes/sandboxes.routes.ts';

const SessionSandbox = z
  .object({
    id: z.string(),
    state: z.enum(['running', 'paused', 'resuming']).openapi({
      description:
        'running (or starting); paused: checkpointed to its host\u2019s disk with every variable, resumed by the next ' +
        'execution, file read or POST /v1/sessions/{session}/resume; resuming: being started from its checkpoint',
    }),
    runtime: z.enum(['runc', 'gvisor']),
    ...pausedFields,
    expires_at: z.string().openapi({
      description: 'running: its idle deadline (paused or removed past it); paused: when its checkpoint is deleted',
    }),
  })
  .openapi('SessionSandbox');

const Session = z
  .object({
    id: z.string(),
    workspace_id: z.string(),
    title: z.string().nullable(),
    status: z.enum(['active', 'ended']),
    created_at: z.string(),
    last_activity_at: z.string(),
    ended_at: z.string().nullable(),
    sandbox: SessionSandbox.nullable()
      .optional()
      .openapi({ description: 'GET only: the session\u2019s sandbox (null: none; its next execution starts one)' }),
  })
  .openapi('Session');

const Artifact = z.object({ name: z.string(), mime: z.string(), base64: z.string() });
const EgressEvent = z
  .object({
    host: z.string(),
    port: z.number().int(),
    method: z.string().openapi({ description: 'CONNECT for HTTPS, else the HTTP method' }),
    allowed: z.boolean(),
    status: z.number().int().openapi({ description: 'what the proxy answered: 403 refused, 200 tunnel established' }),
    bytes_out: z.number().int(),
    bytes_in: z.number().int(),
  })
  .openapi('EgressEvent');
const ExecResult = z
  .object({
    stdout: z.string(),
    stderr: z.string(),
    error: z.object({ type: z.string(), message: z.string(), traceback: z.string().optional() }).optional(),
    exit_code: z.number().int(),
    duration_ms: z.number(),
    truncated: z.boolean(),
    stdout_bytes: z.number().int(),
    stderr_bytes: z.number().int(),
    restarted: z
      .boolean()
      .openapi({ description: 'the interpreter was restarted: variables from earlier executions are gone' }),
    restart_reason: z
      .string()
      .optional()
      .openapi({
        description:
          'with restarted, for a new sandbox: why the session\u2019s previous one ended (idle, paused_expired, ' +
          'checkpoint_reclaimed, resume_failed, runner_lost, node_lost, replica_gone, deleted, …)',
      }),
    resumed_ms: z
      .number()
      .int()
      .optional()
      .openapi({
        description:
          'the session\u2019s paused sandbox was resumed for this execution (or its running one taken over from a ' +
          'replica that is gone), in this many ms, with every variable kept',
      }),
    artifacts: z.array(Artifact),
    sandbox_id: z.string(),
    execution_id: z.string(),
    egress: z.array(EgressEvent).openapi({
      description:
        'every request the code made through the egress proxy (sandbox.network allowlist), allowed or refused; empty without a network',
    }),
  })
  .openapi('ExecResult');

const WsParams = z.object({ workspace: IdParam('workspace', 'ws_0abc') });
const SesParams = z.object({ session: IdParam('session', 'ses_0abc') });
const security = [{ bearer: [] }];
const tags = ['Sessions'];
const FilePath = z.object({ path: z.string().min(1).max(1024).openapi({ example: '/workspace/data.csv' }) });

export const create = createRoute({
  operationId: 'createSession',
  method: 'post',
  path: '/v1/workspaces/{workspace}/sessions',
  tags,
  security,
  summary: 'Start a session in a workspace',
  request: {
    params: WsParams,
    body: {
      content: {
        'application/json': { schema: z.object({ title: z.string().trim().min(1).max(200).optional() }).strict() },
      },
      required: false,
    },
  },
  responses: { 201: jsonContent(Session, 'The session'), ...errorResponses },
});

export const list = createRoute({
  operationId: 'listSessions',
  method: 'get',
  path: '/v1/workspaces/{workspace}/sessions',
  tags,
  security,
  summary: 'List a workspace\u2019s sessions',
  request: { params: WsParams, query: ListQuery },
  responses: { 200: jsonContent(listOf(Session), 'Sessions'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getSession',
  method: 'get',
  path: '/v1/sessions/{session}',
  tags,
  security,
  summary: 'Get a session',
  request: { params: SesParams },
  responses: { 200: jsonContent(Session, 'The session'), ...errorResponses },
});

export const end = createRoute({
  operationId: 'endSession',
  method: 'delete',
  path: '/v1/sessions/{session}',
  tags,
  security,
  summary: 'End a session; its sandbox is removed',
  request: { params: SesParams },
  responses: { 200: jsonContent(Session, 'The ended session'), ...errorResponses },
});

export const exec = createRoute({
  operationId: 'execCode',
  method: 'post',
  path: '/v1/sessions/{session}/exec',
  tags,
  security,
  summary: 'Run Python in the session\u2019s stateful sandbox',
  description:
    'Variables persist across calls. With `?stream=true` the answer is an SSE stream of `exec.output` events and one `exec.completed`.',
  request: {
    params: SesParams,
    query: z.object({ stream: z.enum(['true', 'false']).optional() }),
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              code: z.string().min(1).max(1_000_000),
              timeout_s: z.number().int().min(1).max(86_400).optional(),
            })
            .strict(),
        },
      },
      required: true,
    },
  },
  responses: {
    200: {
      ...jsonContent(ExecResult, 'The result'),
      content: { 'application/json': { schema: ExecResult }, 'text/event-stream': { schema: z.string() } },
    },
    409: conflictResponse,
    ...errorResponses,
  },
});

const KeepAlive = z
  .object({
    session_id: z.string(),
    sandbox_id: z.string().nullable().openapi({ description: 'null: the session has no sandbox running' }),
    idle_s: z.number().int().openapi({ description: 'the workspace\u2019s idle time the deadline moved by' }),
    reclaim_at: z
      .string()
      .nullable()
      .openapi({
        description:
          'when the sandbox will be reclaimed unless it is used or kept alive again: now + idle_s, or its hard ' +
          'lifetime (KILN_SANDBOX_MAX_LIFETIME_S) if that comes first; null without a sandbox',
      }),
  })
  .openapi('KeepAlive');

export const keepAlive = createRoute({
  operationId: 'keepSessionAlive',
  method: 'post',
  path: '/v1/sessions/{session}/keepalive',
  tags,
  security,
  summary: 'Keep the session\u2019s sandbox from being reclaimed for another idle time',
  description:
    'Moves the idle deadline of the session\u2019s sandbox to now plus its workspace\u2019s `sandbox.idle_s`. ' +
    'Without a sandbox running it is a no-op (`sandbox_id` and `reclaim_at` null): the next execution starts one.',
  request: {
    params: SesParams,
    body: { content: { 'application/json': { schema: z.object({}).strict() } }, required: false },
  },
  responses: { 200: jsonContent(KeepAlive, 'The new deadline'), 409: conflictResponse, ...errorResponses },
});

const PauseResult = z
  .object({
    session_id: z.string(),
    sandbox_id: z.string(),
    state: z.literal('paused'),
    checkpoint_bytes: z
      .number()
      .int()
      .nullable()
      .openapi({ description: 'the checkpoint\u2019s size on disk (null: unknown)' }),
    pause_ms: z.number().int(),
  })
  .openapi('PauseResult');

export const pause = createRoute({
  operationId: 'pauseSession',
  method: 'post',
  path: '/v1/sessions/{session}/pause',
  tags,
  security,
  summary: 'Pause the session\u2019s sandbox to disk, every variable kept',
  description:
    'Checkpoints the session\u2019s running sandbox to its host\u2019s disk (its memory leaves the host\u2019s RAM) once ' +
    'what is queued on it is done. The next execution, file read or `/resume` resumes it. Only gVisor sandboxes ' +
    'without a network can be paused (409 otherwise, saying why). An idle sandbox is paused by itself at its ' +
    'workspace\u2019s `sandbox.idle_s`.',
  request: {
    params: SesParams,
    body: { content: { 'application/json': { schema: z.object({}).strict() } }, required: false },
  },
  responses: { 200: jsonContent(PauseResult, 'Paused'), 409: conflictResponse, ...errorResponses },
});

const ResumeResult = z
  .object({
    session_id: z.string(),
    sandbox_id: z.string(),
    state: z.literal('running'),
    resumed_ms: z
      .number()
      .int()
      .nullable()
      .openapi({ description: 'how long resuming took; null when it was already running, or could not be resumed' }),
    lost: z.string().optional().openapi({
      description: 'the paused sandbox could not be resumed, and why: the session has a new one, without its variables',
    }),
  })
  .openapi('ResumeResult');

export const resume = createRoute({
  operationId: 'resumeSession',
  method: 'post',
  path: '/v1/sessions/{session}/resume',
  tags,
  security,
  summary: 'Resume the session\u2019s paused sandbox now',
  description:
    'Starts the session\u2019s paused sandbox from its checkpoint ahead of its next execution, every variable kept. ' +
    'One already running is left as it is; 409 when the session has no sandbox paused.',
  request: {
    params: SesParams,
    body: { content: { 'application/json': { schema: z.object({}).strict() } }, required: false },
  },
  responses: { 200: jsonContent(ResumeResult, 'Running'), 409: conflictResponse, ...errorResponses },
});

export const putFile = createRoute({
  operationId: 'putSessionFile',
  method: 'put',
  path: '/v1/sessions/{session}/files',
  tags,
  security,
  summary: 'Write a file into the session\u2019s sandbox (body = the bytes)',
  request: { params: SesParams, query: FilePath },
  responses: { 200: jsonContent(z.object({ path: z.string(), size: z.number().int() }), 'Written'), ...errorResponses },
});

export const getFile = createRoute({
  operationId: 'getSessionFile',
  method: 'get',
  path: '/v1/sessions/{session}/files',
  tags,
  security,
  summary: 'Read a file from the session\u2019s sandbox',
  request: { params: SesParams, query: FilePath },
  responses: {
    200: { content: { 'application/octet-stream': { schema: z.string() } }, description: 'The bytes' },
    ...errorResponses,
  },
});
