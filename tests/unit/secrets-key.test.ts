import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../apps/api/src/config.ts';
import { installationSecretsKey, parseKey, Sealer } from '../../apps/api/src/secrets/sealing.ts';

describe('the secrets key', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-secrets-key-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('reads 32 bytes as base64, url-safe base64 or hex, and nothing else', () => {
    const key = randomBytes(32);
    for (const text of [key.toString('base64'), key.toString('base64url'), key.toString('hex')])
      expect(parseKey(text)).toEqual(key);
    for (const text of ['', 'short', randomBytes(16).toString('base64'), randomBytes(31).toString('hex')])
      expect(parseKey(text)).toBeUndefined();
    expect(() => loadConfig({ KILN_SECRETS_KEY: 'not-a-key' })).toThrow(/KILN_SECRETS_KEY.*value hidden/);
  });

  it('is made once into the data directory with mode 0600 and never overwritten', () => {
    const first = installationSecretsKey(dir);
    const file = join(dir, 'secrets.key');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(installationSecretsKey(dir)).toEqual(first);
    writeFileSync(file, 'garbage\n');
    expect(() => installationSecretsKey(dir)).toThrow(/does not hold a 32-byte key/);
    expect(readFileSync(file, 'utf8')).toBe('garbage\n');
  });

  it('seals each value with its own nonce, bound to its workspace', () => {
    const s = new Sealer(randomBytes(32));
    const a = s.seal('ws_a', 'value-1234');
    expect(s.seal('ws_a', 'value-1234')).not.toBe(a);
    expect(s.open('ws_a', a)).toBe('value-1234');
    expect(() => s.open('ws_b', a)).toThrow();
    expect(() => new Sealer(randomBytes(32)).open('ws_a', a)).toThrow();
  });
});
