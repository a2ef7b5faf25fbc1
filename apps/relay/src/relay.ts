/**
 * The relay restarter of a platform self-update: a detached process that outlives the Kiln server
 * it replaces. It stops the old server (SIGTERM, which drains; SIGKILL after a deadline), starts
 * the new version, probes its `/readyz`, and when that is not healthy in time, stops it, reverts
 * the update's commit and starts the previous version again.
 *
 *   node --import tsx relay.ts <plan.json>
 *
 * It has no database access: it writes its progress to `plan.statusFile` (JSON, replaced
 * atomically) and its log to `plan.logFile`; the server that survives reads the status and
 * finishes the update's row. The server copies this file out of its own checkout before it
 * moves the branch, so the relay that runs is the one of the version known to work, and it
 * imports nothing but Node's own modules. Servers it starts inherit its environment (the old
 * server's), which is never written to disk.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, closeSync, openSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

export interface RelayPlan {
  updateId: string;
  oldPid: number;
  /** How to start a server: the old one's node, flags and entry point, in its working directory. */
  command: string;
  args: string[];
  cwd: string;
  /** The checkout the update moved: its branch now points at `commit`, whose parent is `previous`. */
  sourceDir: string;
  commit: string;
  previous: string;
  /**
   * Run in `sourceDir` before each start, in order: `npm ci` when the update changed
   * package-lock.json, the dashboard build when it changed the dashboard (or the lockfile), the
   * sandbox image's build when it changed sandbox-image/ (and the server runs an image that build made).
   */
  prepare: string[][];
  stopTimeoutMs: number;
  readyTimeoutMs: number;
  statusFile: string;
  logFile: string;
  /** Where the servers it starts write stdout and stderr. */
  serverLogFile: string;
}

export interface RelayStatus {
  relayPid: number;
  phase: 'stopping' | 'starting' | 'probing' | 'reverting' | 'restoring' | 'done';
  /** Set with phase `done`: the new version serves, the previous one serves again, or neither does. */
  outcome?: 'applied' | 'rolled_back' | 'failed';
  /** The server running now (the one that must finish the update's row). */
  pid?: number;
  url?: string;
  /** The commit the branch is at now (the revert commit after a rollback). */
  head?: string;
  error?: string;
  /** From the SIGTERM to the old server until a server answered `/readyz` 200. */
  downtimeMs?: number;
  updatedAt: string;
}

const BANNER = /Kiln is listening on (\S+)/;
const POLL_MS = 100;
const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Is the process still there? A zombie (exited, not yet reaped by its parent) counts as gone. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

/** Polls `fn` until it returns something other than undefined, or the deadline passes. */
async function until<T>(deadline: number, fn: () => T | undefined | Promise<T | undefined>): Promise<T | undefined> {
  for (;;) {
    const v = await fn();
    if (v !== undefined || Date.now() >= deadline) return v;
    await delay(POLL_MS);
  }
}

class Relay {
  private status: RelayStatus;
  private stopSentAt = 0;

  constructor(private readonly plan: RelayPlan) {
    this.status = { relayPid: process.pid, phase: 'stopping', updatedAt: new Date().toISOString() };
  }

  log(line: string): void {
    appendFileSync(this.plan.logFile, `${new Date().toISOString()} ${line}\n`);
  }

  write(patch: Partial<RelayStatus>): void {
    this.status = { ...this.status, ...patch, updatedAt: new Date().toISOString() };
    const tmp = `${this.plan.statusFile}.tmp`;
    writeFileSync(tmp, JSON.stringify(this.status, null, 2));
    renameSync(tmp, this.plan.statusFile);
    this.log(`status ${JSON.stringify(patch)}`);
  }

  /** SIGTERM (the server drains HTTP and its runs), then SIGKILL once the deadline passes. */
  async stop(pid: number): Promise<void> {
    if (!alive(pid)) return;
    this.log(`SIGTERM ${pid}`);
    process.kill(pid, 'SIGTERM');
    const gone = await until(Date.now() + this.plan.stopTimeoutMs, () => (alive(pid) ? undefined : true));
    if (gone) return;
    this.log(`${pid} still running after ${this.plan.stopTimeoutMs} ms: SIGKILL`);
    process.kill(pid, 'SIGKILL');
    await until(Date.now() + 10_000, () => (alive(pid) ? undefined : true));
  }

  run(cmd: string, args: string[]): Promise<string> {
    return new Promise((resolve, reject) => {
      execFile(
        cmd,
        args,
        { cwd: this.plan.sourceDir, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
        (err, stdout, stderr) => {
          this.log(`$ ${cmd} ${args.join(' ')}\n${stdout}${stderr}`);
          if (err) reject(new Error(`${cmd} ${args[0]} failed: ${(stderr || err.message).trim().slice(-2000)}`));
          else resolve(stdout.trim());
        },
      );
    });
  }

  git(args: string[]): Promise<string> {
    const identity = [
      '-c',
      'user.name=Kiln',
      '-c',
      'user.email=system@kiln.invalid',
      '-c',
      'core.hooksPath=/dev/null',
      '-c',
      'commit.gpgsign=false',
    ];
    return this.run('git', [...identity, ...args]);
  }

  /**
   * Starts a server detached (it must outlive the relay), reads the URL from its banner in the
   * log and probes `/readyz` until it answers 200; undefined when it does not in time.
   */
  async startAndProbe(): Promise<{ child?: ChildProcess; url?: string; ready: boolean; why?: string }> {
    for (const [cmd, ...args] of this.plan.prepare) {
      try {
        await this.run(cmd!, args);
      } catch (err) {
        // Nothing was started: the caller reverts (or reports) as for a server that never came up.
        this.log(`${[cmd, ...args].join(' ')} failed: ${(err as Error).message}`);
        return { ready: false, why: `\`${[cmd, ...args].join(' ')}\` failed` };
      }
    }
    const from = (() => {
      try {
        return statSync(this.plan.serverLogFile).size;
      } catch {
        return 0;
      }
    })();
    const out = openSync(this.plan.serverLogFile, 'a');
    const child = spawn(this.plan.command, this.plan.args, {
      cwd: this.plan.cwd,
      env: process.env,
      detached: true,
      stdio: ['ignore', out, out],
    });
    closeSync(out);
    child.unref();
    let exited = false;
    child.on('exit', (code, signal) => {
      exited = true;
      this.log(`server ${child.pid} exited (${code ?? signal})`);
    });
    this.log(`started server ${child.pid}: ${this.plan.command} ${this.plan.args.join(' ')}`);
    this.write({ phase: 'probing', pid: child.pid });
    const deadline = Date.now() + this.plan.readyTimeoutMs;
    const url = await until(deadline, () => {
      if (exited) return null;
      return BANNER.exec(readFileSync(this.plan.serverLogFile, 'utf8').slice(from))?.[1];
    });
    if (!url) return { child, ready: false };
    let last = '';
    const ready = await until(deadline, async () => {
      if (exited) return false;
      const res = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) }).catch(() => null);
      const seen = res ? `${res.status} ${await res.text()}` : 'no answer';
      if (seen !== last) this.log(`GET ${url}/readyz → ${(last = seen)}`);
      return res?.status === 200 ? true : undefined;
    });
    return { child, url, ready: ready === true };
  }

  async main(): Promise<void> {
    const p = this.plan;
    this.write({ phase: 'stopping' });
    this.stopSentAt = Date.now();
    await this.stop(p.oldPid);
    this.write({ phase: 'starting' });
    const next = await this.startAndProbe();
    if (next.ready) {
      this.write({
        phase: 'done',
        outcome: 'applied',
        pid: next.child?.pid,
        url: next.url,
        head: p.commit,
        downtimeMs: Date.now() - this.stopSentAt,
      });
      return;
    }
    const why =
      next.why ??
      (next.url
        ? `the new version did not answer /readyz 200 within ${p.readyTimeoutMs} ms`
        : 'the new version did not start listening');
    this.write({ phase: 'reverting', error: why });
    if (next.child?.pid) await this.stop(next.child.pid);
    let head: string;
    try {
      await this.git(['revert', '--no-commit', p.commit]);
      await this.git([
        'commit',
        '-q',
        '-m',
        `Revert platform update ${p.updateId}: ${why}\n\nKiln-Kind: source\nKiln-Update: ${p.updateId}\nKiln-Author: system`,
      ]);
      head = await this.git(['rev-parse', 'HEAD']);
    } catch (err) {
      await this.git(['revert', '--abort']).catch(() => undefined);
      this.write({ phase: 'done', outcome: 'failed', error: `${why}; the revert failed: ${(err as Error).message}` });
      return;
    }
    this.write({ phase: 'restoring', head });
    const back = await this.startAndProbe();
    this.write({
      phase: 'done',
      outcome: back.ready ? 'rolled_back' : 'failed',
      pid: back.child?.pid,
      url: back.url,
      head,
      error: back.ready ? why : `${why}; the previous version did not become ready either`,
      downtimeMs: Date.now() - this.stopSentAt,
    });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const plan = JSON.parse(readFileSync(process.argv[2]!, 'utf8')) as RelayPlan;
  const relay = new Relay(plan);
  relay.main().then(
    () => process.exit(0),
    (err: Error) => {
      relay.log(`relay failed: ${err.stack ?? err.message}`);
      relay.write({ phase: 'done', outcome: 'failed', error: `the relay failed: ${err.message}` });
      process.exit(1);
    },
  );
}
