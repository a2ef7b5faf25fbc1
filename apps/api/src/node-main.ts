import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { loadConfig } from './config.ts';
import { ConfigError } from './lib/errors.ts';
import { createLogger } from './lib/logger.ts';
import { DockerBackend, egressOf } from './sandbox/docker/backend.ts';
import { connectDocker } from './sandbox/docker/connect.ts';
import { issue, makeAuthority, PEER_NAME, type PeerRole } from './sandbox/node/pki.ts';
import { startNode } from './sandbox/node/server.ts';
import { TreeStore } from './sandbox/node/tree-store.ts';
import { WorkspaceMounts } from './sandbox/workspace-mounts.ts';

/**
 * A sandbox node (sandbox/node/server.ts): `node --import tsx apps/api/src/node-main.ts`.
 *
 * `credentials --dir DIR --role node|api --name NAME [--host ADDR]…` makes the installation's
 * CA in DIR (once) and a certificate for a node or an API replica signed by it, written as
 * DIR/NAME.pem and DIR/NAME.key beside DIR/ca.pem. Give a node its own pair and ca.pem, never
 * ca.key: whoever holds ca.key can make nodes and replicas.
 *
 * Without a command it serves: KILN_NODE_NAME, KILN_NODE_CERT, KILN_NODE_KEY, KILN_NODE_CA (file
 * paths), KILN_NODE_HOST (0.0.0.0), KILN_NODE_PORT (7443), KILN_NODE_MEMORY_MB and KILN_NODE_CPUS (what
 * sandboxes may be given together; default the host's); KILN_NODE_TREES_DIR (<KILN_DATA_DIR>/node-trees)
 * and KILN_NODE_TREES_MB (4096; 0: none) for the copies of workspace trees it keeps; Docker,
 * runtimes, egress and workspace mounts as the API reads them (DOCKER_HOST, KILN_EGRESS…,
 * KILN_SANDBOX_WORKSPACE_MOUNT…, docs/configuration.md). No database, no secrets key.
 */
const NodeEnv = z.object({
  KILN_NODE_NAME: z.string().regex(PEER_NAME, 'lower-case letters, digits, dots and dashes'),
  KILN_NODE_CERT: z.string().min(1),
  KILN_NODE_KEY: z.string().min(1),
  KILN_NODE_CA: z.string().min(1),
  KILN_NODE_HOST: z.string().min(1).default('0.0.0.0'),
  KILN_NODE_PORT: z.coerce.number().int().min(0).max(65_535).default(7443),
  // What of the host sandboxes may be given together (placement's capacity); default all of it.
  KILN_NODE_MEMORY_MB: z.coerce.number().int().min(64).optional(),
  KILN_NODE_CPUS: z.coerce.number().min(0.1).optional(),
  // The copies of workspace trees the node keeps (tree-store.ts), and what they may take on disk together.
  KILN_NODE_TREES_DIR: z.string().min(1).optional(),
  KILN_NODE_TREES_MB: z.coerce.number().int().min(0).default(4096),
});

async function credentials(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      dir: { type: 'string' },
      role: { type: 'string' },
      name: { type: 'string' },
      host: { type: 'string', multiple: true },
    },
  });
  const { dir, role, name } = values;
  if (!dir || (role !== 'node' && role !== 'api') || !name || !PEER_NAME.test(name)) {
    process.stderr.write('usage: credentials --dir DIR --role node|api --name NAME [--host ADDR]…\n');
    process.exit(2);
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const caCert = join(dir, 'ca.pem');
  const caKey = join(dir, 'ca.key');
  if (!existsSync(caKey)) {
    const ca = await makeAuthority();
    writeFileSync(caKey, ca.key, { mode: 0o600, flag: 'wx' });
    writeFileSync(caCert, ca.cert);
  }
  const made = await issue(
    { cert: readFileSync(caCert, 'utf8'), key: readFileSync(caKey, 'utf8') },
    { role: role as PeerRole, name, hosts: values.host },
  );
  writeFileSync(join(dir, `${name}.key`), made.key, { mode: 0o600 });
  writeFileSync(join(dir, `${name}.pem`), made.cert);
  process.stdout.write(
    `${join(dir, `${name}.pem`)} and ${join(dir, `${name}.key`)}: ${role === 'api' ? 'an API replica' : 'a node'} named ${name}\n`,
  );
}

async function serve(): Promise<void> {
  const env = NodeEnv.safeParse(process.env);
  let config: ReturnType<typeof loadConfig>;
  try {
    if (!env.success) throw new ConfigError(env.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`));
    config = loadConfig();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    process.stderr.write(`kiln node: cannot start, the configuration has ${err.problems.length} problem(s):\n`);
    for (const p of err.problems) process.stderr.write(`  ${p}\n`);
    process.exit(2);
  }
  const e = env.data;
  const logger = createLogger(config.logLevel);
  const backend = new DockerBackend(connectDocker(config.dockerHost), {
    egress: egressOf(config, logger),
    fairShare: config.sandbox.fairShare && { ...config.sandbox.fairShare, log: logger },
    node: e.KILN_NODE_NAME,
    probeImage: config.sandboxImage,
  });
  // Workspace mounts of this host (KILN_SANDBOX_WORKSPACE_MOUNT and its siblings, as on one
  // machine), filled from the copies of workspace trees the node keeps; none: the tar path.
  const mounts =
    e.KILN_NODE_TREES_MB > 0
      ? await WorkspaceMounts.open(
          { ...config.sandbox.workspaceMount, hostMounts: (await backend.capabilities()).hostWorkspaceMounts },
          e.KILN_NODE_NAME,
          logger,
        )
      : null;
  const trees = mounts && {
    mounts,
    store: new TreeStore(
      resolve(e.KILN_NODE_TREES_DIR ?? join(config.dataDir, 'node-trees')),
      e.KILN_NODE_TREES_MB * 1024 * 1024,
      logger,
    ),
  };
  const node = await startNode({
    trees: trees ?? undefined,
    backend,
    credentials: {
      cert: readFileSync(e.KILN_NODE_CERT, 'utf8'),
      key: readFileSync(e.KILN_NODE_KEY, 'utf8'),
      ca: readFileSync(e.KILN_NODE_CA, 'utf8'),
    },
    host: e.KILN_NODE_HOST,
    port: e.KILN_NODE_PORT,
    reserve: { memoryMb: e.KILN_NODE_MEMORY_MB, cpus: e.KILN_NODE_CPUS },
    maxPausedMs: config.sandbox.pause.maxTtlS * 1000,
    log: logger,
  });
  process.stdout.write(`Kiln node ${e.KILN_NODE_NAME} is listening on ${node.url}\n`);
  for (const signal of ['SIGINT', 'SIGTERM'] as const)
    process.once(signal, () => {
      node.close().then(
        () => process.exit(0),
        () => process.exit(1),
      );
    });
}

const [command, ...rest] = process.argv.slice(2);
if (command === 'credentials') await credentials(rest);
else if (command === undefined || command === 'serve') await serve();
else {
  process.stderr.write(`kiln node: unknown command ${command} (serve, credentials)\n`);
  process.exit(2);
}
