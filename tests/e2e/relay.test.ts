import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { alive, type RelayPlan, type RelayStatus } from '../../apps/relay/src/relay.ts';

const RELAY = fileURLToPath(new URL('../../apps/relay/src/relay.ts', import.meta.url));

/** A stand-in server: prints Kiln's banner, answers /readyz 200, exits on SIGTERM. */
const SERVER = `
const http = require('node:http');
const s = http.createServer((req, res) => { res.writeHead(req.url === '/readyz' ? 200 : 404); res.end('ok'); });
s.listen(0, '127.0.0.1', () => console.log('Kiln is listening on http://127.0.0.1:' + s.address().port));
process.on('SIGTERM', () => s.close(() => process.exit(0)));
`;

/** The relay as the self-update starts it (its own process), on a scratch checkout. */
describe('the restart relay', () => {
  const cleanups: (() => void)[] = [];
  afterEach(() => {
    for (const c of cleanups.splice(0).reverse()) c();
  });

  it('a preparation that fails (npm ci, the dashboard build) counts as a start that never came up: revert, and the previous version serves', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kiln-relay-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const src = join(dir, 'src');
    const git = (...args: string[]) =>
      execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], {
        cwd: src,
        encoding: 'utf8',
      }).trim();
    execFileSync('git', ['init', '-q', '-b', 'main', src]);
    writeFileSync(join(src, 'server.cjs'), SERVER);
    git('add', '.');
    git('commit', '-q', '-m', 'previous');
    const previous = git('rev-parse', 'HEAD');
    // The update: a file that makes the preparation fail.
    writeFileSync(join(src, 'broken'), 'x');
    git('add', '.');
    git('commit', '-q', '-m', 'update');
    const commit = git('rev-parse', 'HEAD');

    const spawnServer = (): ChildProcess =>
      spawn(process.execPath, [join(src, 'server.cjs')], { cwd: src, stdio: ['ignore', 'pipe', 'inherit'] });
    const old = spawnServer();
    await once(old.stdout!, 'data');
    const plan: RelayPlan = {
      updateId: 'evo_relaytest',
      oldPid: old.pid!,
      command: process.execPath,
      args: [join(src, 'server.cjs')],
      cwd: src,
      sourceDir: src,
      commit,
      previous,
      prepare: [['sh', '-c', 'test ! -e broken || { echo "cannot build with broken" >&2; exit 3; }']],
      stopTimeoutMs: 5000,
      readyTimeoutMs: 10_000,
      statusFile: join(dir, 'status.json'),
      logFile: join(dir, 'relay.log'),
      serverLogFile: join(dir, 'server.log'),
    };
    writeFileSync(join(dir, 'plan.json'), JSON.stringify(plan));
    const relay = spawn(process.execPath, ['--import', 'tsx', RELAY, join(dir, 'plan.json')], { stdio: 'inherit' });
    const [code] = await once(relay, 'exit');
    expect(code).toBe(0);

    const status = JSON.parse(readFileSync(plan.statusFile, 'utf8')) as RelayStatus;
    if (status.pid) cleanups.push(() => alive(status.pid!) && process.kill(status.pid!, 'SIGTERM'));
    expect(status).toMatchObject({ phase: 'done', outcome: 'rolled_back' });
    expect(status.error).toContain('failed');
    expect(readFileSync(plan.logFile, 'utf8')).toContain('cannot build with broken');
    // The old server was stopped, the update reverted by a new commit, the previous version serves.
    expect(old.exitCode ?? (await once(old, 'exit'))[0]).toBe(0);
    expect(git('rev-parse', 'HEAD')).toBe(status.head);
    expect(git('rev-parse', 'HEAD^')).toBe(commit);
    expect(git('log', '-1', '--format=%B')).toContain('Kiln-Update: evo_relaytest');
    expect(existsSync(join(src, 'broken'))).toBe(false);
    expect((await fetch(`${status.url}/readyz`)).status).toBe(200);
  });
});
