import { and, asc, eq, sql } from 'drizzle-orm';
import type { Db } from '../db/client.ts';
import { workspaceSecrets, workspaces } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { MAX_SECRETS, MAX_TOTAL_VALUE_BYTES } from './names.ts';
import { type Sealer, sealedValueBytes } from './sealing.ts';

export interface SecretInfo {
  name: string;
  createdAt: Date;
  updatedAt: Date;
}

/** A secret as the sandbox gets it: the only place values exist in the clear. */
export interface OpenSecret {
  name: string;
  value: string;
}

/** The columns a route may see: never `sealed`. */
const INFO = {
  name: workspaceSecrets.name,
  createdAt: workspaceSecrets.createdAt,
  updatedAt: workspaceSecrets.updatedAt,
};

/** Where executions get their workspace's secrets, and the agent's prompt their names. */
export interface SecretSource {
  openAll(workspaceId: string): Promise<OpenSecret[]>;
  names(workspaceId: string): Promise<string[]>;
}

/**
 * A workspace's secrets, sealed at rest (see sealing.ts). Values go in through `put` and out
 * only through `openAll`, for the sandbox: nothing here returns a value to a route.
 * Callers check that the workspace is the team's; every query is scoped by the team as well.
 */
export class SecretStore implements SecretSource {
  constructor(
    private readonly db: Db,
    private readonly sealer: Sealer,
  ) {}

  /** Creates or replaces a secret; `created` tells which. */
  async put(
    teamId: string,
    workspaceId: string,
    name: string,
    value: string,
  ): Promise<SecretInfo & { created: boolean }> {
    const sealed = this.sealer.seal(workspaceId, value);
    // The workspace's row is locked while its secrets are counted and written: concurrent PUTs
    // of new names are checked one after another, so none of them can take it past the limits.
    return this.db.transaction(async (t) => {
      const tx = t as unknown as Db;
      await tx.execute(sql`select id from ${workspaces} where id = ${workspaceId} for update`);
      const others = await tx
        .select({ name: workspaceSecrets.name, sealed: workspaceSecrets.sealed })
        .from(workspaceSecrets)
        .where(and(eq(workspaceSecrets.teamId, teamId), eq(workspaceSecrets.workspaceId, workspaceId)));
      const existing = others.some((o) => o.name === name);
      if (!existing && others.length >= MAX_SECRETS)
        throw new ApiError('conflict', `a workspace holds at most ${MAX_SECRETS} secrets; delete one first`);
      const total = others
        .filter((o) => o.name !== name)
        .reduce((n, o) => n + sealedValueBytes(o.sealed), Buffer.byteLength(value, 'utf8'));
      if (total > MAX_TOTAL_VALUE_BYTES)
        throw new ApiError(
          'conflict',
          `a workspace's secret values may total at most ${MAX_TOTAL_VALUE_BYTES} bytes (this would make ${total})`,
        );
      const [row] = await tx
        .insert(workspaceSecrets)
        .values({ workspaceId, teamId, name, sealed })
        .onConflictDoUpdate({
          target: [workspaceSecrets.workspaceId, workspaceSecrets.name],
          set: { sealed, updatedAt: sql`now()` },
        })
        .returning({ createdAt: workspaceSecrets.createdAt, updatedAt: workspaceSecrets.updatedAt });
      return { name, createdAt: row!.createdAt, updatedAt: row!.updatedAt, created: !existing };
    });
  }

  async list(teamId: string, workspaceId: string): Promise<SecretInfo[]> {
    return this.db
      .select(INFO)
      .from(workspaceSecrets)
      .where(and(eq(workspaceSecrets.teamId, teamId), eq(workspaceSecrets.workspaceId, workspaceId)))
      .orderBy(asc(workspaceSecrets.name));
  }

  /** 404 when there is no such secret. */
  async remove(teamId: string, workspaceId: string, name: string): Promise<SecretInfo> {
    const [row] = await this.db
      .delete(workspaceSecrets)
      .where(this.one(teamId, workspaceId, name))
      .returning(INFO);
    if (!row) throw ApiError.notFound('secret');
    return row;
  }

  /**
   * Every secret of a workspace in the clear, for one execution. A row that does not open (sealed
   * with another key, or copied from another workspace) is an error: code must not run without
   * the secrets it was given, nor with values nobody set for this workspace.
   */
  async openAll(workspaceId: string): Promise<OpenSecret[]> {
    const rows = await this.db
      .select({ name: workspaceSecrets.name, sealed: workspaceSecrets.sealed })
      .from(workspaceSecrets)
      .where(eq(workspaceSecrets.workspaceId, workspaceId))
      .orderBy(asc(workspaceSecrets.name));
    return rows.map((r) => {
      try {
        return { name: r.name, value: this.sealer.open(workspaceId, r.sealed) };
      } catch {
        throw new SecretUnreadable(r.name);
      }
    });
  }

  /** The names of a workspace's secrets (never a value), for the agent's prompt. */
  async names(workspaceId: string): Promise<string[]> {
    const rows = await this.db
      .select({ name: workspaceSecrets.name })
      .from(workspaceSecrets)
      .where(eq(workspaceSecrets.workspaceId, workspaceId))
      .orderBy(asc(workspaceSecrets.name));
    return rows.map((r) => r.name);
  }

  private one(teamId: string, workspaceId: string, name: string) {
    return and(
      eq(workspaceSecrets.teamId, teamId),
      eq(workspaceSecrets.workspaceId, workspaceId),
      eq(workspaceSecrets.name, name),
    );
  }
}

/** A sealed secret that does not open with this server's key for this workspace. */
export class SecretUnreadable extends Error {
  constructor(readonly secretName: string) {
    super(
      `the workspace secret ${secretName} cannot be decrypted (it was sealed with another key or for another workspace); set it again`,
    );
  }
}
