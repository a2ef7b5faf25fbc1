import { cp, lstat, mkdir, readdir, readFile, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { ApiError } from '../lib/errors.ts';
import { gitIn, readHead, type Git } from './git.ts';
import { checkMemoryBudget, type MemoryBudget } from '../memory/budget.ts';
import { isBuiltinSkillPath, isTempName, pathRefusal, resolveInside } from './paths.ts';
import { kindsOf, type CommitAuthor, type CommitKind } from './kinds.ts';
import { scanSecrets, type Redaction } from './secrets.ts';

export interface Provenance {
  author: CommitAuthor;
  /** Who acted (an API key id), shown as the git author name. */
  actor?: string;
  sessionId?: string;
  runId?: string;
  evolutionId?: string;
}

export interface CommitInfo {
  sha: string;
  kind: CommitKind;
  kinds: CommitKind[];
  author: CommitAuthor;
  summary: string;
  paths: string[];
  sessionId: string | null;
  runId: string | null;
  evolutionId: string | null;
  createdAt: Date;
}

export interface CommitOutcome {
  commit: CommitInfo | null;
  redactions: Redaction[];
  /** Changes that were undone instead of committed, and why (read-only paths, memory budget). */
  refused: { path: string; reason: string }[];
}

export interface DirEntry {
  name: string;
  path: string;
  type: 'file' | 'dir';
  size: number;
}

/**
 * `.git/info/attributes` of every workspace: it outranks every .gitattributes in the tree, so
 * none of them (an older version let tenants write them) converts, filters or fails a file.
 */
const NEUTRAL_ATTRIBUTES =
  '* !text !eol !crlf !working-tree-encoding !filter !ident !diff !merge !conflict-marker-size !whitespace !delta\n';
const IDENTITY: Record<CommitAuthor, string> = {
  agent: 'Kiln Agent <agent@kiln.invalid>',
  user: 'Kiln User <user@kiln.invalid>',
  system: 'Kiln <system@kiln.invalid>',
};

/** The git side of workspaces: one repository per workspace under `root`, created from `template`. */
export class WorkspaceRepos {
  constructor(
    readonly root: string,
    readonly template: string,
  ) {}

  dirOf(workspaceId: string): string {
    if (!/^ws_[0-9a-z]+$/.test(workspaceId)) throw new Error(`bad workspace id ${workspaceId}`);
    return join(this.root, workspaceId);
  }

  private git(workspaceId: string): Git {
    return gitIn(this.dirOf(workspaceId), this.root, { tenant: true });
  }

  /** What makes git in a workspace deaf to its files: neutral attributes, temporary files excluded. */
  private async protect(dir: string): Promise<void> {
    await mkdir(join(dir, '.git/info'), { recursive: true });
    await writeFile(join(dir, '.git/info/attributes'), NEUTRAL_ATTRIBUTES);
    // A crash between writing a temporary file and renaming it must not commit the temporary file.
    await writeFile(join(dir, '.git/info/exclude'), '.kiln-*.tmp\n');
  }

  /** Creates the repository from the template with one system commit. */
  async init(workspaceId: string): Promise<CommitInfo> {
    const dir = this.dirOf(workspaceId);
    await rm(dir, { recursive: true, force: true });
    await mkdir(dirname(dir), { recursive: true });
    await cp(this.template, dir, { recursive: true });
    const git = this.git(workspaceId);
    await git(['init', '-q', '-b', 'main']);
    await this.protect(dir);
    const outcome = await this.commitPending(
      workspaceId,
      { author: 'system' },
      { summary: 'Create workspace from template', kind: 'system' },
    );
    return outcome.commit!;
  }

  exists(workspaceId: string): boolean {
    return existsSync(join(this.dirOf(workspaceId), '.git'));
  }

  /**
   * Commits whatever changed in the working tree, with provenance trailers. Before it lands:
   * files under names git refuses or reads as configuration are removed, changes to read-only
   * paths (built-in skills, for anyone but the system) are undone, a MEMORY.md over budget is
   * put back, and secrets are redacted in the files themselves. Nothing else is left out: no
   * ignore rule applies. Callers hold the workspace lock.
   */
  async commitPending(
    workspaceId: string,
    prov: Provenance,
    opts: {
      summary?: string;
      budget?: MemoryBudget;
      kind?: CommitKind;
      extraTrailers?: Record<string, string>;
      body?: string;
    } = {},
  ): Promise<CommitOutcome> {
    const git = this.git(workspaceId);
    const dir = this.dirOf(workspaceId);
    const refused: CommitOutcome['refused'] = [];
    let headKnown: boolean | undefined;
    const hasHead = async () => (headKnown ??= Boolean(await this.head(workspaceId)));
    await this.stageAll(git, dir, refused, hasHead);
    let paths = await this.staged(git);

    if (prov.author !== 'system') {
      for (const p of paths.filter(isBuiltinSkillPath)) {
        await this.restore(git, dir, p, await hasHead());
        refused.push({ path: p, reason: 'skills/builtin/ is read-only' });
      }
    }
    if (opts.budget && paths.includes('MEMORY.md') && existsSync(join(dir, 'MEMORY.md'))) {
      const next = await readFile(join(dir, 'MEMORY.md'), 'utf8');
      const current = async () => ((await hasHead()) ? git(['show', 'HEAD:MEMORY.md']).catch(() => '') : '');
      const check = await checkMemoryBudget(next, current, opts.budget);
      if (!check.ok) {
        await this.restore(git, dir, 'MEMORY.md', await hasHead());
        refused.push({ path: 'MEMORY.md', reason: check.message! });
      }
    }
    if (refused.length) paths = await this.staged(git);

    // Every file that is about to be committed is scanned for secrets, whatever its size or
    // encoding: read a bounded batch at a time (never one descriptor per file at once).
    const redactions: Redaction[] = [];
    let secretRefusals = false;
    for await (const batch of scanBatches(dir, paths)) {
      const verdicts = await scanSecrets(batch);
      for (const [k, verdict] of verdicts.entries()) {
        const p = batch[k]!.path;
        if (verdict.kind === 'redacted') {
          await writeFile(join(dir, p), verdict.data);
          await git(['add', '-f', '--', p]);
          redactions.push(...verdict.redactions);
        } else if (verdict.kind === 'refused') {
          await this.restore(git, dir, p, await hasHead());
          refused.push({ path: p, reason: `not committed: ${verdict.reason}` });
          secretRefusals = true;
        }
      }
    }
    if (secretRefusals) paths = await this.staged(git);
    if (paths.length === 0) return { commit: null, redactions, refused };

    const kinds = kindsOf(paths);
    const kind = opts.kind ?? kinds.primary;
    const summary = (opts.summary ?? autoSummary(prov.author, paths)).split('\n')[0]!.slice(0, 200);
    const body = [
      opts.body,
      redactions.length
        ? `Redacted ${redactions.length} secret(s): ${redactions.map((r) => `${r.type} in ${r.path}:${r.line}`).join(', ')}`
        : '',
      refused.length ? `Not committed: ${refused.map((r) => r.path).join(', ')}` : '',
    ]
      .filter(Boolean)
      .join('\n\n');
    const trailers = [
      ...(opts.kind ? [opts.kind] : kinds.all).map((k) => `Kiln-Kind: ${k}`),
      `Kiln-Author: ${prov.author}`,
      prov.actor ? `Kiln-Actor: ${prov.actor}` : '',
      prov.sessionId ? `Kiln-Session: ${prov.sessionId}` : '',
      prov.runId ? `Kiln-Run: ${prov.runId}` : '',
      prov.evolutionId ? `Kiln-Evolution: ${prov.evolutionId}` : '',
      ...Object.entries(opts.extraTrailers ?? {}).map(([k, v]) => `${k}: ${v}`),
    ].filter(Boolean);
    const paragraphs = [summary, body, trailers.join('\n')].filter(Boolean).flatMap((p) => ['-m', p]);
    await git(['commit', '-q', '--no-verify', `--author=${IDENTITY[prov.author]}`, ...paragraphs]);
    const sha = readHead(this.dirOf(workspaceId)) ?? (await git(['rev-parse', 'HEAD'])).trim();
    return {
      commit: {
        sha,
        kind,
        kinds: opts.kind ? [opts.kind] : kinds.all,
        author: prov.author,
        summary,
        paths,
        sessionId: prov.sessionId ?? null,
        runId: prov.runId ?? null,
        evolutionId: prov.evolutionId ?? null,
        createdAt: new Date(),
      },
      redactions,
      refused,
    };
  }

  /** The patch a commit introduced (capped). */
  async diff(workspaceId: string, sha: string, maxBytes = 1024 * 1024): Promise<{ diff: string; truncated: boolean }> {
    await this.resolveCommit(workspaceId, sha);
    const out = await this.git(workspaceId)(['show', '--format=', '--patch', '--no-color', '--no-ext-diff', sha]);
    return out.length > maxBytes ? { diff: out.slice(0, maxBytes), truncated: true } : { diff: out, truncated: false };
  }

  async resolveCommit(workspaceId: string, sha: string): Promise<string> {
    if (!/^[0-9a-f]{4,40}$/.test(sha)) throw new ApiError('invalid_request', 'sha must be 4 to 40 hex digits');
    const full = await this.git(workspaceId)(['rev-parse', '--verify', '-q', `${sha}^{commit}`])
      .then((x) => x.trim())
      .catch(() => '');
    if (!full) throw ApiError.notFound('commit');
    return full;
  }

  /**
   * Reverts a commit with a new commit (never a history rewrite). When it cannot apply cleanly
   * the repository is put back exactly as it was and the answer is 409.
   */
  async revert(workspaceId: string, sha: string, prov: Provenance): Promise<CommitOutcome> {
    const full = await this.resolveCommit(workspaceId, sha);
    const git = this.git(workspaceId);
    const parents = (await git(['rev-list', '--parents', '-n', '1', full])).trim().split(' ');
    if (parents.length < 2) throw new ApiError('conflict', 'the first commit of a workspace cannot be reverted');
    const touched = (await git(['diff-tree', '--no-commit-id', '--name-only', '-r', '-z', full]))
      .split('\0')
      .filter(Boolean);
    if (prov.author !== 'system' && touched.some(isBuiltinSkillPath)) {
      throw new ApiError('conflict', 'this commit changed built-in skills, which only the system may change');
    }
    const original = (await git(['show', '-s', '--format=%s', full])).trim();
    try {
      await git(['revert', '--no-commit', full]);
    } catch {
      await git(['revert', '--abort']).catch(() => git(['reset', '--hard', '-q', 'HEAD']));
      throw new ApiError(
        'conflict',
        `commit ${full.slice(0, 12)} cannot be reverted cleanly: later changes touch the same lines. Nothing was changed.`,
      );
    }
    const outcome = await this.commitPending(workspaceId, prov, {
      summary: `Revert "${original}"`.slice(0, 200),
      body: `This reverts commit ${full}.`,
      extraTrailers: { 'Kiln-Reverts': full },
    });
    if (!outcome.commit) throw new ApiError('conflict', `commit ${full.slice(0, 12)} has nothing left to revert`);
    return outcome;
  }

  /**
   * Start-up repair after a crash: removes stale git lock files, abandons a half-done revert,
   * and commits (as the system) any change found in the working tree, so nothing is lost and
   * everything stays revertible (files under names git refuses are removed, see stageAll).
   * When that commit fails, the working tree is left as it is for an operator to look at.
   */
  async repair(workspaceId: string): Promise<{ removedLocks: string[]; recovered: CommitOutcome | null }> {
    const gitDir = join(this.dirOf(workspaceId), '.git');
    const removedLocks: string[] = [];
    for (const lock of ['index.lock', 'HEAD.lock', 'refs/heads/main.lock', 'config.lock']) {
      const f = join(gitDir, lock);
      if (existsSync(f)) {
        await rm(f, { force: true });
        removedLocks.push(lock);
      }
    }
    // A workspace made by an older version gets the protections of a new one.
    await this.protect(this.dirOf(workspaceId));
    const git = this.git(workspaceId);
    if (existsSync(join(gitDir, 'REVERT_HEAD')) || existsSync(join(gitDir, 'sequencer'))) {
      await git(['revert', '--abort']).catch(() => git(['reset', '--merge']));
    }
    const outcome = await this.commitPending(
      workspaceId,
      { author: 'system' },
      { summary: 'Recover uncommitted changes found at start-up', kind: 'system' },
    );
    return { removedLocks, recovered: outcome.commit || outcome.refused.length ? outcome : null };
  }

  /** Every commit sha, newest first. */
  async shas(workspaceId: string): Promise<string[]> {
    if (!(await this.head(workspaceId))) return [];
    return (await this.git(workspaceId)(['rev-list', 'HEAD'])).split('\n').filter(Boolean);
  }

  /** A commit's provenance read back from git (for rebuilding the commits table). */
  async commitInfo(workspaceId: string, sha: string): Promise<CommitInfo> {
    const git = this.git(workspaceId);
    const [meta, files] = await Promise.all([
      git(['show', '-s', '--format=%aI%x00%s%x00%(trailers:unfold,only)', sha]),
      git(['diff-tree', '--root', '--no-commit-id', '--name-only', '-r', '-z', sha]),
    ]);
    const [date, summary, trailerText] = meta.split('\0') as [string, string, string];
    const trailers = trailerText
      .split('\n')
      .map((l) => /^([\w-]+):\s*(.*)$/.exec(l.trim()))
      .filter((m): m is RegExpExecArray => !!m);
    const get = (k: string) => trailers.filter((m) => m[1] === k).map((m) => m[2]!);
    const kinds = get('Kiln-Kind') as CommitKind[];
    const paths = files.split('\0').filter(Boolean).sort();
    return {
      sha,
      kind: kinds[0] ?? kindsOf(paths).primary,
      kinds,
      author: (get('Kiln-Author')[0] as CommitAuthor | undefined) ?? 'user',
      summary: summary.trim(),
      paths,
      sessionId: get('Kiln-Session')[0] ?? null,
      runId: get('Kiln-Run')[0] ?? null,
      evolutionId: get('Kiln-Evolution')[0] ?? null,
      createdAt: new Date(date.trim()),
    };
  }

  /**
   * Stages every change in the working tree by name, ignore rules or not (`--force`), except
   * temporary files. A new or changed file under a name git refuses or reads as configuration
   * (only an older version, or a crash, leaves one) is removed instead, and reported in
   * `refused`: git never sees it, so it can never fail a commit.
   */
  private async stageAll(
    git: Git,
    dir: string,
    refused: CommitOutcome['refused'],
    hasHead: () => Promise<boolean>,
  ): Promise<void> {
    const listed = (await git(['ls-files', '-z', '--others', '--modified', '--deleted'])).split('\0').filter(Boolean);
    const take: string[] = [];
    for (const path of new Set(listed)) {
      if (isTempName(basename(path))) continue;
      const refusal = pathRefusal(path.replace(/\/$/, ''));
      // A deletion is taken whatever the name: it can only make the tree safer.
      if (!refusal || !(await lstat(join(dir, path)).catch(() => null))) {
        take.push(path);
      } else if (!refused.some((r) => r.path === refusal.upTo)) {
        await this.restore(git, dir, refusal.upTo, await hasHead());
        refused.push({ path: refusal.upTo, reason: refusal.why });
      }
    }
    if (take.length)
      await git(['add', '--all', '--force', '--pathspec-from-file=-', '--pathspec-file-nul'], take.join('\0'));
  }

  /**
   * Puts the working tree back exactly as HEAD has it, after a change that could not be
   * committed: no half-written change stays behind to fail (or sneak into) the next commit.
   */
  async discardChanges(workspaceId: string): Promise<void> {
    const git = this.git(workspaceId);
    if (!(await this.head(workspaceId))) return;
    await git(['reset', '-q', '--hard', 'HEAD']);
    await git(['clean', '-q', '-f', '-f', '-d', '-x']);
  }

  /** The staged paths (added, modified, deleted). */
  private async staged(git: Git): Promise<string[]> {
    const out = await git(['diff', '--cached', '--name-only', '--no-renames', '-z']);
    return out.split('\0').filter(Boolean).sort();
  }

  /** Puts one path back as it is in HEAD (or removes it when HEAD does not have it). */
  private async restore(git: Git, dir: string, path: string, hasHead: boolean): Promise<void> {
    const inHead = hasHead && (await git(['ls-tree', '--name-only', 'HEAD', '--', path])).trim() !== '';
    if (inHead) {
      await git(['checkout', 'HEAD', '--', path]);
    } else {
      await git(['rm', '-q', '--cached', '-r', '--ignore-unmatch', '--', path]);
      await rm(join(dir, path), { recursive: true, force: true });
    }
  }

  async head(workspaceId: string): Promise<string | null> {
    return this.git(workspaceId)(['rev-parse', '--verify', '-q', 'HEAD'])
      .then((s) => s.trim() || null)
      .catch(() => null);
  }

  async readFile(workspaceId: string, path: string): Promise<Buffer> {
    const file = await resolveInside(this.dirOf(workspaceId), path);
    return readFile(file);
  }

  async stat(workspaceId: string, path: string) {
    const file = await resolveInside(this.dirOf(workspaceId), path);
    return stat(file).catch(() => null);
  }

  async listDir(workspaceId: string, path: string): Promise<DirEntry[]> {
    const dir = path ? await resolveInside(this.dirOf(workspaceId), path) : this.dirOf(workspaceId);
    const entries = await readdir(dir, { withFileTypes: true });
    const out: DirEntry[] = [];
    for (const e of entries) {
      if (e.name === '.git') continue;
      const rel = path ? `${path}/${e.name}` : e.name;
      const s = await stat(join(dir, e.name)).catch(() => null);
      out.push({
        name: e.name,
        path: rel,
        type: e.isDirectory() ? 'dir' : 'file',
        size: e.isDirectory() ? 0 : (s?.size ?? 0),
      });
    }
    return out.sort((a, b) => (a.type === b.type ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1));
  }

  /** Writes a file atomically (temporary file + rename); a crash never leaves half a file. */
  async writeFile(workspaceId: string, path: string, data: Buffer): Promise<void> {
    const file = await resolveInside(this.dirOf(workspaceId), path);
    const existing = await lstat(file).catch(() => null);
    if (existing?.isSymbolicLink())
      throw new ApiError('invalid_request', `path ${JSON.stringify(path)} is a symbolic link`);
    if (existing?.isDirectory()) throw new ApiError('invalid_request', `path ${JSON.stringify(path)} is a directory`);
    await mkdir(dirname(file), { recursive: true }).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOTDIR' || err.code === 'EEXIST')
        throw new ApiError(
          'invalid_request',
          `path ${JSON.stringify(path)}: a parent of it is a file, not a directory`,
        );
      throw err;
    });
    const tmp = join(dirname(file), `.kiln-${randomBytes(6).toString('hex')}.tmp`);
    await writeFile(tmp, data);
    await rename(tmp, file);
  }

  async deleteFile(workspaceId: string, path: string): Promise<void> {
    const file = await resolveInside(this.dirOf(workspaceId), path);
    await unlink(file);
  }
}

const SCAN_BATCH_FILES = 256;
const SCAN_BATCH_BYTES = 8 * 1024 * 1024;

/** The regular files among `paths` with their content, in batches of bounded count and size, read one batch at a time. */
async function* scanBatches(dir: string, paths: string[]): AsyncGenerator<{ path: string; data: Buffer }[]> {
  let batch: { path: string; data: Buffer }[] = [];
  let bytes = 0;
  for (const p of paths) {
    const info = await lstat(join(dir, p)).catch(() => null);
    if (!info?.isFile()) continue;
    if (batch.length >= SCAN_BATCH_FILES || (batch.length && bytes + info.size > SCAN_BATCH_BYTES)) {
      yield batch;
      batch = [];
      bytes = 0;
    }
    batch.push({ path: p, data: await readFile(join(dir, p)) });
    bytes += info.size;
  }
  if (batch.length) yield batch;
}

function autoSummary(author: CommitAuthor, paths: string[]): string {
  const shown = paths.slice(0, 3).join(', ');
  const more = paths.length > 3 ? ` and ${paths.length - 3} more` : '';
  return `${author === 'agent' ? 'Agent updates' : author === 'user' ? 'Update' : 'System updates'} ${shown}${more}`;
}
