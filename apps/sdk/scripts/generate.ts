/**
 * `npm run sdk:generate`: builds the live OpenAPI document from the real app (the server's own
 * `compose()`, on an in-memory PGlite database, no container runtime, self-update mounted so the
 * /v1/system routes are in it) and writes the SDK's types with openapi-typescript's Node API,
 * formatted by the project's biome. The output depends on the routes only: no server URL, port
 * or date reaches it, so it is the same on every machine; tests/integration/sdk.test.ts fails
 * when the committed file differs from what this makes.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import openapiTS, { astToString, COMMENT_HEADER, type OpenAPI3 } from 'openapi-typescript';
import pino from 'pino';
import { compose } from '../../api/src/compose.ts';
import { loadConfig } from '../../api/src/config.ts';
import { openDatabase } from '../../api/src/db/client.ts';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
export const TYPES_FILE = fileURLToPath(new URL('../src/openapi.ts', import.meta.url));

/** Exactly what GET /openapi.json serves, from an app composed the way the server composes it. */
export async function liveDocument(): Promise<OpenAPI3> {
  const database = await openDatabase({});
  try {
    // A fixed environment, not this process's: the machine's KILN_* variables must not shape the document.
    const config = loadConfig({
      KILN_DATA_DIR: '/nonexistent',
      KILN_INSTANCE_ID: 'sdk-generate',
      KILN_SECRETS_KEY: randomBytes(32).toString('base64'),
      KILN_SANDBOX_POOL_SIZE: '0',
    });
    const kiln = compose({
      config,
      db: database.db,
      sandboxes: null,
      logger: pino({ level: 'silent' }),
      selfUpdate: true,
    });
    const res = await kiln.app.request('http://kiln.invalid/openapi.json');
    if (res.status !== 200) throw new Error(`GET /openapi.json answered ${res.status}`);
    return (await res.json()) as OpenAPI3;
  } finally {
    await database.close();
  }
}

/** The SDK's types for a document: openapi-typescript's output, formatted as `biome format` would. */
export async function generateTypes(doc: OpenAPI3): Promise<string> {
  // `servers` names the origin the document was fetched from; the types never depend on it.
  const { servers: _servers, ...rest } = doc;
  const ast = await openapiTS(rest as OpenAPI3, { silent: true, alphabetize: false });
  const source = COMMENT_HEADER + astToString(ast);
  return execFileSync(`${ROOT}/node_modules/.bin/biome`, ['format', `--stdin-file-path=${TYPES_FILE}`], {
    cwd: ROOT,
    input: source,
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const types = await generateTypes(await liveDocument());
  writeFileSync(TYPES_FILE, types);
  process.stdout.write(`wrote ${TYPES_FILE} (${types.length} bytes)\n`);
}
