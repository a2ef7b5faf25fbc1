import { createRoute, z } from '@hono/zod-openapi';
import { conflictResponse, errorResponses, jsonContent } from '../../http/router.ts';
import { PEER_NAME } from '../../sandbox/node/pki.ts';

const Node = z
  .object({
    name: z.string(),
    url: z.string(),
    state: z.enum(['active', 'draining']).openapi({ description: 'draining: takes no new sandboxes' }),
    health: z
      .enum(['heard', 'silent'])
      .openapi({ description: 'heard: a replica had an answer from it within the last 30 s' }),
    capacity: z.object({ memory_mb: z.number().int(), cpus: z.number() }),
    committed: z
      .object({ memory_mb: z.number().int(), cpus: z.number() })
      .openapi({ description: 'the limits of the sandboxes placed on it, by every replica' }),
    sandboxes: z.number().int(),
    runtimes: z.array(z.object({ runtime: z.enum(['runc', 'gvisor']), egress: z.boolean() })),
    images: z.array(z.string()).openapi({
      description:
        'The template images it has, as it last said: a template built before it joined is built there when it is first heard',
    }),
    last_heard_at: z.string().nullable(),
    last_error: z.string().nullable(),
    created_at: z.string(),
  })
  .openapi('SandboxNode');

const Name = z.object({
  node: z
    .string()
    .regex(PEER_NAME)
    .openapi({ param: { name: 'node', in: 'path' }, example: 'node-1' }),
});
const security = [{ bearer: [] }];
const tags = ['Sandbox nodes'];

export const list = createRoute({
  operationId: 'listNodes',
  method: 'get',
  path: '/v1/system/nodes',
  tags,
  security,
  summary: 'The sandbox nodes: state, capacity, what is placed on each, when last heard (org admin)',
  responses: { 200: jsonContent(z.object({ data: z.array(Node) }), 'Every registered node'), ...errorResponses },
});

export const add = createRoute({
  operationId: 'addNode',
  method: 'post',
  path: '/v1/system/nodes',
  tags,
  security,
  summary: 'Register a sandbox node (org admin); it must present a certificate of the installation naming it',
  request: {
    body: {
      content: {
        'application/json': {
          schema: z
            .object({
              name: z.string().regex(PEER_NAME, 'lower-case letters, digits, dots and dashes'),
              url: z
                .url({ protocol: /^https$/ })
                .max(2048)
                .openapi({ description: 'https://host:port of the node', example: 'https://10.0.0.21:7443' }),
            })
            .strict(),
        },
      },
      required: true,
    },
  },
  responses: { 201: jsonContent(Node, 'Registered'), 409: conflictResponse, ...errorResponses },
});

export const drain = createRoute({
  operationId: 'drainNode',
  method: 'post',
  path: '/v1/system/nodes/{node}/drain',
  tags,
  security,
  summary: 'Stop placing sandboxes on a node; the ones it has end as usual (org admin)',
  request: { params: Name },
  responses: { 200: jsonContent(Node, 'Draining'), ...errorResponses },
});

export const remove = createRoute({
  operationId: 'removeNode',
  method: 'delete',
  path: '/v1/system/nodes/{node}',
  tags,
  security,
  summary: 'Forget a drained node that has no sandboxes left (org admin)',
  request: { params: Name },
  responses: { 200: jsonContent(Node, 'Removed (as it was)'), 409: conflictResponse, ...errorResponses },
});
