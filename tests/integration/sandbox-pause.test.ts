import { execFile, execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { RunnerClient } from '../../apps/api/src/sandbox/runner-client.ts';
import { converse } from '../support/agent.ts';
import { useAgentApp } from '../support/agent-app.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { exec, mountedHere, sessionIn } from '../support/sandbox.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const IDLE_S = 60;
const LIFETIME_MS = 7_200_000;
const INSTANCE = `test-pause-${Math.random().toString(36).slice(2, 8)}`;

/** The sandbox's container: whether it runs, or null when it is gone. */
async function containerOf(sandboxId: string): Promise<{ running: boolean } | null> {
  const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  return c ? { running: c.State === 'running' } : null;
}

/** Deletes a paused container's checkpoint behind Kiln's back (a disk cleaned by hand, say). */
async function deleteCheckpoint(sandboxId: string): Promise<void> {
  const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${sandboxId}`] } });
  const container = docker.getContainer(c!.Id) as unknown as { deleteCheckpoint(name: string): Promise<unknown> };
  await container.deleteCheckpoint('kiln');
}

function metric(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(name));
  return line ? Number(line.split(' ').pop()) : Number.NaN;
}

describe('paused sandboxes: pause to disk at idle, resume with every variable kept (gVisor)', () => {
  let now = Date.now();
  let t: TestApp;
  let team: { id: string; key: string };
  let viewer: string;
  const advance = (ms: number) => (now += ms);
  const rowOf = async (id: string) => (await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, id)))[0]!;
  const gvisor = { sandbox: { runtime: 'gvisor', idle_s: IDLE_S } };
  /** Another replica's engine settings: no warm pool, this suite's clock and lifetime. */
  const replicaSettings = { sandbox: { poolSize: 0, maxLifetimeMs: LIFETIME_MS, perTeamMax: 20, now: () => now } };
  /** Waits until a replica no longer holds the session's runner (another took it over: the runner dropped it). */
  const untilLetGo = async (app: TestApp, session: string) => {
    for (const end = Date.now() + 30_000; app.engine.holds(session); await new Promise((r) => setTimeout(r, 50)))
      if (Date.now() > end) throw new Error("the replica still holds the runner's connection");
  };
  /** Lets the session's sandbox sit idle past its idle time, and reaps: it is paused. */
  const idle = async () => {
    advance(IDLE_S * 1000 + 1000);
    await t.engine.reap();
  };

  beforeAll(async () => {
    t = await createTestApp({
      sandbox: { poolSize: 0, maxLifetimeMs: LIFETIME_MS, perTeamMax: 20, now: () => now },
      env: { KILN_INSTANCE_ID: INSTANCE, KILN_SANDBOX_PAUSED_TTL_S: '3600' },
    });
    team = await t.team('pause');
    const k = await t.call('POST', `/v1/teams/${team.id}/keys`, {
      key: t.adminKey,
      body: { name: 'viewer', role: 'viewer' },
    });
    viewer = k.body.key;
  });
  afterAll(async () => {
    // Paused sandboxes outlive their server by design: this file's go (with their mounts) before it stops.
    const paused = await t.database.db.select().from(sandboxes).where(eq(sandboxes.state, 'paused'));
    for (const row of paused) await t.engine.removeForTeam(row.teamId, row.id);
    await t?.close();
    expect(await docker.listContainers({ all: true, filters: { label: [`kiln.owner=${INSTANCE}`] } })).toEqual([]);
  });

  it('pauses an idle sandbox (its container stopped) and resumes it at the next exec with its variables', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const first = await exec(
      t,
      team.key,
      session,
      'import os\nx = 41\nblob = bytearray(30 * 2**20)\npid = os.getpid()',
    );
    expect(first.error).toBeUndefined();
    await idle();
    const paused = await rowOf(first.sandbox_id);
    expect(paused.state).toBe('paused');
    expect(paused.checkpointBytes).toBeGreaterThan(0);
    expect(await containerOf(first.sandbox_id)).toEqual({ running: false });
    const got = await t.call('GET', `/v1/sessions/${session}`, { key: team.key });
    expect(got.body.sandbox).toMatchObject({ id: first.sandbox_id, state: 'paused', runtime: 'gvisor' });
    expect(got.body.sandbox.checkpoint_bytes).toBe(paused.checkpointBytes);
    const listed = await t.call('GET', '/v1/sandboxes', { key: team.key });
    expect(listed.body.data.find((s: { id: string }) => s.id === first.sandbox_id)).toMatchObject({
      state: 'paused',
      memory_bytes: null,
    });
    const metrics = await t.call('GET', '/metrics', { key: t.adminKey });
    expect(metric(metrics.body, 'kiln_sandboxes{state="paused"}')).toBeGreaterThanOrEqual(1);
    expect(metric(metrics.body, 'kiln_sandbox_checkpoint_bytes{of="all"}')).toBeGreaterThanOrEqual(
      paused.checkpointBytes!,
    );
    expect(metric(metrics.body, 'kiln_sandbox_pause_duration_seconds_count')).toBeGreaterThanOrEqual(1);

    const again = await exec(t, team.key, session, 'print(x + 1, len(blob), os.getpid() == pid)');
    expect(again.stdout).toBe(`42 ${30 * 2 ** 20} True\n`);
    expect(again.restarted).toBe(false);
    expect(again.sandbox_id).toBe(first.sandbox_id);
    expect((again as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
    expect(await containerOf(first.sandbox_id)).toEqual({ running: true });
    expect((await rowOf(first.sandbox_id)).state).toBe('ready');
    expect((await rowOf(first.sandbox_id)).checkpoint).toBeNull();
    // Only the first result after the resume says so.
    const third = await exec(t, team.key, session, 'x += 1\nprint(x)');
    expect(third.stdout).toBe('42\n');
    expect((third as { resumed_ms?: number }).resumed_ms).toBeUndefined();
    // A resumed sandbox pauses and resumes again, as often as it sits idle.
    for (const want of [43, 44]) {
      await idle();
      expect((await rowOf(first.sandbox_id)).state).toBe('paused');
      const next = await exec(t, team.key, session, 'x += 1\nprint(x)');
      expect(next).toMatchObject({ stdout: `${want}\n`, sandbox_id: first.sandbox_id, restarted: false });
    }
  });

  it('a resume leaves no copy of the checkpoint (the sandbox\u2019s memory) on the host: containerd\u2019s unpacked copy is removed', async () => {
    // This engine's containerd unpacks a checkpoint to restore it into <its temp dir>/ctrd-checkpoint<n>,
    // and never removes it; its temp dir here is /tmp (it has neither XDG_RUNTIME_DIR nor TMPDIR).
    const containerd = readdirSync('/proc')
      .filter((p) => /^\d+$/.test(p))
      .find((p) => {
        try {
          return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('/var/run/docker/containerd/containerd.toml');
        } catch {
          return false;
        }
      });
    expect(containerd).toBeDefined();
    expect(readFileSync(`/proc/${containerd}/environ`, 'utf8')).not.toMatch(/(^|\0)(XDG_RUNTIME_DIR|TMPDIR)=/);
    const copiesOf = (image: { size: number; mtime: number }) =>
      readdirSync('/tmp')
        .filter((d) => d.startsWith('ctrd-checkpoint'))
        .filter((d) => {
          try {
            const s = statSync(join('/tmp', d, 'checkpoint.img'));
            return s.size === image.size && Math.floor(s.mtimeMs / 1000) === image.mtime;
          } catch {
            return false;
          }
        });

    const { session } = await sessionIn(t, team, gvisor);
    const first = await exec(t, team.key, session, 'kept = "in memory"');
    await idle();
    expect((await rowOf(first.sandbox_id)).state).toBe('paused');
    const [c] = await docker.listContainers({ all: true, filters: { label: [`kiln.sandbox=${first.sandbox_id}`] } });
    const { DockerRootDir } = (await docker.info()) as { DockerRootDir: string };
    const s = statSync(join(DockerRootDir, 'containers', c!.Id, 'checkpoints', 'kiln', 'checkpoint.img'));
    const image = { size: s.size, mtime: Math.floor(s.mtimeMs / 1000) };
    const again = await exec(t, team.key, session, 'print(kept)');
    expect(again).toMatchObject({ stdout: 'in memory\n', sandbox_id: first.sandbox_id });
    expect((again as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
    expect(copiesOf(image)).toEqual([]);
  });

  it('a sandbox holding more than half its memory resumes with it: the restore is not counted twice against its limit', async () => {
    const { session } = await sessionIn(t, team, { sandbox: { runtime: 'gvisor', idle_s: IDLE_S, memory_mb: 256 } });
    // 150 MB of 256: after a restore, gVisor's own accounting counts it twice (300 MB), and the
    // runner's memory watchdog killed the interpreter at the first cell before it took that off.
    const r = await exec(t, team.key, session, 'import os\nblob = os.urandom(150 * 2**20)');
    expect(r.error).toBeUndefined();
    await idle();
    expect((await rowOf(r.sandbox_id)).state).toBe('paused');
    const after = await exec(t, team.key, session, 'print(len(blob))');
    expect(after).toMatchObject({ stdout: `${150 * 2 ** 20}\n`, restarted: false });
    expect(after.error).toBeUndefined();
    expect((await exec(t, team.key, session, 'x = bytes(20 * 2**20)\nprint(len(x) + len(blob))')).stdout).toBe(
      `${170 * 2 ** 20}\n`,
    );
  });

  it('pause and resume on request: audited, refused to a viewer, and a 409 that says why when there is nothing to do', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'y = "kept"');
    expect((await t.call('POST', `/v1/sessions/${session}/pause`, { key: viewer })).status).toBe(403);
    const p = await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key });
    expect(p.status).toBe(200);
    expect(p.body).toMatchObject({ session_id: session, sandbox_id: r.sandbox_id, state: 'paused' });
    const twice = await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key });
    expect(twice.status).toBe(409);
    expect(twice.body.error.message).toMatch(/no running sandbox/);
    const res = await t.call('POST', `/v1/sessions/${session}/resume`, { key: team.key });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ session_id: session, sandbox_id: r.sandbox_id, state: 'running' });
    expect(res.body.resumed_ms).toBeGreaterThan(0);
    expect((await exec(t, team.key, session, 'print(y)')).stdout).toBe('kept\n');
    const none = await t.call('POST', `/v1/sessions/${session}/resume`, { key: team.key });
    expect(none.status).toBe(200);
    expect(none.body.resumed_ms).toBeNull();
    const audit = await t.call('GET', '/v1/audit?limit=50', { key: team.key });
    const actions = audit.body.data.map((e: { action: string }) => e.action);
    expect(actions).toEqual(expect.arrayContaining(['session.pause', 'session.resume']));

    // runc sandboxes are removed at idle, as always: pausing one is refused, saying why.
    const runc = await sessionIn(t, team, { sandbox: { runtime: 'runc' } });
    await exec(t, team.key, runc.session, 'z = 1');
    const refused = await t.call('POST', `/v1/sessions/${runc.session}/pause`, { key: team.key });
    expect(refused.status).toBe(409);
    expect(refused.body.error.message).toMatch(/only gVisor sandboxes/);
    const nothing = await t.call('POST', `/v1/sessions/${runc.session}/resume`, { key: team.key });
    expect(nothing.status).toBe(200);
    expect(nothing.body.resumed_ms).toBeNull();
  });

  it('a file read resumes the sandbox, and what was committed while it slept reaches its /workspace', async () => {
    const { ws, session } = await sessionIn(t, team, gvisor);
    await exec(t, team.key, session, 'open("/tmp/note.txt", "w").write("from before the pause")');
    await idle();
    const put = await t.call('PUT', `/v1/workspaces/${ws}/files?path=data.txt`, {
      key: team.key,
      raw: 'committed while paused',
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(put.status).toBeLessThan(300);
    const read = await t.call('GET', `/v1/sessions/${session}/files?path=/tmp/note.txt`, { key: team.key });
    expect(read.status).toBe(200);
    expect(read.body).toBe('from before the pause');
    const seen = await exec(t, team.key, session, 'print(open("/workspace/data.txt").read())');
    expect(seen.stdout).toBe('committed while paused\n');
  });

  it('a checkpoint past its paused time is deleted, and the session is told at its next exec', async () => {
    const { session } = await sessionIn(t, team, { sandbox: { runtime: 'gvisor', idle_s: IDLE_S, paused_ttl_s: 120 } });
    const r = await exec(t, team.key, session, 'w = 1');
    await idle();
    expect((await rowOf(r.sandbox_id)).state).toBe('paused');
    advance(121_000);
    await t.engine.reap();
    expect(await containerOf(r.sandbox_id)).toBeNull();
    expect(await rowOf(r.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'paused_expired' });
    const next = await exec(t, team.key, session, 'print("w" in globals())');
    expect(next.stdout).toBe('False\n');
    expect(next.restarted).toBe(true);
    expect((next as { restart_reason?: string }).restart_reason).toBe('paused_expired');
  });

  it('a checkpoint that is gone gives a new sandbox that says so, never a 500; paused_ttl_s 0 removes at idle', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'v = 1');
    await idle();
    await deleteCheckpoint(r.sandbox_id);
    const next = await exec(t, team.key, session, 'print("v" in globals())');
    expect(next.stdout).toBe('False\n');
    expect(next.restarted).toBe(true);
    expect((next as { restart_reason?: string }).restart_reason).toBe('resume_failed');
    expect(next.sandbox_id).not.toBe(r.sandbox_id);
    expect(await containerOf(r.sandbox_id)).toBeNull();

    const never = await sessionIn(t, team, { sandbox: { runtime: 'gvisor', idle_s: IDLE_S, paused_ttl_s: 0 } });
    const n = await exec(t, team.key, never.session, 'u = 1');
    await idle();
    expect(await rowOf(n.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'idle' });
  });

  it('time paused does not count against the hard lifetime: a sandbox paused overnight resumes, and ends when its running time is up', async () => {
    const { session } = await sessionIn(t, team, {
      sandbox: { runtime: 'gvisor', idle_s: IDLE_S, paused_ttl_s: 86_400 },
    });
    const r = await exec(t, team.key, session, 'night = "over"');
    await idle();
    // Longer than its whole hard lifetime (2 h), paused.
    advance(3 * LIFETIME_MS);
    await t.engine.reap();
    expect((await rowOf(r.sandbox_id)).state).toBe('paused');
    const morning = await exec(t, team.key, session, 'print(night)');
    expect(morning).toMatchObject({ stdout: 'over\n', sandbox_id: r.sandbox_id, restarted: false });
    // What was left of its lifetime when it was paused (2 h less the ~61 s it ran) is left now.
    const ends = (await rowOf(r.sandbox_id)).lifetimeEndsAt!.getTime();
    expect(ends).toBeGreaterThan(now + LIFETIME_MS - 120_000);
    expect(ends).toBeLessThanOrEqual(now + LIFETIME_MS);
    await t.engine.reap();
    expect(await containerOf(r.sandbox_id)).toEqual({ running: true });
    // Kept busy past it (keepalive), it ends at its hard lifetime as any sandbox does.
    advance(ends - now + 1000);
    await t.call('POST', `/v1/sessions/${session}/keepalive`, { key: team.key });
    await t.engine.reap();
    expect(await containerOf(r.sandbox_id)).toBeNull();
    expect((await rowOf(r.sandbox_id)).state).toBe('removed');
  });

  it('checkpoints are kept within the team\u2019s disk cap: the oldest paused goes first, and its session is told', async () => {
    // One sandbox's checkpoint, measured here: the cap holds two of them, not three.
    const probe = await sessionIn(t, team, gvisor);
    const p = await exec(t, team.key, probe.session, 'a = 1');
    await idle();
    const one = (await rowOf(p.sandbox_id)).checkpointBytes!;
    const capped = await createTestApp({
      sandbox: {
        poolSize: 0,
        perTeamMax: 2,
        now: () => now,
        pause: { maxBytes: { team: Math.round(2.5 * one), all: 1e12 } },
      },
      env: { KILN_INSTANCE_ID: `${INSTANCE}-cap` },
    });
    try {
      const other = await capped.team('cap');
      const made: { session: string; sandbox: string }[] = [];
      for (let i = 0; i < 3; i++) {
        const { session } = await sessionIn(capped, other, gvisor);
        const r = await exec(capped, other.key, session, `i = ${i}`);
        const paused = await capped.call('POST', `/v1/sessions/${session}/pause`, { key: other.key });
        expect(paused.status).toBe(200);
        made.push({ session, sandbox: r.sandbox_id });
        advance(1000);
      }
      const rowIn = async (id: string) =>
        (await capped.database.db.select().from(sandboxes).where(eq(sandboxes.id, id)))[0]!;
      const states = await Promise.all(made.map(async (m) => (await rowIn(m.sandbox)).state));
      expect(states).toEqual(['removed', 'paused', 'paused']);
      expect((await rowIn(made[0]!.sandbox)).removedReason).toBe('checkpoint_reclaimed');
      const told = await exec(capped, other.key, made[0]!.session, 'print("i" in globals())');
      expect(told).toMatchObject({ stdout: 'False\n', restarted: true, restart_reason: 'checkpoint_reclaimed' });
      expect((await exec(capped, other.key, made[2]!.session, 'print(i)')).stdout).toBe('2\n');
      // Paused sandboxes count against no cap, but a resumed one does: with two running (the
      // team's cap), the third stays paused until one goes.
      const over = await capped.call('POST', `/v1/sessions/${made[1]!.session}/exec`, {
        key: other.key,
        body: { code: 'print(i)' },
      });
      expect(over.status).toBe(429);
      expect(over.body.error.code).toBe('sandbox_unavailable');
      expect((await rowIn(made[1]!.sandbox)).state).toBe('paused');
      await capped.call('DELETE', `/v1/sessions/${made[2]!.session}`, { key: other.key });
      expect((await exec(capped, other.key, made[1]!.session, 'print(i)')).stdout).toBe('1\n');
      for (const m of [made[0]!, made[1]!])
        expect((await capped.call('DELETE', `/v1/sessions/${m.session}`, { key: other.key })).status).toBe(200);
    } finally {
      // Paused containers outlive their server by design: a failure above must not leave them behind.
      for (const c of await docker.listContainers({ all: true, filters: { label: [`kiln.owner=${INSTANCE}-cap`] } }))
        await capped.engine.removeForTeam(c.Labels['kiln.team']!, c.Labels['kiln.sandbox']!).catch(() => undefined);
      await capped.close();
    }
  });

  it('two requests racing to resume one sandbox resume it once', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'n = 0');
    await idle();
    const before = metric(
      (await t.call('GET', '/metrics', { key: t.adminKey })).body,
      'kiln_sandbox_resume_duration_seconds_count',
    );
    const [a, b] = await Promise.all([
      exec(t, team.key, session, 'n += 1\nprint(n)'),
      exec(t, team.key, session, 'n += 1\nprint(n)'),
    ]);
    expect([a.stdout, b.stdout].sort()).toEqual(['1\n', '2\n']);
    expect(a.sandbox_id).toBe(r.sandbox_id);
    expect(b.sandbox_id).toBe(r.sandbox_id);
    const after = metric(
      (await t.call('GET', '/metrics', { key: t.adminKey })).body,
      'kiln_sandbox_resume_duration_seconds_count',
    );
    expect(after - before).toBe(1);
  });

  it('an engine is tried for real at start-up: a probe sandbox checkpointed and restored, the outcome kept; a probe that fails turns pausing off and says why', async () => {
    const image = process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest';
    // A name of its own for the sandbox image: no outcome is kept for it yet, so the probe runs.
    const alias = `kiln-probe-test:${INSTANCE}`;
    execFileSync('docker', ['tag', image, alias]);
    let kept: string[] = [];
    try {
      const { DockerRootDir } = (await docker.info()) as { DockerRootDir: string };
      const tried = new DockerBackend(docker, { probeImage: alias });
      const gvisor = (await tried.capabilities()).runtimes.find((r) => r.runtime === 'gvisor');
      expect(gvisor).toMatchObject({ pause: true });
      expect(gvisor?.pauseOff).toBeUndefined();
      // Kept in a file of its image's own: another file's server, of another image, probing
      // meanwhile leaves it alone.
      kept = readdirSync(DockerRootDir)
        .filter((f) => /^kiln-checkpoint-probe-[0-9a-f]{16}\.json$/.test(f))
        .map((f) => join(DockerRootDir, f))
        .filter((f) => readFileSync(f, 'utf8').includes(JSON.stringify(alias)));
      expect(kept).toHaveLength(1);

      const broken = new DockerBackend(docker, { probeImage: `kiln-no-such-image:${INSTANCE}` });
      const off = (await broken.capabilities()).runtimes.find((r) => r.runtime === 'gvisor');
      expect(off).toMatchObject({ pause: false });
      expect(off?.pauseOff).toMatch(/probe sandbox could not be checkpointed and restored.*no such image/i);
    } finally {
      execFileSync('docker', ['rmi', alias], { stdio: 'ignore' });
      for (const f of kept) rmSync(f, { force: true });
    }
  });

  it('a reaper pass running alongside a pause leaves the sandbox being paused (its container and its mount) alone', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'kept_through = "the reaper"');
    // Reaper passes, one after another, for as long as the checkpoint is being written: before the
    // row says paused, the container is neither live nor paused to a pass that only read the rows.
    let pausing = true;
    const paused = t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key }).finally(() => (pausing = false));
    let passes = 0;
    while (pausing) {
      await t.engine.reap();
      passes++;
    }
    const answer = await paused;
    expect(answer.status, JSON.stringify(answer.body)).toBe(200);
    expect(passes).toBeGreaterThan(0);
    expect(await containerOf(r.sandbox_id)).toEqual({ running: false });
    await t.engine.reap();
    expect(await containerOf(r.sandbox_id)).toEqual({ running: false });
    const after = await exec(t, team.key, session, 'print(kept_through)');
    expect(after, JSON.stringify(after)).toMatchObject({ stdout: 'the reaper\n', restarted: false });
  });

  it('code in the sandbox cannot take over its runner: a connection that cannot prove itself the host is dropped', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    await exec(t, team.key, session, 'secret_state = 7');
    const attack = await exec(
      t,
      team.key,
      session,
      [
        'import socket, struct, json',
        's = socket.socket(socket.AF_UNIX)',
        's.connect(b"\\0kiln-runner")',
        // Read whole (a stream may give a frame in parts); None once the runner has closed it.
        'def exactly(n):',
        '    got = b""',
        '    while len(got) < n:',
        '        part = s.recv(n - len(got))',
        '        if not part: return None',
        '        got += part',
        '    return got',
        'head = exactly(4)',
        'nonce = head and exactly(struct.unpack(">I", head)[0])',
        'for op in ({"op": "auth", "mac": "00" * 32}, {"op": "key", "key": "AAAA"}):',
        '    body = json.dumps(op).encode()',
        '    try: s.sendall(struct.pack(">I", len(body)) + body)',
        '    except OSError: pass',
        // Dropped with our second frame still unread on its side: Linux resets the connection then.
        'try: rest = s.recv(100)',
        'except ConnectionResetError: rest = b""',
        'print("dropped" if rest == b"" else rest)',
        'try:',
        '    socket.socket(socket.AF_UNIX).bind(b"\\0kiln-runner"); print("bound")',
        'except OSError as e: print("in use")',
      ].join('\n'),
    );
    expect(attack.stdout, JSON.stringify(attack)).toBe('dropped\nin use\n');
    // The host's runner still answers, and only the host can attach to it again.
    await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key });
    const after = await exec(t, team.key, session, 'print(secret_state)');
    expect(after.stdout, JSON.stringify(after)).toBe('7\n');
  });

  it('a server that stops pauses its live sandboxes (runc ones go); its next life resumes them with their variables', async () => {
    const instance = `${INSTANCE}-stop`;
    const env = { KILN_INSTANCE_ID: instance, KILN_SANDBOX_PAUSE_AT_SHUTDOWN: 'on' };
    const first = await createTestApp({ replicaOf: t, ...replicaSettings, env });
    const g = await sessionIn(first, team, gvisor);
    const r = await exec(first, team.key, g.session, 'notebook = {"rows": 3}');
    const c = await sessionIn(first, team, { sandbox: { runtime: 'runc' } });
    const rc = await exec(first, team.key, c.session, 'lost = 1');
    await first.close();
    expect(await rowOf(r.sandbox_id)).toMatchObject({ state: 'paused' });
    expect(await containerOf(r.sandbox_id)).toEqual({ running: false });
    expect(await rowOf(rc.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'shutdown' });
    expect(await containerOf(rc.sandbox_id)).toBeNull();

    const next = await createTestApp({ replicaOf: t, ...replicaSettings, env });
    try {
      const resumed = await exec(next, team.key, g.session, 'print(notebook["rows"])');
      expect(resumed).toMatchObject({ stdout: '3\n', restarted: false, sandbox_id: r.sandbox_id });
      expect((resumed as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
      const fresh = await exec(next, team.key, c.session, 'print("lost" in dir())');
      expect(fresh).toMatchObject({ stdout: 'False\n', restarted: true, restart_reason: 'shutdown' });
    } finally {
      // This one is gone for good: nothing of it is left paused.
      await next.engine.release(g.session, 'test_done');
      await next.close();
    }
    expect(await docker.listContainers({ all: true, filters: { label: [`kiln.owner=${instance}`] } })).toEqual([]);
  });

  it('two reaper passes at once (the timer’s and a caller’s): the second ends only once the first’s pause is done', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'n = 1');
    advance(IDLE_S * 1000 + 1000);
    const first = t.engine.reap();
    await t.engine.reap();
    expect((await rowOf(r.sandbox_id)).state).toBe('paused');
    await first;
    await t.engine.release(session, 'test_done');
  });

  it('a paused sandbox outlives its server: the next server of the instance resumes it', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'survivor = "still here"');
    // What the reaper saw, should the idle pause not happen (it did not, about once in 25 runs beside
    // other files, while the timer's reaper pass could overlap the test's: see the case above).
    const seen = (l?: { lastUsed: number; idleMs: number; busy: boolean; client: { alive: boolean } }) =>
      l && { lastUsed: l.lastUsed, idleMs: l.idleMs, busy: l.busy, alive: l.client.alive };
    const live = (t.engine as unknown as { live: { get(s: string): Parameters<typeof seen>[0] } }).live;
    const before = seen(live.get(session));
    await idle();
    const row = await rowOf(r.sandbox_id);
    expect(
      row.state,
      JSON.stringify([
        now,
        before,
        seen(live.get(session)),
        t.logs.filter((l) => JSON.stringify(l).includes(r.sandbox_id) || JSON.stringify(l).includes(session)),
      ]),
    ).toBe('paused');
    const next = await createTestApp({
      replicaOf: t,
      sandbox: { poolSize: 0, maxLifetimeMs: LIFETIME_MS, perTeamMax: 20, now: () => now },
      env: { KILN_INSTANCE_ID: INSTANCE },
    });
    try {
      // Its start-up reap removed every container of the instance that was not paused.
      expect(await containerOf(r.sandbox_id)).toEqual({ running: false });
      const resumed = await exec(next, team.key, session, 'print(survivor)');
      expect(resumed.stdout).toBe('still here\n');
      expect(resumed.sandbox_id).toBe(r.sandbox_id);
      await next.engine.release(session, 'test_done');
    } finally {
      await next.close();
    }
  });

  it('a replica that dies with a sandbox paused on the engine it shares with another: that one takes it over with its variables, and the first, back, leaves it alone', async () => {
    // Two replicas on one Docker Engine and no host mounts (as on two machines that share one
    // engine over TCP): what one paused, the other reaches.
    const env = (id: string) => ({
      KILN_INSTANCE_ID: id,
      KILN_SANDBOX_WORKSPACE_MOUNT: 'off',
      KILN_SANDBOX_PAUSED_TTL_S: '3600',
    });
    const dying = `${INSTANCE}-dies`;
    const a = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(dying) });
    const { session } = await sessionIn(a, team, gvisor);
    const r = await exec(a, team.key, session, 'kept = [1, 2, 3]');
    expect((await a.call('POST', `/v1/sessions/${session}/pause`, { key: team.key })).status).toBe(200);
    await a.close();
    expect(await rowOf(r.sandbox_id)).toMatchObject({ state: 'paused', instance: dying });

    const b = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(`${INSTANCE}-takes`) });
    let back: TestApp | undefined;
    try {
      const resumed = await exec(b, team.key, session, 'print(sum(kept))');
      expect(resumed).toMatchObject({ stdout: '6\n', restarted: false, sandbox_id: r.sandbox_id });
      expect(await rowOf(r.sandbox_id)).toMatchObject({ state: 'ready', instance: `${INSTANCE}-takes` });
      // The first replica back under its instance id: its start-up reap leaves the container alone.
      back = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(dying) });
      await back.engine.reap();
      expect(await containerOf(r.sandbox_id)).toEqual({ running: true });
      expect((await exec(b, team.key, session, 'print(len(kept))')).stdout).toBe('3\n');
      await b.engine.release(session, 'test_done');
    } finally {
      await back?.close();
      await b.close();
    }
    expect(await containerOf(r.sandbox_id)).toBeNull();
  });

  it('a replica that dies while a gVisor sandbox of its runs on the engine it shares with another: that one takes it over running, with its variables, and the first one’s reaper leaves it alone', async () => {
    const env = (id: string) => ({ KILN_INSTANCE_ID: id, KILN_SANDBOX_WORKSPACE_MOUNT: 'off' });
    const gone = `${INSTANCE}-gone`;
    const heir = `${INSTANCE}-heir`;
    const a = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(gone) });
    const b = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(heir) });
    let id = '';
    try {
      const { session } = await sessionIn(a, team, gvisor);
      const r = await exec(a, team.key, session, 'kept = [1, 2, 3]');
      id = r.sandbox_id;
      expect(await rowOf(id)).toMatchObject({ state: 'ready', instance: gone, runner: expect.any(Object) });
      // B has read who is up (it says where it is reached), and A is not among them: as for a
      // replica that died, whose heartbeat stopped. A's process, here, still holds the runner's connection.
      await b.replicas.open('http://127.0.0.1:9');
      expect(b.replicas.gone(gone)).toBe(true);
      const taken = await exec(b, team.key, session, 'print(sum(kept))');
      expect(taken).toMatchObject({ stdout: '6\n', restarted: false, sandbox_id: id });
      expect((taken as { resumed_ms?: number }).resumed_ms).toBeGreaterThan(0);
      expect(await rowOf(id)).toMatchObject({ state: 'ready', instance: heir });
      const scrape = await b.app.request('/metrics', { headers: { authorization: `Bearer ${b.adminKey}` } });
      expect(await scrape.text()).toContain('kiln_sandbox_takeovers_total{outcome="taken"} 1\n');
      // The runner dropped A's connection for B's; A's reaper then lets the sandbox go untouched.
      await untilLetGo(a, session);
      await a.engine.reap();
      expect(await containerOf(id)).toEqual({ running: true });
      expect(await rowOf(id)).toMatchObject({ state: 'ready', instance: heir });
      expect((await exec(b, team.key, session, 'print(len(kept))')).stdout).toBe('3\n');
      // Taken over again, mid-cell: the cell runs on, what it prints and returns was for the
      // replica that is gone only, and the next heir goes on with what the cell left.
      const slow = exec(
        b,
        team.key,
        session,
        'import time\nopen("/tmp/started", "w").write("1")\ntime.sleep(2)\nz = 7',
      );
      const read = () => b.call('GET', `/v1/sessions/${session}/files?path=/tmp/started`, { key: team.key });
      for (const end = Date.now() + 30_000; (await read()).status !== 200; await new Promise((r) => setTimeout(r, 50)))
        if (Date.now() > end) throw new Error('the cell never started');
      const heir2 = `${INSTANCE}-heir2`;
      const c2 = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(heir2) });
      try {
        await b.replicas.close();
        await c2.replicas.open('http://127.0.0.1:9');
        // Its first execution waits for the cell the gone replica started, then sees what it left.
        const after = await exec(c2, team.key, session, "print(globals().get('z'))");
        expect(after).toMatchObject({ stdout: '7\n', restarted: false, sandbox_id: id });
        expect((await exec(c2, team.key, session, 'print(sum(kept))')).stdout).toBe('6\n');
        await slow.catch(() => undefined);
        await c2.engine.release(session, 'test_done');
      } finally {
        await c2.replicas.close();
        await c2.close();
      }
      expect(await rowOf(id)).toMatchObject({ state: 'removed', runner: null });
    } finally {
      await b.replicas.close();
      await b.close();
      await a.close();
    }
    expect(await containerOf(id)).toBeNull();
  });

  it('a replica that dies holding a gVisor sandbox with a workspace mount of this host: the heir takes both over, pauses and resumes it there; the first one’s reaper keeps the mount, the heir’s release removes it', async () => {
    const env = (id: string) => ({ KILN_INSTANCE_ID: id, KILN_SANDBOX_PAUSED_TTL_S: '3600' });
    const gone = `${INSTANCE}-mgone`;
    const heir = `${INSTANCE}-mheir`;
    const a = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(gone) });
    const b = await createTestApp({ replicaOf: t, ...replicaSettings, env: env(heir) });
    let id = '';
    let mount = '';
    try {
      const { session } = await sessionIn(a, team, gvisor);
      const r = await exec(a, team.key, session, 'kept = 5\nopen("/tmp/note.txt", "w").write("hi")');
      id = r.sandbox_id;
      mount = ((await rowOf(id)).runner as { mount?: string }).mount ?? '';
      expect(mount.endsWith(`/${id}`)).toBe(true);
      expect(mountedHere(mount)).toBe(true);
      await b.replicas.open('http://127.0.0.1:9');
      const taken = await exec(b, team.key, session, 'print(kept, open("/tmp/note.txt").read())');
      expect(taken).toMatchObject({ stdout: '5 hi\n', restarted: false, sandbox_id: id });
      await untilLetGo(a, session);
      await a.engine.reap();
      expect(mountedHere(mount)).toBe(true);
      // The heir pauses it and resumes it, the mount (in A's directory) its /workspace throughout.
      expect((await b.call('POST', `/v1/sessions/${session}/pause`, { key: team.key })).status).toBe(200);
      expect(await rowOf(id)).toMatchObject({ state: 'paused', instance: heir });
      await a.engine.reap();
      expect(mountedHere(mount)).toBe(true);
      const resumed = await exec(b, team.key, session, 'print(kept + 1)');
      expect(resumed).toMatchObject({ stdout: '6\n', restarted: false, sandbox_id: id });
      await b.engine.release(session, 'test_done');
      expect(mountedHere(mount)).toBe(false);
    } finally {
      await b.replicas.close();
      await b.close();
      await a.close();
    }
    expect(await containerOf(id)).toBeNull();
  });

  it('a runner from before daemon mode (a template on an older base image) is started as it always was, never relayed as the keeper uid', async () => {
    // The runner of an older image: it takes no flags, so --daemon and --attach mean nothing to it.
    const tag = `kiln-test-old-runner:${INSTANCE}`;
    const dockerfile = [
      `FROM ${process.env.KILN_SANDBOX_IMAGE ?? 'kiln-sandbox:latest'}`,
      'USER root',
      'RUN mv /opt/kiln/kiln_runner.py /opt/kiln/kiln_runner_now.py && printf \'import runpy, sys\\nsys.argv = sys.argv[:1]\\nrunpy.run_path("/opt/kiln/kiln_runner_now.py", run_name="__main__")\\n\' > /opt/kiln/kiln_runner.py',
      'USER 65534:65534',
    ].join('\n');
    // Awaited: the app in this process keeps its timers (idle, pause) while the image builds.
    await new Promise<void>((resolve, reject) => {
      const build = execFile('docker', ['build', '-q', '-t', tag, '-'], (err) => (err ? reject(err) : resolve()));
      build.stdin!.end(dockerfile);
    });
    const backend = new DockerBackend(docker);
    const limits = { memoryMb: 256, cpus: 1, pids: 128, diskMb: 64, timeoutS: 30 };
    const c = await backend.create({
      image: tag,
      sandboxId: `sbx_oldrunner${Date.now()}`,
      // Not the app's instance: its reaper (on a timer) would take a container of its own that it does not hold.
      instance: `${INSTANCE}-old`,
      teamId: '',
      sessionId: '',
      expiresAt: new Date(Date.now() + 600_000),
      limits,
      runtime: 'gvisor',
      pausable: true,
    });
    try {
      expect(c.pausable).toBe(true);
      await backend.start(c);
      const client = await RunnerClient.start(await backend.attachRunner(c), 30_000, true);
      // Not pausable after all, and the code runs as the sandbox's own uid.
      expect(c.pausable).toBe(false);
      const r = await client.exec('import os\nprint(os.getuid())', { timeoutMs: 10_000, maxOutputBytes: 1000 });
      expect(r.stdout).toBe(`${c.uid}\n`);
      client.close();
    } finally {
      await backend.remove(c.id);
      execFileSync('docker', ['rmi', '-f', tag], { stdio: 'ignore' });
    }
  });

  it('ending the session or deleting the workspace removes its paused sandbox and its checkpoint', async () => {
    const { session } = await sessionIn(t, team, gvisor);
    const r = await exec(t, team.key, session, 'q = 1');
    await idle();
    expect(await containerOf(r.sandbox_id)).toEqual({ running: false });
    expect((await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    expect(await containerOf(r.sandbox_id)).toBeNull();
    expect(await rowOf(r.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'session_ended' });

    const other = await sessionIn(t, team, gvisor);
    const o = await exec(t, team.key, other.session, 'secret_copy = "x"');
    await idle();
    expect(await containerOf(o.sandbox_id)).toEqual({ running: false });
    expect((await t.call('DELETE', `/v1/workspaces/${other.ws}`, { key: team.key })).status).toBe(200);
    expect(await containerOf(o.sandbox_id)).toBeNull();
    expect(await rowOf(o.sandbox_id)).toMatchObject({ state: 'removed', removedReason: 'workspace_deleted' });
  });
});

describe('an agent run in a session whose sandbox is paused', () => {
  const app = useAgentApp('wake', {
    sandbox: { poolSize: 0, maxLifetimeMs: LIFETIME_MS, perTeamMax: 20 },
    env: { KILN_INSTANCE_ID: `${INSTANCE}-wake` },
  });

  it('resumes it while the model thinks: the run’s code finds it running, with its variables, and says it was resumed', async () => {
    const { t, team, fake } = app;
    const stateOf = async (id: string) =>
      (await t.database.db.select().from(sandboxes).where(eq(sandboxes.id, id)))[0]!.state;
    const { session } = await sessionIn(t, team, {
      sandbox: { runtime: 'gvisor' },
      protocol: 'tools',
      approval: { mode: 'auto' },
    });
    try {
      const first = await exec(t, team.key, session, 'kept = 41');
      expect((await t.call('POST', `/v1/sessions/${session}/pause`, { key: team.key })).status).toBe(200);
      expect(await stateOf(first.sandbox_id)).toBe('paused');
      // The model answers once the sandbox runs again (or gives up waiting after 30 s): before the
      // run's first execution could have asked for it.
      const resumedFirst = (async () => {
        for (const end = Date.now() + 30_000; Date.now() < end; await new Promise((r) => setTimeout(r, 50)))
          if ((await stateOf(first.sandbox_id)) === 'ready') return true;
        return false;
      })();
      fake.script(
        { until: resumedFirst, tool_calls: [{ name: 'python', arguments: { code: 'print(kept + 1)' } }] },
        { tool_calls: [{ name: 'finish', arguments: { summary: 'done' } }] },
      );
      const { run, events } = await converse(t, team.key, session, 'go on');
      expect(await resumedFirst).toBe(true);
      expect(run).toMatchObject({ status: 'completed', error: null });
      const done = events.find((e) => e.event === 'exec.completed')!.data as Record<string, unknown>;
      expect(done).toMatchObject({ exit_code: 0, restarted: false, resumed_ms: expect.any(Number) });
      // The output may come in more than one event (`42`, then the newline, on a loaded machine).
      const stdout = events
        .filter((e) => e.event === 'exec.output')
        .map((e) => e.data as { stream: string; data: string })
        .filter((d) => d.stream === 'stdout')
        .map((d) => d.data)
        .join('');
      expect(stdout).toBe('42\n');
    } finally {
      // Its sandbox goes with it (a server that stops would pause it and leave it for its next life).
      expect((await t.call('DELETE', `/v1/sessions/${session}`, { key: team.key })).status).toBe(200);
    }
  });
});
