import { KilnError } from '@kiln/sdk';

/**
 * What the command line prints for a failure: the API's code and message ("not_found: run not
 * found"); a server that did not answer says so ("no answer from GET …: connect ECONNREFUSED …").
 */
export const describeError = (err: unknown): string =>
  err instanceof KilnError ? `${err.code}: ${err.message}` : err instanceof Error ? err.message : String(err);
