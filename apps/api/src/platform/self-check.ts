import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { generateKey } from '../auth/keys.ts';
import { gitIn, type Git } from '../workspace/git.ts';

/** One step of the self-check (or the restart), as stored in the update's `checks`. */
export interface CheckStep {
  name: 'install' | 'typecheck' | 'dashboard' | 'smoke' | 'boot' | 'readyz' | 'restart';
  ok: boolean;
  duration_ms: number;
  log: string;
}

/** What a self-check's test step runs unless KILN_SELF_CHECK_TESTS says otherwise (`npm run test:fast`). */
export const DEFAULT_CHECK_TESTS = ['tests/unit', 'tests/smoke'];

export interface CheckOptions {
  /** Per step: install, type-check, smoke tests, boot. */
  stepTimeoutMs: number;
  /** What the test step runs: vitest paths inside the checkout (default DEFAULT_CHECK_TESTS). */
  tests?: string[];
  readyTimeoutMs: number;
  stopTimeoutMs: number;
  dockerHost?: string;
  /** Child processes started by the check, so a shutdown can end them. */
  children: Set<ChildProcess>;
}

/** A patch that cannot be applied: the route answers 400 and nothing is left behind. */
export class PatchError extends Error {}

/** The source checkout itself is unusable (not a git repository). */
export class SourceError extends Error {}

const LOG_HEAD = 4096;
const LOG_TAIL = 12_288;
const BANNER = /Kiln is listening on (\S+)/;
const WORKTREE_PREFIX = 'kiln-self-check-';
/** The identity of the commits Kiln makes in its own source (gitIn already turns hooks and signing off). */
export const IDENTITY = ['-c', 'user.name=Kiln', '-c', 'user.email=system@kiln.invalid'];

/** Keys (a check's server or a test may print one) never reach the stored log. */
const redact = (text: string) => text.replace(/kiln_(admin_)?[A-Za-z0-9_-]{20,}/g, 'kiln_[redacted]');

/** The head and tail of a long log, redacted, with the number of characters cut. */
export function capLog(text: string): string {
  const t = redact(text);
  if (t.length <= LOG_HEAD + LOG_TAIL) return t;
  return `${t.slice(0, LOG_HEAD)}\n… [${t.length - LOG_HEAD - LOG_TAIL} characters cut] …\n${t.slice(-LOG_TAIL)}`;
}

/** git in the platform's source checkout, with nothing of the server's environment or user config. */
export const sourceGit = (dir: string): Git => gitIn(dir, tmpdir());

/** A check's directory (`<tmp>/kiln-self-check-<id>/`) holds its worktree (`src/`), the patch and the boot's data. */
export const isCheckWorktree = (path: string) =>
  basename(path) === 'src' && basename(dirname(path)).startsWith(WORKTREE_PREFIX);

export interface Prepared {
  worktree: string;
  base: string;
  commit: string;
  paths: string[];
}

/**
 * Applies an untrusted patch in a new worktree at the source's HEAD and commits it there
 * (detached, kept reachable by `refs/kiln/updates/<id>`). git refuses paths outside the
 * worktree, inside `.git` and beyond symbolic links; links themselves are refused here. On any
 * failure the worktree is removed and nothing else was written.
 */
export async function preparePatch(
  sourceDir: string,
  o: { id: string; patch: string; message: string },
): Promise<Prepared> {
  if (/^(new file mode|new mode|old mode|deleted file mode|index [0-9a-f]+\.\.[0-9a-f]+) 120000\b/m.test(o.patch)) {
    throw new PatchError('the patch may not create, change or delete symbolic links');
  }
  const git = sourceGit(sourceDir);
  const base = (
    await git(['rev-parse', 'HEAD']).catch(() => {
      throw new SourceError(`the source directory ${sourceDir} is not a git checkout (set KILN_SOURCE_DIR)`);
    })
  ).trim();
  const home = mkdtempSync(join(tmpdir(), `${WORKTREE_PREFIX}${o.id}-`));
  const worktree = join(home, 'src');
  const patchFile = join(home, 'update.patch');
  try {
    await git(['worktree', 'add', '--detach', worktree, base]);
    writeFileSync(patchFile, o.patch);
    const wt = sourceGit(worktree);
    await wt(['apply', '--check', patchFile]).catch((err: Error) => {
      throw new PatchError(
        `the patch does not apply to ${base.slice(0, 12)}: ${err.message.replace(/^git apply failed: /, '').replaceAll(patchFile, 'patch')}`,
      );
    });
    await wt(['apply', '--index', patchFile]);
    const paths = (await wt(['diff', '--cached', '--name-only', '-z'])).split('\0').filter(Boolean);
    if (paths.length === 0) throw new PatchError('the patch changes nothing');
    await wt([...IDENTITY, 'commit', '-q', '--no-verify', '-m', o.message]);
    const commit = (await wt(['rev-parse', 'HEAD'])).trim();
    await git(['update-ref', `refs/kiln/updates/${o.id}`, commit]);
    return { worktree, base, commit, paths };
  } catch (err) {
    await removeWorktree(sourceDir, worktree);
    throw err;
  }
}

/** Removes a check's worktree with everything else in its directory. */
export async function removeWorktree(sourceDir: string, worktree: string): Promise<void> {
  await sourceGit(sourceDir)(['worktree', 'remove', '--force', worktree]).catch(() => undefined);
  rmSync(dirname(worktree), { recursive: true, force: true });
  await sourceGit(sourceDir)(['worktree', 'prune']).catch(() => undefined);
}

/** The environment of every process the check starts: nothing of the server's secrets. */
function childEnv(o: CheckOptions, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? tmpdir(),
    LANG: 'C.UTF-8',
    NO_COLOR: '1',
    CI: '1',
    ...(o.dockerHost ? { DOCKER_HOST: o.dockerHost } : {}),
    ...extra,
  };
}

/**
 * A check's processes run in a process group of their own (`detached`), ended as one: killing
 * only the command left what it started running (vitest's workers ran their files to the end,
 * holding the log's pipe open, after a failed type-check had ended the check).
 */
function spawnGroup(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): ChildProcess {
  const child = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  // The command's exit ends what it left behind too (the log's pipe closes only when they are gone).
  child.once('exit', () => killGroup(child));
  return child;
}

/** SIGKILLs the process group a check's command leads (it may be gone: nothing to do). */
export function killGroup(child: ChildProcess): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // ESRCH: the group is empty.
  }
}

function track(o: CheckOptions, child: ChildProcess): { output: () => string; exited: Promise<number | string> } {
  let out = '';
  const take = (d: Buffer) => {
    out += d.toString();
    // Keep memory bounded on a runaway log; capLog keeps head and tail of what is left.
    if (out.length > 4 * 1024 * 1024) out = out.slice(0, LOG_HEAD) + out.slice(-2 * 1024 * 1024);
  };
  child.stdout?.on('data', take);
  child.stderr?.on('data', take);
  o.children.add(child);
  const exited = new Promise<number | string>((resolve) =>
    child.on('close', (code, signal) => {
      o.children.delete(child);
      resolve(code ?? signal ?? -1);
    }),
  );
  child.on('error', (err) => (out += `\n${err.message}`));
  return { output: () => out, exited };
}

async function timed(name: CheckStep['name'], fn: () => Promise<{ ok: boolean; log: string }>): Promise<CheckStep> {
  const t0 = performance.now();
  const { ok, log } = await fn().catch((err: Error) => ({ ok: false, log: err.message }));
  return { name, ok, duration_ms: Math.round(performance.now() - t0), log: capLog(log) };
}

/**
 * Runs a command to completion (SIGKILL at the step deadline, or when `signal` aborts: another
 * step of the check failed); ok means exit code 0.
 */
export function command(
  o: CheckOptions,
  cwd: string,
  cmd: string,
  args: string[],
  signal?: AbortSignal,
): Promise<{ ok: boolean; log: string; ended: boolean }> {
  const child = spawnGroup(cmd, args, cwd, childEnv(o));
  const { output, exited } = track(o, child);
  const stop = () => killGroup(child);
  const timer = setTimeout(stop, o.stepTimeoutMs);
  signal?.addEventListener('abort', stop, { once: true });
  return exited.then((code) => {
    clearTimeout(timer);
    signal?.removeEventListener('abort', stop);
    const note = code === 0 ? '' : code === 'SIGKILL' ? `\n[killed after ${o.stepTimeoutMs} ms]` : `\n[exit ${code}]`;
    return {
      ok: code === 0,
      log: `$ ${[cmd, ...args].join(' ')}\n${output()}${note}`,
      ended: typeof code === 'number',
    };
  });
}

/** Errors of declaration emit alone, which `tsc --noEmit` does not report (TS4xxx, TS9xxx too). */
const DECLARATION_ERRORS = new Set([2527, 2742, 2883, 7056]);
const UNUSED = new Set([6133, 6138, 6192, 6196, 6198, 6199, 6205]);

/**
 * Whether a tsc log that emitted declarations holds an error `tsc --noEmit` reports too (syntax,
 * types, unused names, implicit any): then that run would fail as well and need not be run.
 */
export function failsWithoutEmit(log: string): boolean {
  return [...log.matchAll(/: error TS(\d+):/g)].some(([, n]) => {
    const code = Number(n);
    if (DECLARATION_ERRORS.has(code)) return false;
    return (
      (code >= 1000 && code < 3000) ||
      (code >= 7000 && code < 8000) ||
      (code >= 18000 && code < 19000) ||
      UNUSED.has(code)
    );
  });
}

/** How many type-check states a source checkout keeps per tsconfig (~300 KB each), besides its HEAD's. */
const KEPT_STATES = 8;

/**
 * The type-check of one tsconfig in a check's worktree, incremental from a state an earlier
 * check left (`<git dir>/kiln-check/<commit>.<name>.tsbuildinfo`): the state of the commit the
 * patch applies to when there is one (the last update applied), else the newest. Any earlier
 * state is a sound start, since tsc compares every file's content with it (and starts over when
 * the compiler or the options differ, or the state does not parse); the nearer it is, the less is
 * re-checked. The state sits beside the worktree, where every check's sources and the linked
 * node_modules are at the same relative paths; it is kept from a type-check that ended by itself
 * (not one ended because another step failed), with the running checkout's node_modules, whether
 * it passed or not: a failing check's state records its errors (tsc reports them again for a file
 * that has not changed since), and where the base has no state of its own the next try of a
 * patch, usually its fix, starts from it instead of in full.
 *
 * tsc emits declarations (into the check's directory, thrown away with it) so the state holds
 * each file's declaration signature: without one (`--noEmit` records none), a file's first change
 * re-checks everything that imports it, ~75% of a full check for a one-line patch to
 * `db/health.ts`; with one, only the file, unless its exported types changed. Declaration emit
 * has errors of its own that `tsc --noEmit` (what `npm test` runs) does not: a check whose errors
 * might all be of that kind is run again with `--noEmit`, from the state the first left, and that
 * run decides.
 */
export async function typecheck(
  o: CheckOptions,
  sourceDir: string,
  p: Prepared,
  config: string,
  name: string,
  signal: AbortSignal,
): Promise<{ ok: boolean; log: string }> {
  const dir = join(
    (await sourceGit(sourceDir)(['rev-parse', '--path-format=absolute', '--git-common-dir'])).trim(),
    'kiln-check',
  );
  const suffix = `.${name}.tsbuildinfo`;
  const states = () =>
    (existsSync(dir) ? readdirSync(dir) : [])
      .filter((f) => f.endsWith(suffix))
      .map((f) => ({ path: join(dir, f), at: statSync(join(dir, f), { throwIfNoEntry: false })?.mtimeMs ?? 0 }))
      .sort((a, b) => b.at - a.at);
  const home = dirname(p.worktree);
  const state = join(home, `${name}.tsbuildinfo`);
  // The states are a cache: one that cannot be read or kept makes a full check, never a failed one.
  const cache = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch {
      return undefined;
    }
  };
  const start = join(dir, `${p.base}${suffix}`);
  const from = cache(() => {
    const path = existsSync(start) ? start : states()[0]?.path;
    if (path) copyFileSync(path, state);
    return path;
  });
  const tsc = (emit: string[]) =>
    command(
      o,
      p.worktree,
      process.execPath,
      ['node_modules/typescript/bin/tsc', '-p', config, ...emit, '--incremental', '--tsBuildInfoFile', state],
      signal,
    );
  let run = await tsc(['--noEmit', 'false', '--declaration', '--emitDeclarationOnly', '--outDir', join(home, 'types')]);
  if (!run.ok && run.ended && !signal.aborted && !failsWithoutEmit(run.log)) run = await tsc(['--noEmit']);
  // A patch that changed package-lock.json was checked with node_modules installed in its
  // worktree (its own compiler, at other paths): its state is of no use to the next check.
  const linked = lstatSync(join(p.worktree, 'node_modules'), { throwIfNoEntry: false })?.isSymbolicLink();
  if (run.ended && linked && existsSync(state))
    cache(() => {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      const next = join(dir, `.${randomBytes(6).toString('hex')}`);
      copyFileSync(state, next);
      renameSync(next, join(dir, `${p.commit}${suffix}`));
      // The state of the commit the source is at stays whatever came after it: checks of patches
      // to that commit start from it (a burst of failing tries would have pushed it out).
      for (const old of states()
        .filter((s) => s.path !== start)
        .slice(KEPT_STATES))
        rmSync(old.path, { force: true });
    });
  const began = from
    ? `incremental from the type-check of ${basename(from).slice(0, 12)}`
    : 'no earlier state: in full';
  return { ok: run.ok, log: `${run.log}\n(${began})` };
}

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Boots the patched server on a spare port with a throwaway embedded database, no warm pool and
 * an instance id of its own (its reaper touches nobody's containers), waits for its banner,
 * then probes `/readyz` and stops it with SIGTERM: a clean exit is part of passing.
 */
async function boot(o: CheckOptions, worktree: string, id: string): Promise<CheckStep[]> {
  const dataDir = join(dirname(worktree), 'data');
  const env = childEnv(o, {
    KILN_PORT: '0',
    KILN_HOST: '127.0.0.1',
    KILN_DATA_DIR: dataDir,
    KILN_ADMIN_KEY: generateKey('admin'),
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_INSTANCE_ID: `self-check-${id}-${randomBytes(3).toString('hex')}`,
    KILN_LOG_LEVEL: 'warn',
    KILN_SOURCE_DIR: worktree,
  });
  const child = spawnGroup(process.execPath, ['--import', 'tsx', 'apps/api/src/main.ts'], worktree, env);
  const { output, exited } = track(o, child);
  let gone: number | string | undefined;
  void exited.then((c) => (gone = c));
  try {
    const t0 = performance.now();
    let url: string | undefined;
    for (const end = Date.now() + o.stepTimeoutMs; !url && gone === undefined && Date.now() < end; await delay(100))
      url = BANNER.exec(output())?.[1];
    const booted: CheckStep = {
      name: 'boot',
      ok: !!url,
      duration_ms: Math.round(performance.now() - t0),
      log: capLog(
        url
          ? `listening on ${url}\n${output()}`
          : `${output()}\n[${gone === undefined ? `no banner within ${o.stepTimeoutMs} ms` : `exit ${gone}`}]`,
      ),
    };
    if (!url) return [booted];
    const ready = await timed('readyz', async () => {
      let last = 'no answer';
      for (const end = Date.now() + o.readyTimeoutMs; gone === undefined && Date.now() < end; await delay(200)) {
        const res = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) }).catch((err: Error) => err);
        last = res instanceof Error ? res.message : `${res.status} ${await res.text()}`;
        if (!(res instanceof Error) && res.status === 200) break;
      }
      const ok = last.startsWith('200 ');
      if (!ok) return { ok, log: `GET /readyz → ${last}\n${output()}` };
      child.kill('SIGTERM');
      const code = await Promise.race([exited, delay(o.stopTimeoutMs).then(() => 'timeout')]);
      const clean = code === 0;
      return {
        ok: clean,
        log: `GET /readyz → ${last}\nSIGTERM → ${code === 'timeout' ? `still running after ${o.stopTimeoutMs} ms` : `exit ${code}`}\n${output()}`,
      };
    });
    return [booted, ready];
  } finally {
    if (gone === undefined) {
      killGroup(child);
      await exited;
    }
  }
}

/** What the dashboard's type-check and build read besides node_modules: its sources and the configs they extend. */
const DASHBOARD_INPUTS = ['apps/dashboard', 'tsconfig.json', 'package.json', 'package-lock.json'];

/**
 * The self-check of a prepared worktree: install (only when package-lock.json differs from the
 * running checkout's; otherwise its node_modules is linked), then side by side the type-check,
 * the dashboard build and the fast suite (`npm run test:fast`: unit and smoke tests), then boot
 * and `/readyz`. A patch that leaves the dashboard's inputs as they are in the running commit
 * keeps its type-check and build (the running checkout's build is linked, as the restart
 * serves it). Steps are reported in that order and the check stops at the first failing one
 * (ending the others); `onStep` sees each one as it ends.
 */
export async function runSelfCheck(
  sourceDir: string,
  p: Prepared,
  id: string,
  o: CheckOptions,
  onStep: (s: CheckStep) => Promise<void>,
): Promise<boolean> {
  const lock = (dir: string) => {
    try {
      return readFileSync(join(dir, 'package-lock.json'), 'utf8');
    } catch {
      return null;
    }
  };
  const report = async (done: CheckStep | CheckStep[]) => {
    for (const s of [done].flat()) {
      await onStep(s);
      if (!s.ok) return false;
    }
    return true;
  };
  const install = await (lock(p.worktree) === lock(sourceDir)
    ? timed('install', async () => {
        symlinkSync(realpathSync(join(sourceDir, 'node_modules')), join(p.worktree, 'node_modules'));
        return { ok: true, log: "package-lock.json unchanged: linked the running checkout's node_modules" };
      })
    : timed('install', () => command(o, p.worktree, 'npm', ['ci', '--no-audit', '--no-fund'])));
  if (!(await report(install))) return false;

  const runningBuild = join(sourceDir, 'apps/dashboard/dist');
  const dashboardKept =
    existsSync(join(runningBuild, 'index.html')) &&
    (await sourceGit(sourceDir)(['diff', '--quiet', p.base, p.commit, '--', ...DASHBOARD_INPUTS]).then(
      () => true,
      () => false,
    ));
  const kept = `${DASHBOARD_INPUTS.join(', ')} are as in the running commit ${p.base.slice(0, 12)}`;
  const stop = new AbortController();
  const node = (args: string[]) => command(o, p.worktree, process.execPath, args, stop.signal);
  const side: Promise<CheckStep>[] = [
    // The API and the dashboard (its own tsconfig, with the DOM library), as `npm test` checks them.
    timed('typecheck', async () => {
      const tsc = (config: string, name: string) => typecheck(o, sourceDir, p, config, name, stop.signal);
      const api = await tsc('tsconfig.json', 'api');
      if (dashboardKept) return { ok: api.ok, log: `${api.log}\n(the dashboard's is kept: ${kept})` };
      if (!api.ok) return api;
      const dashboard = await tsc('apps/dashboard/tsconfig.json', 'dashboard');
      return { ok: dashboard.ok, log: `${api.log}\n${dashboard.log}` };
    }),
    // The dashboard builds (into the worktree), so an update cannot leave it unbuildable.
    timed('dashboard', async () => {
      if (!dashboardKept)
        return node(['node_modules/vite/bin/vite.js', 'build', 'apps/dashboard', '--logLevel', 'warn']);
      symlinkSync(realpathSync(runningBuild), join(p.worktree, 'apps/dashboard/dist'));
      return { ok: true, log: `${kept}: linked its build` };
    }),
    // By default `npm run test:fast`: the unit tests and the smoke suite (no Docker, no Postgres, ~30 s),
    // as it runs them: the files of a worker share its modules (0.74× the time of a module graph per
    // file; each file still owns its own state, as under `npm test`).
    timed('smoke', () =>
      node(['node_modules/vitest/vitest.mjs', 'run', ...(o.tests ?? DEFAULT_CHECK_TESTS), '--no-isolate']),
    ),
  ];
  try {
    for (const step of side) if (!(await report(await step))) return false;
  } finally {
    stop.abort();
    await Promise.allSettled(side);
  }
  return report(await boot(o, p.worktree, id));
}
