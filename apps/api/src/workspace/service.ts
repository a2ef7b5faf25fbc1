import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { and, desc, eq, lt, sql, type SQL } from 'drizzle-orm';
import type { Logger } from 'pino';
import type { Db } from '../db/client.ts';
import { commits, workspaces } from '../db/schema/index.ts';
import { ApiError } from '../lib/errors.ts';
import { memoryEntries, type MemoryBudget } from '../memory/budget.ts';
import type { VectorFill } from '../memory/vectors.ts';
import { boilerplateLines, isBuiltin } from '../memory/chunker.ts';
import { indexedFiles, reindexAll, reindexPaths } from '../memory/indexer.ts';
import {
  type QueryVector,
  searchMemory,
  type SearchOptions,
  type SearchPage,
  startQueryVector,
} from '../memory/search.ts';
import { type SharedLock, WorkspaceLock } from './lock.ts';
import { WorkspaceUpkeep } from './upkeep.ts';
import { listSkills, type SkillInfo } from './skills.ts';
import { checkRelativePath, isBuiltinSkillPath } from './paths.ts';
import type { CommitKind } from './kinds.ts';
import type { WorkspaceRepos, CommitInfo, CommitOutcome, DirEntry, Provenance } from './git-repos.ts';
import type { SettingsPatch } from './settings.ts';
import {
  checkStep,
  checkTotal,
  DEFAULT_QUOTA_MAX,
  effectiveQuota,
  QuotaError,
  readForSandboxes,
  type Quota,
  type QuotaMax,
} from './quota.ts';
import { createWorkspace, reserveWorkspaceBytes, TeamBytesExceeded, type WorkspaceRow } from './records.ts';

export type CommitRow = typeof commits.$inferSelect;

export interface WorkspaceServiceOptions {
  maxFileBytes: number;
  /** Server-wide maxima of every workspace's quota settings (default: the KILN_* defaults). */
  maxQuota?: QuotaMax;
  /** The memory vectors' model and their background fill (none: words only). */
  vectors?: VectorFill;
  /** Per team: how many live workspaces, and how many bytes of working trees together (default: no cap). */
  perTeam?: { count: number; bytes: number };
  /** The database's lock across replicas (Postgres); without it writes are serialised in this process only. */
  sharedLock?: SharedLock;
  /** Told of every commit, with the committed files' contents (the sandbox engine updates its copies). */
  onCommit?: CommitListener;
  /** The clock memory search measures recency by, and spaces its warnings with (default: the system's). */
  now?: () => number;
}

/** A search answered by words alone because its vector failed or was late is logged at most this often (of each kind). */
const VECTOR_WARNING_EVERY_MS = 60_000;

const budgetOf = (ws: WorkspaceRow): MemoryBudget => ({
  maxEntries: ws.settings.evolution.memory_max_entries,
  maxBytes: ws.settings.evolution.memory_max_bytes,
});

/**
 * Everything that changes a workspace goes through here: under the workspace lock, the change
 * is written, committed with provenance, mirrored into the `commits` table, the workspace head
 * moved and the memory index refreshed for the paths it touched.
 */
/**
 * One workspace's working tree, as the callback of `WorkspaceService.change` gets it: the writes
 * land in the commit the change makes (the callback runs under the workspace lock).
 */
export interface WorkingTree {
  readFile(path: string): Promise<Buffer>;
  writeFile(path: string, data: Buffer): Promise<void>;
  deleteFile(path: string): Promise<void>;
}

/** Reading a workspace's files without changing them (evolutions, routes, the agent's prompt). */
export interface WorkspaceReader {
  readFile(path: string): Promise<Buffer>;
  listDir(path: string): Promise<DirEntry[]>;
}

/** Told about every commit, with the session it came from (so its own sandbox is not updated twice). */
type CommitListener = (
  workspaceId: string,
  files: { path: string; data: Buffer | null }[],
  originSession?: string,
) => void;

export class WorkspaceService {
  private readonly lock: WorkspaceLock;
  private boilerplate: Promise<ReadonlySet<string>> | undefined;
  private readonly upkeep: WorkspaceUpkeep;
  /** Per kind ('late', 'failed'): when it was last logged, and the searches since that were not. */
  private readonly vectorWarnings = new Map<string, { at: number; unlogged: number }>();
  private searchWarm: Promise<void> | undefined;

  constructor(
    private readonly db: Db,
    private readonly repos: WorkspaceRepos,
    private readonly opts: WorkspaceServiceOptions,
    private readonly log: Logger,
  ) {
    this.lock = new WorkspaceLock(opts.sharedLock);
    this.upkeep = new WorkspaceUpkeep({
      db,
      repos,
      lock: this.lock,
      log,
      vectors: opts.vectors,
      record: (ws, c) => this.record(ws, c),
      indexTarget: (ws) => this.indexTarget(ws),
    });
  }

  /** A new workspace: the row, then its repository from the template, then the first commit's mirror. */
  async create(teamId: string, input: { name: string; settings?: SettingsPatch }): Promise<WorkspaceRow> {
    const row = await createWorkspace(this.db, teamId, input, this.opts.perTeam?.count);
    try {
      const first = await this.lock.run(row.id, async () => {
        const c = await this.repos.init(row.id);
        // The template's files count against the team's bytes from the start.
        await this.checkWorkspaceQuota(row, this.quotaOf(row), []).catch((err: Error) => {
          throw err instanceof TeamBytesExceeded ? new ApiError('conflict', err.message) : err;
        });
        await this.record(row, c);
        return c;
      });
      await reindexAll(this.db, await this.indexTarget(row), this.opts.vectors);
      return { ...row, head: first.sha };
    } catch (err) {
      // Nothing of a workspace that could not be made is left: neither its row nor its directory.
      await this.db.delete(workspaces).where(eq(workspaces.id, row.id));
      await rm(this.repos.dirOf(row.id), { recursive: true, force: true });
      throw err;
    }
  }

  /** The current content of paths (null for deleted ones), for updating sandbox copies. */
  private contents(workspaceId: string, paths: string[]) {
    return readForSandboxes(
      (p) => this.repos.readFile(workspaceId, p),
      paths,
      (path, err) =>
        this.log.warn(
          { workspace: workspaceId, path, err: err.message },
          'could not read a committed file for the sandbox copies',
        ),
    );
  }

  /** What one step may change and the workspace may hold, capped server-wide. */
  quotaOf(ws: Pick<WorkspaceRow, 'settings'>): Quota {
    return effectiveQuota(ws.settings, this.opts.maxQuota ?? DEFAULT_QUOTA_MAX);
  }

  private async announce(workspaceId: string, paths: string[], originSession?: string): Promise<void> {
    const listener = this.opts.onCommit;
    if (!listener || !paths.length) return;
    listener(workspaceId, await this.contents(workspaceId, paths), originSession);
  }

  /**
   * Applies what code in a sandbox changed under /workspace to the repository and commits it.
   * Returns the commit and the files whose sandbox copy must be put back in line with the host
   * (changes that were refused or redacted).
   */
  async applySandboxChanges(
    ws: WorkspaceRow,
    changes: { changed: { path: string; data: string }[]; deleted: string[]; over?: 'files' | 'bytes' },
    prov: Provenance,
  ): Promise<{
    outcome: CommitOutcome;
    pushBack: { path: string; data: Buffer | null }[];
    ignored: { path: string; reason: string }[];
    quotaExceeded?: string;
  }> {
    const ignored: { path: string; reason: string }[] = [];
    const quota = this.quotaOf(ws);
    // Over a quota, nothing of the step is taken: checked before the first write, under the lock.
    const decoded = changes.changed.map((f) => ({ path: f.path, data: Buffer.from(f.data, 'base64') }));
    const step = {
      files: changes.changed.length + changes.deleted.length,
      bytes: decoded.reduce((n, f) => n + f.data.length, 0),
      over: changes.over,
    };
    let outcome: CommitOutcome;
    try {
      checkStep(quota, step);
      outcome = await this.change(
        ws,
        prov,
        async () => {
          await this.checkWorkspaceQuota(ws, quota, [
            ...decoded.map((f) => [f.path, f.data.length] as const),
            ...changes.deleted.map((p) => [p, null] as const),
          ]);
          await this.applyDecoded(ws, decoded, changes.deleted, ignored);
        },
        { originSession: prov.sessionId },
      );
    } catch (err) {
      if (!(err instanceof QuotaError)) throw err;
      return {
        outcome: { commit: null, redactions: [], refused: [] },
        pushBack: [],
        ignored,
        quotaExceeded: err.message,
      };
    }
    // Refused and redacted files are put back as the repository has them; files that were not
    // taken at all (too large) stay in the sandbox as they are, uncommitted.
    const fix = [...outcome.refused.map((r) => r.path), ...outcome.redactions.map((r) => r.path)];
    return {
      outcome,
      pushBack: await this.contents(
        ws.id,
        [...new Set(fix)].filter((p) => !p.includes('..')),
      ),
      ignored,
    };
  }

  /** The working tree after writing (size) or deleting (null) paths must stay within the workspace quota. */
  private async checkWorkspaceQuota(
    ws: WorkspaceRow,
    quota: Quota,
    writes: (readonly [string, number | null])[],
  ): Promise<void> {
    const sizes = new Map<string, number | null>();
    for (const [path, size] of writes) {
      // An unusable path is refused file by file when it is applied; it adds nothing here.
      const clean = (() => {
        try {
          return checkRelativePath(path);
        } catch {
          return null;
        }
      })();
      if (clean !== null) sizes.set(clean, size);
    }
    const bytes = await checkTotal(quota, this.repos.dirOf(ws.id), sizes);
    // The team's share: its other workspaces' bytes as recorded at their last checked write.
    if (this.opts.perTeam) await reserveWorkspaceBytes(this.db, ws, bytes, this.opts.perTeam.bytes);
  }

  private async applyDecoded(
    ws: WorkspaceRow,
    changed: { path: string; data: Buffer }[],
    deleted: string[],
    ignored: { path: string; reason: string }[],
  ): Promise<void> {
    // What the sandbox reports is untrusted: the same checks as the files API, and its size cap.
    for (const { path, data } of changed) {
      try {
        if (data.length > this.opts.maxFileBytes)
          throw new Error(`${data.length} bytes is over the ${this.opts.maxFileBytes}-byte file limit`);
        await this.repos.writeFile(ws.id, checkRelativePath(path), data);
      } catch (err) {
        ignored.push({ path, reason: (err as Error).message });
      }
    }
    for (const p of deleted) {
      try {
        await this.repos.deleteFile(ws.id, checkRelativePath(p));
      } catch (err) {
        if ((err as { code?: string }).code !== 'ENOENT') ignored.push({ path: p, reason: (err as Error).message });
      }
    }
  }

  /** Where a workspace's working tree is on disk (sandboxes mount it; the prompt is read from it). */
  dirOf(workspaceId: string): string {
    return this.repos.dirOf(workspaceId);
  }

  /** How much of its core-memory budget MEMORY.md uses now (what a write over it is refused by). */
  async memoryUsage(ws: WorkspaceRow): Promise<{ entries: number; bytes: number; budget: MemoryBudget }> {
    const text = await this.repos.readFile(ws.id, 'MEMORY.md').then(
      (b) => b.toString('utf8'),
      () => '',
    );
    return { entries: memoryEntries(text).length, bytes: Buffer.byteLength(text), budget: budgetOf(ws) };
  }

  /** The workspace's skills (skills/**\/SKILL.md) with the name and description of their front matter. */
  async skills(ws: WorkspaceRow): Promise<(SkillInfo & { builtin: boolean })[]> {
    const found = await listSkills(this.repos.dirOf(ws.id));
    return found.map((s) => {
      const path = s.path.replace(/^\/workspace\//, '');
      return { ...s, path, builtin: isBuiltinSkillPath(path) };
    });
  }

  /** A file of a workspace as it is in the working tree. */
  readFile(workspaceId: string, path: string): Promise<Buffer> {
    return this.repos.readFile(workspaceId, path);
  }

  stat(workspaceId: string, path: string) {
    return this.repos.stat(workspaceId, path);
  }

  listDir(workspaceId: string, path: string): Promise<DirEntry[]> {
    return this.repos.listDir(workspaceId, path);
  }

  /** Reading one workspace's files. */
  reader(workspaceId: string): WorkspaceReader {
    return { readFile: (path) => this.readFile(workspaceId, path), listDir: (path) => this.listDir(workspaceId, path) };
  }

  /** Runs `change` under the workspace lock and commits whatever it changed. */
  async change(
    ws: WorkspaceRow,
    prov: Provenance,
    change: (tree: WorkingTree) => Promise<void>,
    opts: { summary?: string; originSession?: string } = {},
  ): Promise<CommitOutcome> {
    const tree: WorkingTree = {
      readFile: (path) => this.repos.readFile(ws.id, path),
      writeFile: (path, data) => this.repos.writeFile(ws.id, path, data),
      deleteFile: (path) => this.repos.deleteFile(ws.id, path),
    };
    const outcome = await this.lock.run(ws.id, async () => {
      const o = await this.orDiscard(ws.id, async () => {
        await change(tree);
        return this.repos.commitPending(ws.id, prov, { summary: opts.summary, budget: budgetOf(ws) });
      });
      if (o.commit) await this.record(ws, o.commit);
      return o;
    });
    if (outcome.commit) {
      await this.reindex(ws, outcome.commit);
      await this.announce(ws.id, outcome.commit.paths, opts.originSession);
    }
    return outcome;
  }

  /** Commits what an agent step (or anything else) already changed in the working tree. */
  commitPending(ws: WorkspaceRow, prov: Provenance, opts: { summary?: string } = {}): Promise<CommitOutcome> {
    return this.change(ws, prov, async () => undefined, opts);
  }

  /** PUT /files: writes one file and commits it as the given author. */
  async writeFile(ws: WorkspaceRow, rawPath: string, data: Buffer, prov: Provenance): Promise<CommitOutcome> {
    const path = checkRelativePath(rawPath);
    if (data.length > this.opts.maxFileBytes) {
      throw new ApiError('invalid_request', `file is ${data.length} bytes; the limit is ${this.opts.maxFileBytes}`);
    }
    if (prov.author !== 'system' && isBuiltinSkillPath(path))
      throw new ApiError('forbidden', 'skills/builtin/ is read-only');
    const quota = this.quotaOf(ws);
    const outcome = await this.change(
      ws,
      prov,
      async () => {
        await this.checkWorkspaceQuota(ws, quota, [[path, data.length]]).catch((err: Error) => {
          if (err instanceof TeamBytesExceeded) throw new ApiError('conflict', err.message);
          throw err instanceof QuotaError ? new ApiError('payload_too_large', err.message) : err;
        });
        await this.repos.writeFile(ws.id, path, data);
      },
      { summary: `Update ${path}` },
    );
    const refusal = outcome.refused.find((r) => r.path === path);
    if (refusal) throw new ApiError('invalid_request', refusal.reason);
    return outcome;
  }

  async deleteFile(ws: WorkspaceRow, rawPath: string, prov: Provenance): Promise<CommitOutcome> {
    const path = checkRelativePath(rawPath);
    if (prov.author !== 'system' && isBuiltinSkillPath(path))
      throw new ApiError('forbidden', 'skills/builtin/ is read-only');
    const info = await this.repos.stat(ws.id, path);
    if (!info?.isFile()) throw ApiError.notFound(`file ${path}`);
    return this.change(ws, prov, () => this.repos.deleteFile(ws.id, path), { summary: `Delete ${path}` });
  }

  async revert(ws: WorkspaceRow, sha: string, prov: Provenance): Promise<CommitOutcome> {
    const outcome = await this.lock.run(ws.id, async () => {
      const o = await this.orDiscard(ws.id, () => this.repos.revert(ws.id, sha, prov));
      await this.record(ws, o.commit!);
      return o;
    });
    await this.reindex(ws, outcome.commit!);
    await this.announce(ws.id, outcome.commit!.paths);
    return outcome;
  }

  /**
   * Runs a change of the working tree and its commit: when either fails, the working tree is
   * put back to HEAD, so a change is committed whole or not at all and the next one starts clean.
   * Callers hold the workspace lock.
   */
  private async orDiscard<T>(workspaceId: string, work: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (err) {
      // A refusal (ApiError) is raised before anything is written, or after it is undone.
      if (err instanceof ApiError) throw err;
      this.log.error(
        { err, workspace: workspaceId },
        'a workspace change could not be committed; its working tree is put back to HEAD',
      );
      await this.repos
        .discardChanges(workspaceId)
        .catch((e: unknown) =>
          this.log.error({ err: e, workspace: workspaceId }, 'could not put a workspace back to HEAD'),
        );
      throw err;
    }
  }

  private async reindex(ws: WorkspaceRow, commit: CommitInfo): Promise<void> {
    await reindexPaths(this.db, await this.indexTarget(ws), commit.paths, this.opts.vectors);
  }

  /** Mirrors a commit into the table and moves the workspace head, in one statement. */
  private async record(ws: { id: string; teamId: string }, c: CommitInfo): Promise<void> {
    await this.db.execute(sql`with mirrored as (
        insert into commits (workspace_id, sha, team_id, kind, author, summary, paths, session_id, run_id, evolution_id, created_at)
        values (${ws.id}, ${c.sha}, ${ws.teamId}, ${c.kind}, ${c.author}, ${c.summary}, ${JSON.stringify(c.paths)}::jsonb,
          ${c.sessionId}, ${c.runId}, ${c.evolutionId}, ${c.createdAt.toISOString()}::timestamptz)
        on conflict do nothing)
      update workspaces set head = ${c.sha}, updated_at = now() where id = ${ws.id}`);
  }

  private async indexTarget(ws: { id: string; teamId: string }) {
    return {
      id: ws.id,
      teamId: ws.teamId,
      dir: this.repos.dirOf(ws.id),
      boilerplate: await this.templateBoilerplate(),
    };
  }

  /** The template's lines (built-in skills aside): shown in search results, never searched. */
  private templateBoilerplate(): Promise<ReadonlySet<string>> {
    this.boilerplate ??= indexedFiles(this.repos.template).then(async (paths) =>
      boilerplateLines(
        await Promise.all(
          paths.filter((p) => !isBuiltin(p)).map((p) => readFile(join(this.repos.template, p), 'utf8')),
        ),
      ),
    );
    return this.boilerplate;
  }

  async listCommits(ws: WorkspaceRow, f: { kind?: CommitKind; session?: string; after?: string; limit: number }) {
    const conds: (SQL | undefined)[] = [
      eq(commits.workspaceId, ws.id),
      f.kind ? eq(commits.kind, f.kind) : undefined,
      f.session ? eq(commits.sessionId, f.session) : undefined,
    ];
    if (f.after) {
      const [anchor] = await this.db
        .select()
        .from(commits)
        .where(and(eq(commits.workspaceId, ws.id), eq(commits.sha, f.after)));
      if (!anchor) throw new ApiError('invalid_request', 'after: no such commit in this workspace');
      conds.push(lt(commits.seq, anchor.seq));
    }
    return this.db
      .select()
      .from(commits)
      .where(and(...conds))
      .orderBy(desc(commits.seq))
      .limit(f.limit + 1);
  }

  async getCommit(ws: WorkspaceRow, sha: string) {
    const full = await this.repos.resolveCommit(ws.id, sha);
    const { diff, truncated } = await this.repos.diff(ws.id, full);
    const [row] = await this.db
      .select()
      .from(commits)
      .where(and(eq(commits.workspaceId, ws.id), eq(commits.sha, full)));
    const info = row ?? (await this.repos.commitInfo(ws.id, full));
    return { commit: info, diff, diffTruncated: truncated };
  }

  /**
   * Starts making a query's vector (undefined when searches are by words alone), for a caller that
   * can do so before it has the workspace: `search` takes it as `queryVector`.
   */
  startQueryVector(q: string): QueryVector | undefined {
    const e = this.opts.vectors?.embedder;
    return e && startQueryVector(e, q);
  }

  async search(ws: WorkspaceRow, q: string, opts: Omit<SearchOptions, 'embedder'>) {
    const now = this.opts.now ? new Date(this.opts.now()) : undefined;
    const page = await searchMemory(this.db, ws.id, q, { now, ...opts, embedder: this.opts.vectors?.embedder });
    if (page.vectors) this.warnWordsAlone(ws.id, page.vectors);
    return page;
  }

  /**
   * Logs a search answered by words alone, at most once a minute of each kind: an endpoint that
   * is down fails every search, and a warning per search would bury the log. The next warning
   * counts the searches not logged meanwhile.
   */
  private warnWordsAlone(workspace: string, v: NonNullable<SearchPage['vectors']>): void {
    const now = this.opts.now?.() ?? Date.now();
    const last = this.vectorWarnings.get(v.missing);
    if (last && now - last.at < VECTOR_WARNING_EVERY_MS) {
      last.unlogged++;
      return;
    }
    this.vectorWarnings.set(v.missing, { at: now, unlogged: 0 });
    this.log.warn(
      { workspace, missing: v.missing, err: v.err, unloggedSince: last?.unlogged ?? 0 },
      v.missing === 'late'
        ? 'memory search: the query’s vector came too late; answered by words alone'
        : 'memory search: the query’s vector failed; answered by words alone',
    );
  }

  /** Start-up repair of every live workspace (upkeep.ts). */
  repairAll(): Promise<{ repaired: number; failed: number }> {
    return this.upkeep.repairAll();
  }

  /** The background re-index of stale memory indexes (upkeep.ts); start-up does not wait for it. */
  reindexStale(): Promise<void> {
    return this.upkeep.reindexStale();
  }

  /**
   * Loads what a search's first question needs (the built-in encoder's model, in its query
   * thread), once, and resolves when it has. The server starts it at start-up: loading took ~1 s
   * (more on a busy host) of the 2 s a search waits for its question's vector, and the first
   * searches after a start were answered by words alone. A failure is logged, and a later question
   * loads the model again.
   */
  warmSearch(): Promise<void> {
    this.searchWarm ??= (this.opts.vectors?.embedder.warm?.() ?? Promise.resolve()).catch((err: unknown) => {
      this.log.warn(
        { err },
        'memory search: the sentence encoder could not load; searches answer by words alone until it does',
      );
    });
    return this.searchWarm;
  }

  /** Resolves once the memory vectors' background fill has nothing left to embed (tests, benches). */
  vectorsSettled(): Promise<void> {
    return this.opts.vectors?.settled() ?? Promise.resolve();
  }

  /** Stops the background re-index after the workspace it is on, and the vectors' fill after its turn. */
  async stopReindexing(): Promise<void> {
    await this.upkeep.stopReindexing();
    await this.opts.vectors?.stop();
  }
}
