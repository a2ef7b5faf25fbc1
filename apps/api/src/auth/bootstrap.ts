import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { and, eq, isNull } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { apiKeys } from '../db/schema/index.ts';
import { generateKey, hashKey, insertKey } from './keys.ts';

export interface BootstrapResult {
  /** The new key, only when this start created it (it is shown once). */
  createdKey?: string;
  keyFile?: string;
}

/**
 * Makes sure an org-admin key exists. `KILN_ADMIN_KEY` is registered as-is; otherwise, on an
 * empty database, a key is generated and written to `<dataDir>/admin.key` with mode 0600.
 */
export async function bootstrapAdminKey(
  db: Db,
  opts: { adminKey?: string; dataDir: string },
): Promise<BootstrapResult> {
  if (opts.adminKey) {
    const [known] = await db
      .select({ id: apiKeys.id })
      .from(apiKeys)
      .where(eq(apiKeys.keyHash, hashKey(opts.adminKey)));
    if (!known)
      await insertKey(db, {
        teamId: null,
        name: 'KILN_ADMIN_KEY',
        role: 'org_admin',
        canApprove: true,
        key: opts.adminKey,
      });
    return {};
  }
  const [existing] = await db
    .select({ id: apiKeys.id })
    .from(apiKeys)
    .where(and(eq(apiKeys.role, 'org_admin'), isNull(apiKeys.revokedAt)))
    .limit(1);
  if (existing) return {};
  const key = generateKey('admin');
  mkdirSync(opts.dataDir, { recursive: true });
  const keyFile = join(opts.dataDir, 'admin.key');
  // Written before the row exists: a crash in between leaves a stale file, never a key nobody knows.
  writeFileSync(keyFile, `${key}\n`, { mode: 0o600 });
  chmodSync(keyFile, 0o600);
  await insertKey(db, { teamId: null, name: 'bootstrap', role: 'org_admin', canApprove: true, key });
  return { createdKey: key, keyFile };
}
