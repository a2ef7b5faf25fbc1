import { createRoute, z } from '@hono/zod-openapi';
import { ListQuery, listOf } from '../../http/pagination.ts';
import { conflictResponse, errorResponses, IdParam, jsonContent } from '../../http/router.ts';
import { checkSpec, specFields } from '../../templates/spec.ts';

const Name = z.string().trim().min(1).max(100);

const Template = z
  .object({
    id: z.string(),
    name: z.string(),
    apt: z.array(z.string()),
    pip: z.array(z.string()),
    files: z.array(z.object({ path: z.string(), content: z.string() })),
    status: z.enum(['queued', 'building', 'ready', 'failed']).openapi({
      description: 'of the last build; a failed or running rebuild leaves `image` (the previous one) in service',
    }),
    image: z
      .string()
      .nullable()
      .openapi({ description: 'the image new sandboxes of its workspaces get; null until a build succeeds' }),
    error: z
      .string()
      .nullable()
      .openapi({ description: 'why the last build failed: the failing step and the end of its output' }),
    log_tail: z
      .array(z.string())
      .openapi({ description: 'the last lines of the build\u2019s output (the whole log: …/log)' }),
    hash: z
      .string()
      .openapi({ description: 'content hash of what the image is built from; equal inputs share one image' }),
    created_at: z.string(),
    updated_at: z.string(),
    built_at: z.string().nullable(),
  })
  .openapi('Template');

const Params = z.object({ template: IdParam('template', 'tpl_0abc') });
const security = [{ bearer: [] }];
const tags = ['Templates'];
const body = <T extends z.ZodType>(schema: T) => ({ content: { 'application/json': { schema } }, required: true });
/** apt packages from the Debian mirror, pip packages (wheels only) from KILN_PIP_INDEX_URL, files baked in. */
const Create = z
  .object({ name: Name, ...specFields })
  .strict()
  .superRefine(checkSpec)
  .openapi('TemplateCreate');
const Update = z
  .object({ name: Name.optional(), ...specFields })
  .strict()
  .superRefine(checkSpec)
  .openapi('TemplateUpdate');

export const create = createRoute({
  operationId: 'createTemplate',
  method: 'post',
  path: '/v1/templates',
  tags,
  security,
  summary: 'Create a sandbox template: its image is built on the base sandbox image (or taken from the cache)',
  request: {
    body: body(Create),
  },
  responses: {
    201: jsonContent(Template, 'The template: `ready` at once on a cache hit, else `queued`'),
    409: conflictResponse,
    ...errorResponses,
  },
});

export const list = createRoute({
  operationId: 'listTemplates',
  method: 'get',
  path: '/v1/templates',
  tags,
  security,
  summary: 'List the team\u2019s templates',
  request: { query: ListQuery },
  responses: { 200: jsonContent(listOf(Template), 'Templates'), ...errorResponses },
});

export const get = createRoute({
  operationId: 'getTemplate',
  method: 'get',
  path: '/v1/templates/{template}',
  tags,
  security,
  summary: 'Get a template with its build status and the last lines of its build output',
  request: { params: Params },
  responses: { 200: jsonContent(Template, 'The template'), ...errorResponses },
});

export const log = createRoute({
  operationId: 'getTemplateLog',
  method: 'get',
  path: '/v1/templates/{template}/log',
  tags,
  security,
  summary: 'The whole output of the template\u2019s last build (its newest KILN_TEMPLATE_MAX_LOG_BYTES)',
  request: { params: Params },
  responses: {
    200: jsonContent(z.object({ id: z.string(), status: z.string(), log: z.string() }), 'The log'),
    ...errorResponses,
  },
});

export const update = createRoute({
  operationId: 'updateTemplate',
  method: 'put',
  path: '/v1/templates/{template}',
  tags,
  security,
  summary: 'Replace a template\u2019s definition and rebuild it; its image stays in service until the new one is ready',
  request: { params: Params, body: body(Update) },
  responses: { 200: jsonContent(Template, 'The template'), 409: conflictResponse, ...errorResponses },
});

export const remove = createRoute({
  operationId: 'deleteTemplate',
  method: 'delete',
  path: '/v1/templates/{template}',
  tags,
  security,
  summary: 'Delete a template no workspace uses (409 while one does)',
  request: { params: Params },
  responses: {
    200: jsonContent(z.object({ id: z.string(), deleted: z.literal(true) }), 'Deleted'),
    409: conflictResponse,
    ...errorResponses,
  },
});
