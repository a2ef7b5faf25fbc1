import { execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import { like, sql } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxes } from '../../apps/api/src/db/schema/index.ts';
import { FleetBackend } from '../../apps/api/src/sandbox/node/fleet.ts';
import { issue, type KeyPair, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { RemoteBackend } from '../../apps/api/src/sandbox/node/remote.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import type { Db } from '../../apps/api/src/db/client.ts';
import { rowsOf } from '../../apps/api/src/db/rows.ts';
import { createTestApp, type TestApp } from '../support/app.ts';
import { type Host, Hosts } from '../support/hosts.ts';
import { writeAtOnceThrough } from '../support/replicas.ts';

/** A child process the test awaits: the replicas in this process keep hearing their nodes meanwhile. */
const run = promisify(execFile);

/**
 * A fleet on hosts of its own: two sandbox hosts, each a network namespace with its own dockerd
 * and a Kiln node process in it, and a database host (a PostgreSQL server in a namespace of its
 * own), all reached over veths from two API replicas (in the test's own namespace). Made and
 * removed by the test itself.
 */
describe('a fleet on two hosts, each with its own dockerd and node', () => {
  let hosts: Hosts;
  let h: Host[] = [];
  let ca: KeyPair;
  let a: TestApp;
  let b: TestApp;
  let team: { id: string; key: string };
  let ws: string;
  let database: { ip: string; adminUrl: string };
  const fleets: FleetBackend[] = [];
  /** The sandbox image's tags, loaded into every host. */
  let bases: string[] = [];

  beforeAll(async () => {
    const image = await ensureSandboxImage();
    bases = [image, 'kiln-sandbox:latest'];
    ca = await makeAuthority('hosts-test');
    hosts = new Hosts('kf', ca, bases);
    [database, ...h] = await Promise.all([hosts.database('db'), hosts.start(1), hosts.start(2)]);
    const ra = await issue(ca, { role: 'api', name: 'replica-a' });
    const rb = await issue(ca, { role: 'api', name: 'replica-b' });
    // Each replica hears from every node every 500 ms, as a server does every 5 s (server.ts opens the fleet).
    const fleet = (credentials: typeof ra) => (db: Db) => {
      const f = new FleetBackend({
        db,
        credentials,
        heartbeatMs: 500,
        silentMs: 3000,
        lostMs: 3000,
        // Longer than a replica takes to drop a silent host (lostMs, then the ping in flight, up to
        // 5 s): the sandbox a replica held there is ended by that replica first, as a host lost.
        lostGraceMs: 10_000,
      });
      fleets.push(f);
      return f;
    };
    a = await createTestApp({ backend: fleet(ra), pgAdminUrl: database.adminUrl });
    b = await createTestApp({ replicaOf: a, backend: fleet(rb) });
    expect(a.database.url).toContain(`@${database.ip}:5432/`);
    for (const f of fleets) await f.open();
    for (const host of h)
      expect(
        (await a.call('POST', '/v1/system/nodes', { key: a.adminKey, body: { name: host.name, url: host.url } }))
          .status,
      ).toBe(201);
    team = await a.team('hosts');
    ws = (await a.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'spread' } })).body.id;
  }, 300_000);
  afterAll(async () => {
    for (const f of fleets) f.close();
    await b?.close();
    await a?.close();
    await hosts?.close();
  }, 120_000);

  /** A template image's build jobs and what each replica logged of its builds and hosts (for a failure's message). */
  const buildsOf = async (hash: string) => {
    const jobs = rowsOf(
      await a.database.db.execute(
        sql`select id, status, attempts, run_at, locked_by, last_error, payload->'retry' as retry, payload->'catchUp' as catch_up
            from jobs where kind = 'template.build' and payload->>'hash' = ${hash} order by id`,
      ),
    );
    const said = (app: TestApp) =>
      app.logs
        .filter((l) => (l.level as number) >= 40 || /template|image|node/i.test(String(l.msg)))
        .map((l) => JSON.stringify({ ...l, pid: undefined, hostname: undefined }).slice(0, 600));
    return [`jobs: ${JSON.stringify(jobs)}`, 'a:', ...said(a).slice(-40), 'b:', ...said(b).slice(-40)].join('\n');
  };
  const hostOf = async (session: string) => {
    const rows = await a.database.db.select().from(sandboxes).where(like(sandboxes.sessionId, session));
    return rows.find((r) => r.state !== 'removed')?.containerId.split('/')[0];
  };
  const exec = (app: TestApp, session: string, code: string) =>
    app.call('POST', `/v1/sessions/${session}/exec`, { key: team.key, body: { code } });
  const session = async (app: TestApp) =>
    (await app.call('POST', `/v1/workspaces/${ws}/sessions`, { key: team.key })).body.id as string;
  const placed: string[] = [];
  /** The template the template case built on the first two hosts, and a workspace that uses it. */
  let built: { image: string; workspace: string } | undefined;

  it('both replicas see both hosts heard; a team’s sessions spread over them, from either replica', async () => {
    const seen = (await b.call('GET', '/v1/system/nodes', { key: b.adminKey })).body.data;
    expect(seen.map((n: { name: string; health: string }) => [n.name, n.health])).toEqual([
      ['kf1', 'heard'],
      ['kf2', 'heard'],
    ]);
    placed.push(await session(a), await session(b));
    expect((await exec(a, placed[0]!, 'x = 1; print(6 * 7)')).body.stdout).toBe('42\n');
    expect((await exec(b, placed[1]!, 'x = 2; print(6 * 7)')).body.stdout).toBe('42\n');
    expect((await Promise.all(placed.map(hostOf))).sort()).toEqual(['kf1', 'kf2']);
  });

  it('the replicas reach their database host over its veth: 40 writes through each at once all land in HEAD; a key revoked on one is refused by the other as soon as its notification crosses', async () => {
    const shared = (await b.call('POST', '/v1/workspaces', { key: team.key, body: { name: 'shared' } })).body.id;
    await writeAtOnceThrough([a, b], team.key, shared, 80);

    const made = await a.call('POST', `/v1/teams/${team.id}/keys`, {
      key: team.key,
      body: { name: 'short-lived', role: 'member' },
    });
    expect((await b.call('GET', '/v1/workspaces', { key: made.body.key })).status).toBe(200);
    const news = new Promise<void>((resolve) => b.news.on('key', (id) => id === made.body.id && resolve()));
    expect((await a.call('DELETE', `/v1/teams/${team.id}/keys/${made.body.id}`, { key: team.key })).status).toBe(200);
    await news;
    expect((await b.call('GET', '/v1/workspaces', { key: made.body.key })).status).toBe(401);
  });

  it('a template made through the API is built on every host; its sessions run on either host with its files', async () => {
    const created = await a.call('POST', '/v1/templates', {
      key: team.key,
      body: { name: 'fleet-files', files: [{ path: 'greeting.txt', content: 'built on every host' }] },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    // The build is a job: whichever replica runs it builds on every host that takes sandboxes.
    await b.evolution.jobs.drain();
    const ready = (await a.call('GET', `/v1/templates/${created.body.id}`, { key: team.key })).body;
    expect(ready, JSON.stringify(ready)).toMatchObject({ status: 'ready', error: null });
    for (const host of h)
      expect(
        execFileSync('docker', ['-H', `unix://${host.dockerSock}`, 'image', 'ls', '-q', ready.image], {
          encoding: 'utf8',
        }).trim(),
        host.name,
      ).not.toBe('');
    const templated = await a.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'templated', settings: { sandbox: { template: created.body.id } } },
    });
    expect(templated.status, JSON.stringify(templated.body)).toBe(201);
    built = { image: ready.image, workspace: templated.body.id };
    const sessions: string[] = [];
    for (const app of [a, b])
      sessions.push(
        (await app.call('POST', `/v1/workspaces/${templated.body.id}/sessions`, { key: team.key })).body.id as string,
      );
    for (const [i, s] of sessions.entries()) {
      const r = await exec(i ? b : a, s, "print(open('/opt/kiln/template/greeting.txt').read())");
      expect(r.body.stdout, JSON.stringify(r.body)).toBe('built on every host\n');
    }
    expect((await Promise.all(sessions.map(hostOf))).sort()).toEqual(['kf1', 'kf2']);
    for (const s of sessions) await a.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
  });

  it('a gVisor sandbox on a host (its dockerd with an exec root of its own) pauses to that host’s disk and resumes there, again and again', async () => {
    const gv = await a.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'sleepy', settings: { sandbox: { runtime: 'gvisor' } } },
    });
    expect(gv.status, JSON.stringify(gv.body)).toBe(201);
    const s = (await b.call('POST', `/v1/workspaces/${gv.body.id}/sessions`, { key: team.key })).body.id as string;
    const first = await exec(b, s, 'n = 1');
    expect(first.status).toBe(200);
    const where = (await hostOf(s))!;
    const host = h.find((x) => x.name === where)!;
    const [row] = (await a.database.db.select().from(sandboxes).where(like(sandboxes.sessionId, s))).filter(
      (r) => r.state !== 'removed',
    );
    const inner = row!.containerId.split('/')[1]!;
    const running = () =>
      execFileSync('docker', ['-H', `unix://${host.dockerSock}`, 'inspect', '-f', '{{.State.Running}}', inner], {
        encoding: 'utf8',
      }).trim();
    // The replica that holds it (these in-process replicas do not send requests on to each other).
    for (const [i, app] of [b, b, b].entries()) {
      const paused = await app.call('POST', `/v1/sessions/${s}/pause`, { key: team.key });
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      expect(running()).toBe('false');
      const r = await exec(app, s, 'n += 1\nprint(n)');
      expect(r.body, JSON.stringify(r.body)).toMatchObject({ stdout: `${i + 2}\n`, restarted: false });
      expect(r.body.resumed_ms).toBeGreaterThan(0);
      expect(running()).toBe('true');
      expect(await hostOf(s)).toBe(where);
    }
    await a.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
  });

  it('a replica that dies: its gVisor sandbox running on a host is taken over by the other replica through that host’s node, with its variables', async () => {
    const gv = await a.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'heirloom', settings: { sandbox: { runtime: 'gvisor' } } },
    });
    const s = (await a.call('POST', `/v1/workspaces/${gv.body.id}/sessions`, { key: team.key })).body.id as string;
    const first = await exec(a, s, 'kept = {"a": 1}');
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    const where = await hostOf(s);
    // B reads who is up and A is not among them, as when A's heartbeat stopped with its process.
    await b.replicas.open('http://127.0.0.1:9');
    try {
      const taken = await exec(b, s, 'kept["b"] = 2\nprint(sorted(kept))');
      expect(taken.body, JSON.stringify(taken.body)).toMatchObject({
        stdout: "['a', 'b']\n",
        restarted: false,
        sandbox_id: first.body.sandbox_id,
      });
      expect(await hostOf(s)).toBe(where);
    } finally {
      await b.replicas.close();
    }
    await b.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
  });

  it('a sandbox on a host reaches no node’s control port, nor the API’s host, nor the database host', async () => {
    const probe = [
      ...h.map((x) => `("${x.ip}", 7443)`),
      `("${h[0]!.ip.replace(/\.2$/, '.1')}", 5432)`,
      `("${database.ip}", 5432)`,
    ].join(', ');
    const r = await exec(
      a,
      placed[0]!,
      `import socket\nfor addr in [${probe}]:\n    try:\n        socket.create_connection(addr, timeout=2).close(); print("reached", addr)\n    except OSError as e:\n        print("refused", type(e).__name__)`,
    );
    expect(r.body.stdout).not.toContain('reached');
    expect(r.body.stdout.trim().split('\n')).toHaveLength(4);
  });

  it('a replica with another CA’s certificate is refused at a node’s real address', async () => {
    const other = await makeAuthority('hosts-test');
    const forged = await issue(other, { role: 'api', name: 'replica-a' });
    const bad = new RemoteBackend({ url: h[0]!.url, name: 'kf1', credentials: { ...forged, ca: ca.cert } });
    await expect(bad.ping()).rejects.toThrow();
    bad.close();
    const good = new RemoteBackend({
      url: h[0]!.url,
      name: 'kf1',
      credentials: await issue(ca, { role: 'api', name: 'probe' }),
    });
    await expect(good.ping()).resolves.toBeUndefined();
    good.close();
  });

  it('a host cut off mid-session: its execution ends SandboxLost once the replica gives up on it, the next runs on the other host; back on the network, what it held is reaped', async () => {
    const victim = placed[1]!;
    const name = (await hostOf(victim))!;
    const host = h.find((x) => x.name === name)!;
    host.cut(true);
    try {
      // Nothing answers from there: the replica drops the node's connection after lostMs, and the runner with it.
      const inFlight = await exec(b, victim, 'print(1)');
      expect(inFlight.status).toBe(200);
      expect(inFlight.body.error).toMatchObject({ type: 'SandboxLost' });
      const next = await exec(b, victim, 'print(globals().get("x"), 6 * 7)');
      // Its old sandbox ended because its host stopped answering, and the answer says so.
      expect(next.body).toMatchObject({ restarted: true, restart_reason: 'node_lost', stdout: 'None 42\n' });
      expect(await hostOf(victim)).not.toBe(name);
    } finally {
      host.cut(false);
    }
    // Heard again, its stale sandbox (this session's old one) is removed by the replica that placed it.
    const left = () =>
      execFileSync(
        'docker',
        ['-H', `unix://${host.dockerSock}`, 'ps', '-aq', '--filter', `label=kiln.session=${victim}`],
        {
          encoding: 'utf8',
        },
      ).trim();
    expect(left()).not.toBe('');
    await waitFor(
      async () =>
        (
          (await b.call('GET', '/v1/system/nodes', { key: b.adminKey })).body.data as {
            name: string;
            last_error: string | null;
          }[]
        ).find((n) => n.name === name)?.last_error === null,
    );
    await b.engine.reap();
    expect(left()).toBe('');
  });

  it('a host killed with its dockerd mid-session: the session’s next exec runs on the other host, restarted; nothing answers 500', async () => {
    const victim = placed[0]!;
    const dead = (await hostOf(victim))!;
    await h.find((x) => x.name === dead)!.kill();
    const r = await exec(a, victim, 'print(globals().get("x"), 6 * 7)');
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ restarted: true, stdout: 'None 42\n' });
    const now = await hostOf(victim);
    expect(now).toBeDefined();
    expect(now).not.toBe(dead);
    // The other session's sandbox there, which nobody touched since: once no replica has heard from
    // the host for the grace period, it is marked lost for the whole installation.
    const other = placed[1]!;
    const stale = async () =>
      (await a.database.db.select().from(sandboxes).where(like(sandboxes.sessionId, other))).find((r) =>
        r.containerId.startsWith(`${dead}/`),
      );
    // (The cut-off test moved it to this host.)
    expect(await stale()).toBeDefined();
    await waitFor(async () => (await stale())?.state === 'removed');
    expect((await stale())!.removedReason).toBe('node_lost');
    const moved = await exec(b, other, 'print(6 * 7)');
    expect(moved.body).toMatchObject({ restarted: true, stdout: '42\n' });
    expect(await hostOf(other)).not.toBe(dead);
  });

  it('a host added after a template was built, its base image built there (another id): the template is built on it, it says so, and its sessions run there', async () => {
    const tpl = built!;
    // As on a machine that built its own sandbox image: the same content under an id of its own
    // (the first hosts' id not there at all).
    const ownBase = `kiln-test-own-base:${process.pid}`;
    await run('sh', [
      '-c',
      `printf 'FROM %s\\nLABEL kiln.test.own-base=1\\n' "$0" | docker build -q -t "$1" -`,
      bases[0]!,
      ownBase,
    ]);
    let third: Host;
    try {
      third = await hosts.start(3, { ownBase });
    } finally {
      execFileSync('docker', ['rmi', ownBase]);
    }
    h.push(third);
    const onThird = (...args: string[]) =>
      execFileSync('docker', ['-H', `unix://${third.dockerSock}`, ...args], { encoding: 'utf8' }).trim();
    const before = execFileSync('docker', ['image', 'inspect', '-f', '{{.Id}}', bases[0]!], {
      encoding: 'utf8',
    }).trim();
    for (const tag of bases) expect(onThird('image', 'inspect', '-f', '{{.Id}}', tag)).not.toBe(before);
    expect(() => onThird('image', 'inspect', before)).toThrow();
    expect(onThird('image', 'ls', '-q', tpl.image)).toBe('');

    const added = await a.call('POST', '/v1/system/nodes', {
      key: a.adminKey,
      body: { name: third.name, url: third.url },
    });
    expect(added.status, JSON.stringify(added.body)).toBe(201);
    // Heard by a replica, it lacks the image the others have: a build of it there is queued.
    const queued = async () =>
      rowsOf(
        await a.database.db.execute(
          sql`select 1 from jobs where kind = 'template.build' and payload->>'catchUp' = 'true' and payload->>'hash' = ${tpl.image.split(':')[1]!}`,
        ),
      ).length > 0;
    await waitFor(queued);
    // Run by a replica that has heard the host too (each queues it when it first hears the host; one
    // that has not yet heard it finds the image wherever it knows of).
    await waitFor(async () => {
      await Promise.all([a.evolution.jobs.drain(), b.evolution.jobs.drain()]);
      return onThird('image', 'ls', '-q', tpl.image) !== '';
    });
    const nodeImages = async () =>
      (
        (await b.call('GET', '/v1/system/nodes', { key: b.adminKey })).body.data as { name: string; images: string[] }[]
      ).find((n) => n.name === third.name)?.images ?? [];
    await waitFor(async () => (await nodeImages()).includes(tpl.image));
    // The template stayed ready throughout, its image unchanged.
    const templates = (await a.call('GET', '/v1/templates', { key: team.key })).body.data as {
      image: string;
      status: string;
    }[];
    expect(templates.find((t) => t.image === tpl.image)?.status).toBe('ready');

    // New sessions of the templated workspace go to the new host first (the team has none there).
    const made: string[] = [];
    for (let i = 0; i < 3 && !(await Promise.all(made.map(hostOf))).includes(third.name); i++) {
      const s = (await a.call('POST', `/v1/workspaces/${tpl.workspace}/sessions`, { key: team.key })).body.id as string;
      made.push(s);
      const r = await exec(a, s, "print(open('/opt/kiln/template/greeting.txt').read())");
      expect(r.body.stdout, JSON.stringify(r.body)).toBe('built on every host\n');
    }
    expect(await Promise.all(made.map(hostOf))).toContain(third.name);
    for (const s of made) await a.call('DELETE', `/v1/sessions/${s}`, { key: team.key });
  }, 180_000);

  it('a template whose build fails on one host is ready on the others, its sessions go there, and that host is tried again later and gets it', async () => {
    // The hosts alive now (one was killed above), and the base the template's hash will name: the
    // id the first of them has for the sandbox image (each builds on its own image of that name).
    const on = (host: Host, ...args: string[]) =>
      execFileSync('docker', ['-H', `unix://${host.dockerSock}`, ...args], { encoding: 'utf8', stdio: 'pipe' }).trim();
    const alive = h.filter((host) => {
      try {
        return on(host, 'version', '-f', '{{.Server.Version}}') !== '';
      } catch {
        return false;
      }
    });
    expect(alive).toHaveLength(2);
    const base = await fleets[0]!.images.idOf('kiln-sandbox:latest');
    // The host whose id that is, given a sandbox image that breaks every template build there (no
    // `find`, which the build's last steps run); its sandboxes are not affected. So the template's
    // hash names the broken image's id, which stays on that host once its name is mended (the
    // failed builds' cached layers keep it): the retries must build on what the name says now.
    const victim = alive.find((host) => on(host, 'image', 'inspect', '-f', '{{.Id}}', 'kiln-sandbox:latest') === base)!;
    expect(victim).toBeDefined();
    const onVictim = (...args: string[]) => on(victim, ...args);
    const good = onVictim('image', 'inspect', '-f', '{{.Id}}', bases[0]!);
    const broken = `kiln-test-no-find:${process.pid}`;
    await run('sh', [
      '-c',
      `printf 'FROM %s\\nUSER 0:0\\nRUN ["rm", "/usr/bin/find"]\\nUSER 65534:65534\\n' "$0" | docker -H "unix://$1" build -q -t "$2" -`,
      good,
      victim.dockerSock,
      broken,
    ]);
    for (const tag of bases) onVictim('tag', broken, tag);
    const brokenId = onVictim('image', 'inspect', '-f', '{{.Id}}', broken);
    // The retries queued for this template’s image, by number, not yet run, and in how many seconds each is due.
    const retries = async (hash: string, n: number) =>
      rowsOf<{ id: string; run_in_s: number }>(
        await a.database.db.execute(
          sql`select id, extract(epoch from run_at - now())::float as run_in_s from jobs where kind = 'template.build'
              and status = 'queued' and payload->>'hash' = ${hash} and payload->>'retry' = ${String(n)}`,
        ),
      );
    // Made due and run. Due by the job runner's clock, which claims with the time of day to the
    // millisecond: a run_at of the database's now() (to the microsecond) is still in the future to a
    // claim in that same millisecond, which then takes nothing (seen once: the retry still queued
    // after both replicas' drains).
    const bringForward = async (id: string) => {
      await a.database.db.execute(sql`update jobs set run_at = now() - interval '1 second' where id = ${id}`);
      await Promise.all([a.evolution.jobs.drain(), b.evolution.jobs.drain()]);
    };
    let created: { status: number; body: { id: string } };
    let tpl: { image: string; status: string };
    let second: { id: string; run_in_s: number } | undefined;
    try {
      created = await a.call('POST', '/v1/templates', {
        key: team.key,
        body: { name: 'fleet-partial', files: [{ path: 'greeting.txt', content: 'built where it could be' }] },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      await a.evolution.jobs.drain();
      tpl = (await a.call('GET', `/v1/templates/${created.body.id}`, { key: team.key })).body;
      expect(tpl, JSON.stringify(tpl)).toMatchObject({ status: 'ready', error: null });
      const { log } = (await a.call('GET', `/v1/templates/${created.body.id}/log`, { key: team.key })).body;
      expect(log).toMatch(new RegExp(`\\[${victim.name}\\] failed: .*find`));
      expect(log).toContain(
        `[kiln] not built on ${victim.name}: its sandboxes go to the hosts that have it; tried there again in 1 min`,
      );
      expect(onVictim('image', 'ls', '-q', tpl.image)).toBe('');
      // The other host has it; this one is tried again in a minute, by a job of its own.
      const hash = tpl.image.split(':')[1]!;
      const [first] = await retries(hash, 1);
      expect(first!.run_in_s).toBeGreaterThan(30);
      // Still broken when that retry comes: it fails there again and queues the next, 4 minutes on.
      await bringForward(first!.id);
      expect(await retries(hash, 1)).toEqual([]);
      [second] = await retries(hash, 2);
      expect(second!.run_in_s).toBeGreaterThan(180);
      expect(onVictim('image', 'ls', '-q', tpl.image)).toBe('');
    } finally {
      for (const tag of bases) onVictim('tag', good, tag);
      // (Kept if a warm sandbox was made of it meanwhile: it goes with the host.)
      try {
        onVictim('rmi', broken);
      } catch {}
    }
    expect(onVictim('image', 'inspect', '-f', '{{.Id}}', brokenId)).toBe(brokenId);

    // Its sessions go to the hosts that have it, never to the victim.
    const templated = await a.call('POST', '/v1/workspaces', {
      key: team.key,
      body: { name: 'templated-partial', settings: { sandbox: { template: created.body.id } } },
    });
    expect(templated.status, JSON.stringify(templated.body)).toBe(201);
    const made: string[] = [];
    for (let i = 0; i < 2; i++) {
      const s = (await a.call('POST', `/v1/workspaces/${templated.body.id}/sessions`, { key: team.key })).body
        .id as string;
      made.push(s);
      const r = await exec(a, s, "print(open('/opt/kiln/template/greeting.txt').read())");
      expect(r.body.stdout, JSON.stringify(r.body)).toBe('built where it could be\n');
    }
    expect(await Promise.all(made.map(hostOf))).not.toContain(victim.name);
    for (const s of made) await a.call('DELETE', `/v1/sessions/${s}`, { key: team.key });

    // Its image mended, that host gets the template when the next retry comes (brought forward here).
    await bringForward(second!.id);
    await waitFor(
      async () => {
        await Promise.all([a.evolution.jobs.drain(), b.evolution.jobs.drain()]);
        return onVictim('image', 'ls', '-q', tpl.image) !== '';
      },
      undefined,
      async () => buildsOf(tpl.image.split(':')[1]!),
    );
    await waitFor(async () =>
      ((await b.call('GET', '/v1/system/nodes', { key: b.adminKey })).body.data as { name: string; images: string[] }[])
        .find((n) => n.name === victim.name)!
        .images.includes(tpl.image),
    );
    const hash = tpl.image.split(':')[1]!;
    expect([...(await retries(hash, 2)), ...(await retries(hash, 3))]).toEqual([]);
    expect((await a.call('GET', `/v1/templates/${created.body.id}`, { key: team.key })).body.status).toBe('ready');
  }, 180_000);
});

/**
 * Polls `fn` every 100 ms until it is true (the heartbeat runs every 500 ms here); on timing out,
 * the error says what `explain` finds (what the servers did meanwhile).
 */
async function waitFor(fn: () => Promise<boolean>, ms = 30_000, explain?: () => Promise<string>): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out${explain ? `\n${await explain()}` : ''}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
