import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const NONCE_BYTES = 12;
const TAG_BYTES = 16;
const KEY_BYTES = 32;

/** 32 bytes written as base64 (standard or url-safe) or hex; undefined when it is neither. */
export function parseKey(text: string): Buffer | undefined {
  const t = text.trim();
  if (/^[0-9a-fA-F]{64}$/.test(t)) return Buffer.from(t, 'hex');
  if (!/^[A-Za-z0-9+/_-]{43}=?$/.test(t)) return undefined;
  const key = Buffer.from(t.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
  return key.length === KEY_BYTES ? key : undefined;
}

/**
 * The installation's own key when `KILN_SECRETS_KEY` is unset: generated once into
 * `<dataDir>/secrets.key` (mode 0600) and read back after. The file is created exclusively and
 * never overwritten: a key that cannot be read back is an error, never a reason to make a new
 * one (every secret sealed with the old one would be lost).
 */
export function installationSecretsKey(dataDir: string): Buffer {
  const file = join(dataDir, 'secrets.key');
  try {
    return readKeyFile(file);
  } catch (err) {
    if ((err as { code?: string }).code !== 'ENOENT') throw err;
  }
  mkdirSync(dataDir, { recursive: true });
  try {
    writeFileSync(file, `${randomBytes(KEY_BYTES).toString('base64')}\n`, { mode: 0o600, flag: 'wx' });
    chmodSync(file, 0o600);
  } catch (err) {
    // Another process made it first: its key is the one.
    if ((err as { code?: string }).code !== 'EEXIST') throw err;
  }
  return readKeyFile(file);
}

function readKeyFile(file: string): Buffer {
  const key = parseKey(readFileSync(file, 'utf8'));
  if (!key) throw new Error(`${file} does not hold a 32-byte key (base64 or hex)`);
  return key;
}

/** The UTF-8 size of a sealed value (GCM's ciphertext is as long as its plaintext). */
export const sealedValueBytes = (sealed: string) => Buffer.byteLength(sealed, 'base64') - NONCE_BYTES - TAG_BYTES;

/**
 * AES-256-GCM with a fresh random nonce per value; the workspace id is the associated data,
 * so a sealed value copied to another workspace's row does not open. Sealed form: base64 of
 * nonce, ciphertext, tag.
 */
export class Sealer {
  constructor(private readonly key: Buffer) {
    if (key.length !== KEY_BYTES) throw new Error(`the secrets key must be ${KEY_BYTES} bytes`);
  }

  seal(workspaceId: string, value: string): string {
    const nonce = randomBytes(NONCE_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.key, nonce);
    cipher.setAAD(Buffer.from(workspaceId, 'utf8'));
    const body = Buffer.concat([cipher.update(value, 'utf8'), cipher.final()]);
    return Buffer.concat([nonce, body, cipher.getAuthTag()]).toString('base64');
  }

  /** Throws when the row was not sealed for this workspace with this key (or was altered). */
  open(workspaceId: string, sealed: string): string {
    const raw = Buffer.from(sealed, 'base64');
    if (raw.length < NONCE_BYTES + TAG_BYTES) throw new Error('sealed secret too short');
    const decipher = createDecipheriv('aes-256-gcm', this.key, raw.subarray(0, NONCE_BYTES));
    decipher.setAAD(Buffer.from(workspaceId, 'utf8'));
    decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES));
    const body = raw.subarray(NONCE_BYTES, raw.length - TAG_BYTES);
    return Buffer.concat([decipher.update(body), decipher.final()]).toString('utf8');
  }
}
