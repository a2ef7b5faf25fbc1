/**
 * Sandbox node benchmark (`npm run bench:fleet`): prints figures, never fails on time.
 *
 * Two servers, each its own process on its own PGlite: L runs sandboxes on the local Docker
 * Engine as `npm start` does; R places them on one sandbox node (a node process on loopback,
 * over the node protocol: HTTP/2, mutual TLS) with KILN_SANDBOX_LOCAL=off. Both use the same
 * engine, so the difference is the node's path. Neither has a warm pool (cold starts are cold).
 *
 *  1. warm exec of print(1): R against L (target ≤ 1.3×), in alternating blocks
 *  2. new session to first result: R against L, alternating
 *  3. first exec of a new session for a 64 MB workspace on the node that ran it before (the node
 *     keeps its tree and is sent what changed: nothing here), against an empty workspace on the
 *     same node (target ≤ 1.5×), and the same on L for reference; and once, its very first session
 *     there (the whole tree sent)
 *  4. pause to disk and resume of a gVisor sandbox holding 10 MB of Python objects: R (the node
 *     checkpoints it on its host) against L, alternating
 *
 * BENCH_N (warm execs per server, 100), BENCH_COLD_N (10), BENCH_SIZE_N (5), BENCH_PAUSE_N (5)
 * change the sizes.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateKey } from '../apps/api/src/auth/keys.ts';
import { issue, makeAuthority } from '../apps/api/src/sandbox/node/pki.ts';
import { freePort } from '../tests/support/checkout.ts';
import { startKiln } from '../tests/support/server.ts';
import { apiCaller, heading, row, summarize, timeEach, UNTHROTTLED } from './lib.ts';
import { fillWorkspace } from './sandbox-workspace.ts';

const N = Number(process.env.BENCH_N ?? 100);
const COLD_N = Number(process.env.BENCH_COLD_N ?? 10);
const SIZE_N = Number(process.env.BENCH_SIZE_N ?? 5);
const PAUSE_N = Number(process.env.BENCH_PAUSE_N ?? 5);
const BLOCK = 20;
const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
const MAIN = fileURLToPath(new URL('../apps/api/src/node-main.ts', import.meta.url));

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'kiln-bench-fleet-'));
  const ca = await makeAuthority('bench');
  const write = (name: string, c: { cert: string; key: string; ca: string }) => {
    writeFileSync(join(dir, `${name}.pem`), c.cert);
    writeFileSync(join(dir, `${name}.key`), c.key, { mode: 0o600 });
    writeFileSync(join(dir, 'ca.pem'), c.ca);
  };
  write('node-1', await issue(ca, { role: 'node', name: 'node-1', hosts: ['127.0.0.1'] }));
  write('replica', await issue(ca, { role: 'api', name: 'replica' }));
  const nodePort = await freePort();
  const node = spawn(process.execPath, ['--import', 'tsx', MAIN], {
    env: {
      PATH: process.env.PATH,
      ...(process.env.DOCKER_HOST ? { DOCKER_HOST: process.env.DOCKER_HOST } : {}),
      KILN_NODE_NAME: 'node-1',
      KILN_DATA_DIR: join(dir, 'node-data'),
      KILN_NODE_CERT: join(dir, 'node-1.pem'),
      KILN_NODE_KEY: join(dir, 'node-1.key'),
      KILN_NODE_CA: join(dir, 'ca.pem'),
      KILN_NODE_HOST: '127.0.0.1',
      KILN_NODE_PORT: String(nodePort),
      KILN_LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    let out = '';
    node.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('listening on')) resolve();
    });
    node.on('exit', (code) => reject(new Error(`the node exited (${code})`)));
  });
  const adminKey = generateKey('admin');
  const common = {
    KILN_ADMIN_KEY: adminKey,
    KILN_SANDBOX_POOL_SIZE: '0',
    KILN_SANDBOX_PREPARED_POOL_SIZE: '0',
    ...UNTHROTTLED,
    KILN_SANDBOX_IMAGE: image,
    KILN_LOG_LEVEL: 'warn',
  };
  const local = await startKiln({
    ...common,
    KILN_DATA_DIR: join(dir, 'local'),
    KILN_INSTANCE_ID: `bench-l-${process.pid}`,
  });
  const remote = await startKiln({
    ...common,
    KILN_DATA_DIR: join(dir, 'remote'),
    KILN_INSTANCE_ID: `bench-r-${process.pid}`,
    KILN_SANDBOX_NODES: 'on',
    KILN_SANDBOX_LOCAL: 'off',
    KILN_NODE_CERT: join(dir, 'replica.pem'),
    KILN_NODE_KEY: join(dir, 'replica.key'),
    KILN_NODE_CA: join(dir, 'ca.pem'),
  });
  try {
    const servers = { local, remote };
    const ctx: Record<string, { call: ReturnType<typeof apiCaller>; key: string; dataDir: string }> = {};
    for (const [name, s] of Object.entries(servers)) {
      const call = apiCaller(() => s.url);
      const team = await call(adminKey, 'POST', '/v1/teams', { name: 'bench' });
      const { key } = await call(adminKey, 'POST', `/v1/teams/${team.id}/keys`, { name: 'b', role: 'owner' });
      ctx[name] = { call, key, dataDir: join(dir, name) };
    }
    await ctx.remote!.call(adminKey, 'POST', '/v1/system/nodes', {
      name: 'node-1',
      url: `https://127.0.0.1:${nodePort}`,
    });
    const newWorkspace = async (name: string, which: 'local' | 'remote') =>
      // runc on both: the fleet offers what its members had when R started (none yet: runc only).
      (
        await ctx[which]!.call(ctx[which]!.key, 'POST', '/v1/workspaces', {
          name,
          settings: { sandbox: { runtime: 'runc' } },
        })
      ).id as string;
    const firstExec = async (which: 'local' | 'remote', ws: string) => {
      const { call, key } = ctx[which]!;
      const t0 = performance.now();
      const s = (await call(key, 'POST', `/v1/workspaces/${ws}/sessions`, {})).id as string;
      await call(key, 'POST', `/v1/sessions/${s}/exec`, { code: 'print(1)' });
      const ms = performance.now() - t0;
      await call(key, 'DELETE', `/v1/sessions/${s}`);
      return ms;
    };

    heading(`1. warm exec of print(1), ${N} per server, in alternating blocks of ${BLOCK}`);
    const warm: Record<'local' | 'remote', number[]> = { local: [], remote: [] };
    const sessions: Record<string, string> = {};
    for (const which of ['local', 'remote'] as const) {
      const { call, key } = ctx[which]!;
      const ws = await newWorkspace('warm', which);
      sessions[which] = (await call(key, 'POST', `/v1/workspaces/${ws}/sessions`, {})).id;
      await call(key, 'POST', `/v1/sessions/${sessions[which]}/exec`, { code: 'print(1)' });
    }
    for (let done = 0; done < N; done += BLOCK)
      for (const which of ['local', 'remote'] as const) {
        const { call, key } = ctx[which]!;
        warm[which].push(
          ...(await timeEach(
            Math.min(BLOCK, N - done),
            () => call(key, 'POST', `/v1/sessions/${sessions[which]}/exec`, { code: 'print(1)' }),
            2,
          )),
        );
      }
    const wl = summarize(warm.local);
    process.stdout.write(`${row('local engine: POST /exec', wl)}\n`);
    process.stdout.write(`${row('through a node (loopback, mutual TLS): POST /exec', summarize(warm.remote), wl)}\n`);

    heading(`2. new session to first result (no warm pool), ${COLD_N} per server, alternating`);
    const cold: Record<'local' | 'remote', number[]> = { local: [], remote: [] };
    const coldWs = { local: await newWorkspace('cold', 'local'), remote: await newWorkspace('cold', 'remote') };
    for (let i = 0; i < COLD_N; i++)
      for (const which of ['local', 'remote'] as const) cold[which].push(await firstExec(which, coldWs[which]));
    const cl = summarize(cold.local);
    process.stdout.write(`${row('local engine: new session + first exec', cl)}\n`);
    process.stdout.write(`${row('on a node: new session + first exec', summarize(cold.remote), cl)}\n`);

    heading(`3. first exec of a new session by workspace size, ${SIZE_N} sessions each (no warm pool)`);
    for (const which of ['remote', 'local'] as const) {
      const empty = await newWorkspace('size-0', which);
      const big = await newWorkspace('size-64', which);
      fillWorkspace(join(ctx[which]!.dataDir, 'workspaces', big), 64);
      // The node (or engine) runs each once before the timing: the "has run it before" case.
      await firstExec(which, empty);
      const firstTime = await firstExec(which, big);
      const e: number[] = [];
      const b: number[] = [];
      for (let i = 0; i < SIZE_N; i++) {
        e.push(await firstExec(which, empty));
        b.push(await firstExec(which, big));
      }
      const es = summarize(e);
      const label = which === 'remote' ? 'on a node' : 'local engine';
      process.stdout.write(`${row(`${label}: empty workspace`, es)}\n`);
      process.stdout.write(`${row(`${label}: 64 MB workspace`, summarize(b), es)}\n`);
      // Once, before the timing: a node then had no copy of the workspace and was sent all of it.
      process.stdout.write(
        `${row(`${label}: 64 MB workspace, its first session there`, summarize([firstTime]), es)}\n`,
      );
    }

    heading(`4. pause to disk and resume, a gVisor sandbox holding 10 MB, ${PAUSE_N} times per server, alternating`);
    const paused: Record<'local' | 'remote', { pause: number[]; resume: number[]; session: string }> = {
      local: { pause: [], resume: [], session: '' },
      remote: { pause: [], resume: [], session: '' },
    };
    for (const which of ['local', 'remote'] as const) {
      const { call, key } = ctx[which]!;
      // The node has been heard by now: R offers gVisor as it does.
      const ws = await call(key, 'POST', '/v1/workspaces', {
        name: 'pause',
        settings: { sandbox: { runtime: 'gvisor' } },
      });
      paused[which].session = (await call(key, 'POST', `/v1/workspaces/${ws.id}/sessions`, {})).id;
      await call(key, 'POST', `/v1/sessions/${paused[which].session}/exec`, {
        code: 'import os\nblob = [os.urandom(1024) for _ in range(10 * 1024)]',
      });
    }
    for (let i = 0; i < PAUSE_N; i++)
      for (const which of ['local', 'remote'] as const) {
        const { call, key } = ctx[which]!;
        const s = paused[which].session;
        let t0 = performance.now();
        await call(key, 'POST', `/v1/sessions/${s}/pause`, {});
        paused[which].pause.push(performance.now() - t0);
        t0 = performance.now();
        await call(key, 'POST', `/v1/sessions/${s}/resume`, {});
        paused[which].resume.push(performance.now() - t0);
      }
    for (const which of ['local', 'remote'] as const) {
      const r = await ctx[which]!.call(ctx[which]!.key, 'POST', `/v1/sessions/${paused[which].session}/exec`, {
        code: 'print(len(blob))',
      });
      if (r.stdout !== '10240\n') throw new Error(`${which}: the resumed sandbox lost its objects (${r.stdout})`);
    }
    const lp = summarize(paused.local.pause);
    const lr = summarize(paused.local.resume);
    process.stdout.write(`${row('local engine: POST /pause', lp)}\n`);
    process.stdout.write(`${row('on a node: POST /pause', summarize(paused.remote.pause), lp)}\n`);
    process.stdout.write(`${row('local engine: POST /resume', lr)}\n`);
    process.stdout.write(`${row('on a node: POST /resume', summarize(paused.remote.resume), lr)}\n`);
  } finally {
    for (const s of [local, remote]) {
      s.child.kill('SIGTERM');
      await s.exited;
    }
    node.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
