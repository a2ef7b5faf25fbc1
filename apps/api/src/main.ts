import { loadConfig, type Config } from './config.ts';
import { ConfigError } from './lib/errors.ts';
import { createLogger } from './lib/logger.ts';
import { startServer } from './server.ts';

let config: Config;
try {
  config = loadConfig();
} catch (err) {
  if (!(err instanceof ConfigError)) throw err;
  process.stderr.write(`kiln: cannot start, the configuration has ${err.problems.length} problem(s):\n`);
  for (const p of err.problems) process.stderr.write(`  ${p}\n`);
  process.exit(2);
}

const logger = createLogger(config.logLevel);
const server = await startServer(config, logger).catch((err: Error) => {
  logger.fatal({ err }, 'start-up failed');
  process.stderr.write(`kiln: start-up failed: ${err.message}\n`);
  process.exit(1);
});

const lines = [
  `Kiln is listening on ${server.url}`,
  `  dashboard: ${server.url}/ (paste a key)`,
  `  API reference: ${server.url}/docs`,
  `  database: ${server.database.driver}`,
];
if (server.bootstrap.createdKey) {
  lines.push(
    `  org-admin key (shown once, also saved to ${server.bootstrap.keyFile}):`,
    `    ${server.bootstrap.createdKey}`,
  );
}
process.stdout.write(`\n${lines.join('\n')}\n\n`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    logger.info({ signal }, 'shutting down');
    server.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  });
}
