import { pgTable, text } from 'drizzle-orm/pg-core';
import { ts } from './columns.ts';

/**
 * The API replicas sharing this database (docs/scaling.md): the address each is reached at by
 * the others, and when it last said it is up. A request about a session that reaches one replica
 * while another holds the session's sandbox is sent on to that one (http/replicas.ts).
 */
export const apiReplicas = pgTable('api_replicas', {
  /** KILN_INSTANCE_ID: the instance its sandboxes' rows and containers carry (column `owner`, label `kiln.owner`). */
  instance: text('instance').primaryKey(),
  /** `http://host:port`, as the other replicas reach it (KILN_REPLICA_URL). */
  url: text('url').notNull(),
  heardAt: ts('heard_at').notNull(),
});
