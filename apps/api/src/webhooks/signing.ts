/**
 * Signatures as the Standard Webhooks specification (standardwebhooks.com) defines them, so
 * receivers can verify with its libraries in any language: the secret is `whsec_` + base64 of
 * 24 random bytes; the signature is `v1,` + base64 of HMAC-SHA256, keyed with the decoded
 * secret, over `${webhook-id}.${webhook-timestamp}.${body}` — the message id and the time are
 * inside the MAC, so a captured request cannot be replayed under another id or much later.
 */
import { createHmac, randomBytes } from 'node:crypto';

const PREFIX = 'whsec_';

export function newSecret(): string {
  return `${PREFIX}${randomBytes(24).toString('base64')}`;
}

/** The `webhook-signature` header's value for one request. */
function sign(secret: string, id: string, timestampS: number, body: string): string {
  const key = Buffer.from(secret.startsWith(PREFIX) ? secret.slice(PREFIX.length) : secret, 'base64');
  const mac = createHmac('sha256', key).update(`${id}.${timestampS}.${body}`).digest('base64');
  return `v1,${mac}`;
}

/** The three headers of a signed request (and the content type). */
export function signedHeaders(secret: string, id: string, timestampS: number, body: string): Record<string, string> {
  return {
    'content-type': 'application/json',
    'user-agent': 'Kiln-Webhooks/1',
    'webhook-id': id,
    'webhook-timestamp': String(timestampS),
    'webhook-signature': sign(secret, id, timestampS, body),
  };
}
