import type { CacheNews } from '../db/cache-news.ts';
import type { Db } from '../db/client.ts';
import type { Principal } from './principal.ts';
import { authenticate, hashKey } from './keys.ts';

const MAX_ENTRIES = 10_000;

/**
 * Remembers resolved keys for a few seconds, so a busy client costs no database lookup per
 * request. A revocation is news (`CacheNews`): it takes effect at once here and, as soon as the
 * notification arrives, on every other replica; `ttlMs` bounds it when a notification is lost.
 */
export class KeyCache {
  private entries = new Map<string, { principal: Principal; at: number }>();

  constructor(
    private readonly db: Db,
    news: CacheNews,
    private readonly ttlMs = 5_000,
  ) {
    news.on('key', (keyId) => this.forget(keyId));
  }

  async authenticate(key: string): Promise<Principal | null> {
    const hash = hashKey(key);
    const hit = this.entries.get(hash);
    if (hit && Date.now() - hit.at < this.ttlMs) return hit.principal;
    const principal = await authenticate(this.db, key);
    if (principal) {
      if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
      this.entries.set(hash, { principal, at: Date.now() });
    } else {
      this.entries.delete(hash);
    }
    return principal;
  }

  private forget(keyId: string): void {
    for (const [hash, e] of this.entries) if (e.principal.keyId === keyId) this.entries.delete(hash);
  }
}
