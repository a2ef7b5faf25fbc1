import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { command, type CheckOptions } from '../../apps/api/src/platform/self-check.ts';
import { alive as running } from '../../apps/relay/src/relay.ts';

/**
 * A self-check's step is a real process tree (vitest and its workers, npm and its scripts): when
 * the step ends, for whatever reason, nothing it started may keep running. Real processes here.
 */
describe('a self-check step ends with everything it started', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-check-procs-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;

  const options = (stepTimeoutMs = 120_000): CheckOptions => ({
    stepTimeoutMs,
    readyTimeoutMs: 1000,
    stopTimeoutMs: 1000,
    children: new Set(),
  });
  /**
   * A step that starts a child of its own (as vitest starts its workers, inheriting the log's
   * pipe), writes that child's pid to a file, then waits forever or (`exits`) ends at once.
   */
  const script = (exits: boolean) => {
    const pidFile = join(dir, `grandchild-${++n}`);
    const code = `
      const { spawn } = require('node:child_process');
      const { writeFileSync } = require('node:fs');
      const g = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'inherit' });
      writeFileSync(${JSON.stringify(pidFile)}, String(g.pid));
      ${exits ? 'process.exit(0)' : 'setInterval(() => {}, 1000)'};`;
    return { pidFile, args: ['-e', code] };
  };
  /**
   * The pipe closes while a killed process is still exiting, a moment before it is a zombie:
   * wait for that (a process left running stays running, and this fails).
   */
  const ended = (pid: number) => vi.waitFor(() => expect(running(pid)).toBe(false), { timeout: 5000, interval: 20 });
  const grandchild = (pidFile: string) =>
    vi.waitFor(
      () => {
        const pid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) : 0;
        expect(pid).toBeGreaterThan(0);
        return pid;
      },
      { timeout: 30_000, interval: 20 },
    );

  it('when another step failed (abort): the step and its child are gone and the result comes', async () => {
    const { pidFile, args } = script(false);
    const stop = new AbortController();
    const o = options();
    const result = command(o, dir, process.execPath, args, stop.signal);
    const pid = await grandchild(pidFile);
    expect(running(pid)).toBe(true);
    stop.abort();
    const r = await result;
    expect(r.ok).toBe(false);
    await ended(pid);
    expect(o.children.size).toBe(0);
  });

  it('at the step deadline: the same, and the log says it was killed', async () => {
    const { pidFile, args } = script(false);
    const o = options(1500);
    const result = command(o, dir, process.execPath, args);
    const pid = await grandchild(pidFile);
    const r = await result;
    expect(r.log).toContain('[killed after 1500 ms]');
    await ended(pid);
  });

  it('a step that passes but leaves a process running: that process is ended with it', async () => {
    const { pidFile, args } = script(true);
    const r = await command(options(), dir, process.execPath, args);
    expect(r.ok).toBe(true);
    await ended(await grandchild(pidFile));
  });
});
