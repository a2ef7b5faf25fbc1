import { createHmac, hkdfSync, timingSafeEqual } from 'node:crypto';
import { and, desc, eq, gt, ne, sql } from 'drizzle-orm';
import type { Context, MiddlewareHandler } from 'hono';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { apiReplicas, approvals, sandboxes } from '../db/schema/index.ts';
import type { ForwardOutcome } from '../metrics/metrics.ts';
import { markRemoved } from '../sandbox/rows.ts';

/**
 * The header a replica puts on a request it sends on (`<instance>.<MAC>`, see `Replicas.mark`):
 * the receiver serves it itself, never sends it on again.
 */
const FORWARDED_BY = 'kiln-forwarded-by';

export interface ReplicaOptions {
  /** This replica (KILN_INSTANCE_ID). */
  instance: string;
  /**
   * The installation's secrets key, which every replica has: the mark a replica puts on a request
   * it sends on is keyed from it, so no caller can forge one.
   */
  secretsKey: Buffer;
  /** How often it says it is up and reads who else is. */
  heartbeatMs?: number;
  /** A replica not heard from for this long is not sent anything (its sandboxes' sessions get new ones). */
  liveMs?: number;
  log?: Logger;
}

/**
 * The API replicas sharing this database, as this one knows them: each says every few seconds
 * that it is up and where it is reached (`api_replicas`), and reads the others. Alone (no other
 * heard lately), nothing is ever looked up for a request.
 */
export class Replicas {
  /** The others heard within `liveMs`: instance → URL. */
  private peers = new Map<string, string>();
  /** Whether `peers` was read from the database (this replica is open). */
  private read = false;
  private timer?: NodeJS.Timeout;
  private url?: string;
  private readonly markKey: Buffer;

  constructor(
    private readonly db: Db,
    private readonly o: ReplicaOptions,
  ) {
    this.markKey = Buffer.from(hkdfSync('sha256', o.secretsKey, Buffer.alloc(0), 'kiln replica forwarding', 32));
  }

  /** The mark this replica puts on a request it sends on: its name and a MAC of it. */
  get mark(): string {
    return `${this.o.instance}.${this.macOf(this.o.instance)}`;
  }

  /** Whether a request's mark was made by a replica of this installation (this one or another). */
  marked(value: string | undefined): boolean {
    const dot = value?.lastIndexOf('.') ?? -1;
    if (!value || dot <= 0) return false;
    const want = Buffer.from(this.macOf(value.slice(0, dot)));
    const got = Buffer.from(value.slice(dot + 1));
    return got.length === want.length && timingSafeEqual(got, want);
  }

  private macOf(instance: string): string {
    return createHmac('sha256', this.markKey).update(instance).digest('base64url');
  }

  get instance(): string {
    return this.o.instance;
  }

  /** Whether no other replica has been heard from lately. */
  get alone(): boolean {
    return this.peers.size === 0;
  }

  /**
   * Whether another instance is known to be gone: this replica has read who is up (it says where
   * it is reached) and that one was not heard from within `liveMs`. False before the first read.
   */
  gone(instance: string): boolean {
    return this.read && instance !== this.o.instance && !this.peers.has(instance);
  }

  /** The address of another replica heard from lately; undefined for this one or one not heard. */
  urlOf(instance: string): string | undefined {
    return this.peers.get(instance);
  }

  /** Says where this replica is reached, then again every heartbeat. */
  async open(url: string): Promise<void> {
    this.url = url;
    await this.beat();
    this.timer = setInterval(() => {
      this.beat().catch((err) => this.o.log?.warn({ err }, 'could not record this replica as up'));
    }, this.o.heartbeatMs ?? 5000);
    this.timer.unref();
  }

  /** Records this replica as up and reads the others that are, by the database's clock, which every replica shares. */
  async beat(): Promise<void> {
    if (!this.url) return;
    await this.db
      .insert(apiReplicas)
      .values({ instance: this.o.instance, url: this.url, heardAt: sql`now()` })
      .onConflictDoUpdate({ target: apiReplicas.instance, set: { url: this.url, heardAt: sql`now()` } });
    const liveS = (this.o.liveMs ?? 15_000) / 1000;
    const rows = await this.db
      .select({ instance: apiReplicas.instance, url: apiReplicas.url })
      .from(apiReplicas)
      .where(
        and(
          ne(apiReplicas.instance, this.o.instance),
          gt(apiReplicas.heardAt, sql`now() - make_interval(secs => ${liveS})`),
        ),
      );
    this.peers = new Map(rows.map((r) => [r.instance, r.url]));
    this.read = true;
  }

  /** No longer up: the others stop sending it requests at their next heartbeat. */
  async close(): Promise<void> {
    clearInterval(this.timer);
    this.peers.clear();
    this.read = false;
    if (this.url) await this.db.delete(apiReplicas).where(eq(apiReplicas.instance, this.o.instance));
    this.url = undefined;
  }
}

const SESSION_PATH = /^\/v1\/sessions\/([^/]+)(?:\/|$)/;
const APPROVAL_PATH = /^\/v1\/approvals\/([^/]+)$/;
/** Headers that describe one hop's connection or encoding, not the request or answer. */
const HOP = ['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive', 'content-encoding'];

/** The session a request is about: in its path, or, for an approval's decision, the approval's. */
async function sessionOf(db: Db, c: Context): Promise<string | undefined> {
  const session = SESSION_PATH.exec(c.req.path)?.[1];
  if (session) return session;
  const approval = c.req.method === 'POST' ? APPROVAL_PATH.exec(c.req.path)?.[1] : undefined;
  if (!approval) return undefined;
  const [row] = await db
    .select({ sessionId: approvals.sessionId })
    .from(approvals)
    .where(eq(approvals.id, approval))
    .limit(1);
  return row?.sessionId;
}

/**
 * Sends a request about a session on to the replica that holds the session's live sandbox (its
 * runner stream is that replica's), and streams that replica's answer back: an execution, a file
 * of the sandbox, a message that starts a run, an approval's decision that resumes one, a
 * keepalive or an end then reach the same interpreter whichever replica the load balancer picked.
 * The request goes on as it came (method, path, query, headers with the caller's key, body) and
 * is authenticated, limited, audited and answered there. A request a replica sent on is served
 * where it arrives, as is one whose holder cannot be reached: its sandbox is then marked removed
 * (`replica_unreachable`; the holder's reaper removes the container if it is still there), and
 * the session gets a new sandbox here and says so, as after any lost sandbox.
 */
export function forwardToHolder(
  db: Db,
  replicas: Replicas,
  /** Whether this replica holds the session's live sandbox: then nothing is looked up. */
  holds: (sessionId: string) => boolean,
  o: { log?: Logger; counted?: (outcome: ForwardOutcome) => void } = {},
): MiddlewareHandler {
  const { log, counted } = o;
  return async (c, next) => {
    if (replicas.alone) return next();
    // Sent on by a replica: served here. (A mark no replica made is no mark: sent on as usual.)
    if (replicas.marked(c.req.header(FORWARDED_BY))) {
      counted?.('received');
      return next();
    }
    const session = await sessionOf(db, c);
    if (!session || holds(session)) return next();
    const [row] = await db
      .select({ id: sandboxes.id, instance: sandboxes.instance })
      .from(sandboxes)
      .where(and(eq(sandboxes.sessionId, session), ne(sandboxes.state, 'removed')))
      .orderBy(desc(sandboxes.createdAt))
      .limit(1);
    const url = row && row.instance !== replicas.instance ? replicas.urlOf(row.instance) : undefined;
    if (!url) return next();
    // Read once, so that it can still be served here when the holder cannot be reached.
    const body = c.req.method === 'GET' || c.req.method === 'HEAD' ? undefined : await c.req.arrayBuffer();
    const headers = new Headers(c.req.raw.headers);
    for (const h of HOP) headers.delete(h);
    headers.set(FORWARDED_BY, replicas.mark);
    const target = new URL(c.req.url);
    let res: Response;
    try {
      res = await fetch(`${url}${target.pathname}${target.search}`, {
        method: c.req.method,
        headers,
        body,
        signal: c.req.raw.signal,
        redirect: 'manual',
      });
    } catch (err) {
      if (c.req.raw.signal.aborted) throw err;
      // Its runner is out of reach: the sandbox counts as lost, and the session's next execution here gets a new one and says so.
      log?.warn({ err, session, holder: row!.instance }, "could not reach the replica holding the session's sandbox");
      await markRemoved(db, [row!.id], 'replica_unreachable');
      counted?.('unreachable');
      return next();
    }
    counted?.('sent');
    const out = new Headers(res.headers);
    for (const h of HOP) out.delete(h);
    return new Response(res.body, { status: res.status, headers: out });
  };
}
