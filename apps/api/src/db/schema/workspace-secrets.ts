import { pgTable, primaryKey, text } from 'drizzle-orm/pg-core';
import { createdAt, teamId, ts } from './columns.ts';
import { workspaces } from './workspaces.ts';

/**
 * A workspace's secrets, set as environment variables of the code it runs. `sealed` is never
 * the value: it is base64 of nonce (12 bytes), AES-256-GCM ciphertext and tag (16 bytes), with
 * the workspace id as associated data (see secrets/sealing.ts).
 */
export const workspaceSecrets = pgTable(
  'workspace_secrets',
  {
    workspaceId: text('workspace_id')
      .notNull()
      .references(() => workspaces.id, { onDelete: 'cascade' }),
    name: text('name').notNull(),
    teamId: teamId(),
    sealed: text('sealed').notNull(),
    createdAt: createdAt(),
    updatedAt: ts('updated_at').notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.workspaceId, t.name] })],
);
