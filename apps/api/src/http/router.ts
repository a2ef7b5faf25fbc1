import { OpenAPIHono, z } from '@hono/zod-openapi';
import type { AppEnv } from './env.ts';
import { ApiError } from '../lib/errors.ts';

/** Every router shares one validation hook, so zod errors always become the 400 envelope. */
export function createRouter() {
  return new OpenAPIHono<AppEnv>({
    defaultHook: (result, _c) => {
      if (!result.success) throw ApiError.fromZod(result.error, result.target === 'json' ? 'body' : result.target);
    },
  });
}

const ErrorSchema = z
  .object({
    error: z.object({
      type: z.string(),
      code: z.string(),
      message: z.string(),
      request_id: z.string(),
    }),
  })
  .openapi('Error');

const errorResponse = (description: string) => ({
  content: { 'application/json': { schema: ErrorSchema } },
  description,
});

/** The error responses every authenticated route can give. */
export const errorResponses = {
  400: errorResponse('Malformed or out-of-range input'),
  401: errorResponse('Missing or unknown API key'),
  403: errorResponse('The key may not do this'),
  404: errorResponse('No such resource (or another team\u2019s)'),
  429: errorResponse('Rate limited; see Retry-After'),
} as const;

export const conflictResponse = errorResponse('Conflicts with the current state');

export const jsonContent = <T extends z.ZodType>(schema: T, description: string) => ({
  content: { 'application/json': { schema } },
  description,
});

export const IdParam = (name: string, example: string) =>
  z
    .string()
    .min(1)
    .max(64)
    // A name where an id belongs is the usual mistake: say what an id of this kind looks like.
    .regex(
      /^[a-z]+_[0-9a-z]+$/,
      `not a valid id (a ${name.replace(/_id$/, '')} id looks like ${example.split('_')[0]}_…, as the API answered when it was made: use that, not a name)`,
    )
    .openapi({ param: { name, in: 'path' }, example });
