import { createRoute, z } from '@hono/zod-openapi';
import { errorResponses, IdParam, jsonContent } from '../../http/router.ts';

/** A paused sandbox's fields (null while it runs), in its listing and in its session's. */
export const pausedFields = {
  paused_at: z.string().nullable(),
  checkpoint_bytes: z
    .number()
    .int()
    .nullable()
    .openapi({ description: 'paused: its checkpoint\u2019s size on disk (null: unknown)' }),
};

const Sandbox = z
  .object({
    id: z.string(),
    session_id: z.string().nullable(),
    workspace_id: z.string().nullable(),
    image: z
      .string()
      .openapi({ description: 'the base sandbox image, or its workspace\u2019s template image when it was created' }),
    state: z.enum(['starting', 'idle', 'busy', 'paused', 'resuming']).openapi({
      description:
        'paused: checkpointed to its host\u2019s disk, every variable kept, using no memory or CPU (its session\u2019s next ' +
        'execution resumes it); resuming: being started from its checkpoint',
    }),
    ...pausedFields,
    runtime: z.enum(['runc', 'gvisor']).openapi({
      description: 'the container runtime it runs in (its workspace\u2019s sandbox.runtime when it was created)',
    }),
    memory_bytes: z.number().nullable(),
    cpu_percent: z.number().nullable(),
    limits: z.object({
      memoryMb: z.number(),
      cpus: z.number(),
      pids: z.number(),
      timeoutS: z.number(),
      diskMb: z.number(),
    }),
    created_at: z.string(),
    last_used_at: z.string(),
    expires_at: z.string().openapi({
      description:
        'its idle deadline: last use plus its workspace\u2019s idle time; paused: when its checkpoint is deleted ' +
        '(its workspace\u2019s sandbox.paused_ttl_s after it was paused)',
    }),
    reclaim_at: z.string().openapi({
      description:
        'when it will be reclaimed unless used or kept alive (POST /v1/sessions/{session}/keepalive): ' +
        'the earlier of its idle deadline and its hard lifetime (KILN_SANDBOX_MAX_LIFETIME_S); ' +
        'a sandbox running code is never reclaimed for being idle',
    }),
  })
  .openapi('Sandbox');

export const list = createRoute({
  operationId: 'listSandboxes',
  method: 'get',
  path: '/v1/sandboxes',
  tags: ['Sandboxes'],
  security: [{ bearer: [] }],
  summary: 'The team\u2019s live and paused sandboxes with their memory and CPU use',
  responses: { 200: jsonContent(z.object({ data: z.array(Sandbox) }), 'Sandboxes'), ...errorResponses },
});

export const remove = createRoute({
  operationId: 'deleteSandbox',
  method: 'delete',
  path: '/v1/sandboxes/{sandbox}',
  tags: ['Sandboxes'],
  security: [{ bearer: [] }],
  summary: 'Remove a sandbox now; its session gets a fresh one on its next execution',
  request: { params: z.object({ sandbox: IdParam('sandbox', 'sbx_0abc') }) },
  responses: { 200: jsonContent(z.object({ id: z.string(), deleted: z.literal(true) }), 'Removed'), ...errorResponses },
});
