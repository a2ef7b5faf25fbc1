import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { promisify } from 'node:util';
import { randomInt } from 'node:crypto';
import {
  appendFileSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { KeyPair } from '../../apps/api/src/sandbox/node/pki.ts';
import { issue } from '../../apps/api/src/sandbox/node/pki.ts';

/**
 * Sandbox hosts on this machine, for the fleet tests: each a network namespace joined to the
 * test's own namespace by a veth pair, with a `dockerd` of its own (data-root, exec-root,
 * pidfile, socket and bridge), the sandbox images in it (its data-root copied from `imageStore()`), and a Kiln node process in it
 * listening on the namespace's address. dockerd is started with `nsenter --net=` (under
 * `ip netns exec` it cannot see the cgroup mounts). `stop()` tears one down as a crash would;
 * `close()` removes everything it made.
 */
export interface Host {
  name: string;
  /** The address of the host in its namespace; the node listens on it. */
  ip: string;
  /** https://ip:7443 */
  url: string;
  dockerSock: string;
  /** Kills the node and its dockerd at once (SIGKILL): the host dies. */
  kill(): Promise<void>;
  /** Takes the host's link down (true) or up again (false): a partition, with everything on it still running. */
  cut(down: boolean): void;
}

const MAIN = fileURLToPath(new URL('../../apps/api/src/node-main.ts', import.meta.url));
const run = (cmd: string, args: string[]) => execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
const runAsync = promisify(execFile);
const quiet = (cmd: string, args: string[]) => {
  try {
    run(cmd, args);
  } catch {
    // already gone
  }
};

/** Waits until the engine on `sock` answers; fails at once when its process has exited. */
const engineUp = (what: string, sock: string, proc: ChildProcess) =>
  until(what, () => {
    if (proc.exitCode !== null) throw new Error(`${what} exited with ${proc.exitCode}`);
    try {
      run('docker', ['-H', `unix://${sock}`, 'version']);
      return true;
    } catch {
      return undefined;
    }
  });

async function until<T>(what: string, fn: () => T | undefined | Promise<T | undefined>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export class Hosts {
  private readonly procs: ChildProcess[] = [];
  /**
   * What start(), database() and imageStore() made; `pidfile` (its first line a pid) names the daemon
   * close() stops with `signal` (the image store has no namespace or veth of its own to remove).
   */
  private readonly made: { ns?: string; veth?: string; dir: string; pidfile: string; signal: 'TERM' | 'INT' }[] = [];
  /** Containers of killed hosts' engines, whose processes outlive their dockerd. */
  private readonly orphans: string[] = [];
  /** A /16 of its own for this run's hosts: 10.<n>.<host>.0/24. */
  private readonly net = 200 + randomInt(50);
  /** The directory of `imageStore()`, made once for every host. */
  private store?: Promise<string>;

  constructor(
    private readonly tag: string,
    private readonly ca: KeyPair,
    /** The sandbox image tags to load into each host's engine. */
    private readonly images: string[],
  ) {}

  /**
   * A network namespace joined to the test's by a veth pair (10.<net>.<index>.1 on this side,
   * .2 inside), and a directory of its own; what a crashed earlier run left under these names first goes.
   */
  private link(name: string, index: number, daemon: { pidfile: string; signal: 'TERM' | 'INT' }) {
    const ns = `kiln-${name}`;
    const veth = `kv${name}`.slice(0, 12);
    const hostIp = `10.${this.net}.${index}.1`;
    const ip = `10.${this.net}.${index}.2`;
    const dir = `/tmp/kiln-host-${name}`;
    quiet('sh', ['-c', `ip netns pids ${ns} 2>/dev/null | xargs -r kill -KILL`]);
    quiet('sh', ['-c', `grep -o ' ${dir}[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l`]);
    quiet('ip', ['netns', 'del', ns]);
    quiet('ip', ['link', 'del', veth]);
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    this.made.push({ ns, veth, dir, ...daemon });
    run('ip', ['netns', 'add', ns]);
    run('ip', ['link', 'add', veth, 'type', 'veth', 'peer', 'name', `${veth}n`]);
    run('ip', ['link', 'set', `${veth}n`, 'netns', ns]);
    run('ip', ['addr', 'add', `${hostIp}/24`, 'dev', veth]);
    run('ip', ['link', 'set', veth, 'up']);
    const inNs = (...args: string[]) => run('ip', ['netns', 'exec', ns, ...args]);
    inNs('ip', 'addr', 'add', `${ip}/24`, 'dev', `${veth}n`);
    inNs('ip', 'link', 'set', `${veth}n`, 'up');
    inNs('ip', 'link', 'set', 'lo', 'up');
    inNs('ip', 'route', 'add', 'default', 'via', hostIp);
    // The namespace's side of the link: the host keeps its route to the address, so packets to it
    // are dropped rather than sent out of the machine's default route.
    const cut = (down: boolean) => inNs('ip', 'link', 'set', `${veth}n`, down ? 'down' : 'up');
    return { ns, ip, dir, cut };
  }

  /**
   * A database host: a PostgreSQL server of its own (the machine's binaries, `initdb` into the
   * host's directory, run as the `postgres` user, trust auth for this run's /16) listening on the
   * namespace's address, so that the replicas reach their database over a veth as they would
   * across a network. Its admin URL is what `createTestApp({ pgAdminUrl })` takes.
   */
  async database(name: string): Promise<{ ip: string; adminUrl: string; cut(down: boolean): void }> {
    const host = `${this.tag}${name}`;
    const data = join(`/tmp/kiln-host-${host}`, 'pg');
    // SIGINT: Postgres's fast shutdown (its clients are told, its shared memory goes).
    const { ns, ip, cut } = this.link(host, 0, { pidfile: join(data, 'postmaster.pid'), signal: 'INT' });
    const bin = join(
      '/usr/lib/postgresql',
      readdirSync('/usr/lib/postgresql').sort((x, y) => Number(y) - Number(x))[0]!,
      'bin',
    );
    mkdirSync(data, { mode: 0o700 });
    run('chown', ['postgres:postgres', data]);
    const asPostgres = ['runuser', '-u', 'postgres', '--'];
    run(asPostgres[0]!, [
      ...asPostgres.slice(1),
      join(bin, 'initdb'),
      '-D',
      data,
      '-U',
      'postgres',
      '-A',
      'trust',
      '--no-sync',
      '-E',
      'UTF8',
      '--locale=C',
    ]);
    appendFileSync(join(data, 'pg_hba.conf'), `host all all 10.${this.net}.0.0/16 trust\n`);
    const server = spawn(
      'nsenter',
      [
        `--net=/run/netns/${ns}`,
        ...asPostgres,
        join(bin, 'postgres'),
        '-D',
        data,
        '-c',
        `listen_addresses=${ip}`,
        '-c',
        'port=5432',
        '-c',
        `unix_socket_directories=${data}`,
        '-c',
        'fsync=off',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    this.procs.push(server);
    let log = '';
    server.stderr!.on('data', (d) => (log += d));
    await until(`postgres on ${ip} (${log})`, () => {
      if (server.exitCode !== null) throw new Error(`postgres on ${ns} exited: ${log}`);
      try {
        run(join(bin, 'pg_isready'), ['-q', '-h', ip, '-p', '5432']);
        return true;
      } catch {
        return undefined;
      }
    });
    return { ip, adminUrl: `postgres://postgres@${ip}:5432/postgres`, cut };
  }

  /**
   * A stopped engine's data-root holding the sandbox images, loaded once for all hosts: each host's
   * engine starts on a copy of it (~0.3 s) instead of loading a gigabyte of image itself (~22 s a
   * host on this machine). The copy's layer files are hard links: overlay2 never writes a committed
   * layer's files (a container writes to an upper directory of its own, and an image removed on one
   * host unlinks only its own names); every other file, containerd's database among them (written
   * in place), is a copy of its own. The engine that loads it has mount and network namespaces of
   * its own and no bridge, so it touches nothing of the machine's.
   */
  private imageStore(): Promise<string> {
    this.store ??= (async () => {
      const dir = `/tmp/kiln-host-${this.tag}-images`;
      const pidfile = join(dir, 'docker.pid');
      const sock = join(dir, 'docker.sock');
      // What a crashed earlier run left: its engine (only while that pid is still a dockerd of this
      // directory: a pid from an old pidfile may be anyone's by now), then its directory.
      const stale = existsSync(pidfile) ? readFileSync(pidfile, 'utf8').trim() : '';
      let cmdline = '';
      try {
        if (/^\d+$/.test(stale)) cmdline = readFileSync(`/proc/${stale}/cmdline`, 'utf8');
      } catch {
        // gone
      }
      if (cmdline.startsWith('dockerd') && cmdline.includes(dir)) quiet('kill', ['-KILL', stale]);
      rmSync(dir, { recursive: true, force: true });
      mkdirSync(join(dir, 'exec'), { recursive: true });
      writeFileSync(join(dir, 'daemon.json'), '{}');
      this.made.push({ dir, pidfile, signal: 'TERM' });
      const dockerd = spawn(
        'unshare',
        [
          ...['-m', '-n', '--propagation', 'private', 'dockerd', '--config-file', join(dir, 'daemon.json')],
          ...['--data-root', join(dir, 'data'), '--exec-root', join(dir, 'exec'), '--pidfile', pidfile],
          ...['-H', `unix://${sock}`, '--bridge', 'none', '--iptables=false', '--ip-masq=false'],
        ],
        { stdio: 'ignore' },
      );
      this.procs.push(dockerd);
      await engineUp("the image store's dockerd", sock, dockerd);
      await runAsync('sh', ['-c', `docker save ${this.images.join(' ')} | docker -H unix://${sock} load -q`]);
      dockerd.kill('SIGTERM');
      await until(
        "the image store's dockerd to stop",
        () => (dockerd.exitCode !== null || dockerd.signalCode ? true : undefined),
        30_000,
      );
      return join(dir, 'data');
    })();
    return this.store;
  }

  /**
   * A host: its namespace and veth, its dockerd, the sandbox image loaded, a node. `ownBase`: an
   * image of the machine's engine loaded instead and tagged as each sandbox image (a host that built
   * its sandbox image itself: the same content under an id of its own).
   */
  async start(index: number, opts: { ownBase?: string } = {}): Promise<Host> {
    const name = `${this.tag}${index}`;
    const dir = `/tmp/kiln-host-${name}`;
    const pidfile = join(dir, 'docker.pid');
    const { ns, ip, cut } = this.link(name, index, { pidfile, signal: 'TERM' });
    const dockerSock = join(dir, 'docker.sock');
    mkdirSync(join(dir, 'exec'));
    // A data-root of its own that starts with the sandbox images: layers linked, the rest copied.
    const data = join(dir, 'data');
    const store = await this.imageStore();
    await runAsync('cp', ['-a', '--link', store, data]);
    await runAsync('sh', [
      '-c',
      'find "$0" -path "$0/overlay2/*/diff" -prune -o -type f -links +1 -exec sh -c \'for f; do cp -p "$f" "$f.copy" && mv -f "$f.copy" "$f"; done\' sh {} +',
      data,
    ]);
    // The machine's runtimes (runc, the gVisor ones), a data-root and bridge of its own.
    copyFileSync('/etc/docker/daemon.json', join(dir, 'daemon.json'));
    const dockerd = spawn(
      'nsenter',
      [
        `--net=/run/netns/${ns}`,
        'dockerd',
        '--config-file',
        join(dir, 'daemon.json'),
        '--data-root',
        data,
        '--exec-root',
        join(dir, 'exec'),
        '--pidfile',
        pidfile,
        '-H',
        `unix://${dockerSock}`,
        '--bip',
        `172.29.${index}.1/24`,
      ],
      { stdio: ['ignore', 'ignore', 'ignore'], detached: true },
    );
    this.procs.push(dockerd);
    await engineUp(`dockerd of ${name}`, dockerSock, dockerd);
    // Awaited, not synchronous: a host added mid-suite loads an image (its layers mostly there
    // already) while the replicas in this process must go on hearing the other hosts every 500 ms.
    if (opts.ownBase) {
      const docker = (...args: string[]) =>
        run('docker', ['-H', `unix://${dockerSock}`, ...args])
          .toString()
          .trim();
      const stored = [...new Set(this.images.map((tag) => docker('image', 'inspect', '-f', '{{.Id}}', tag)))];
      await runAsync('sh', ['-c', `docker save "$0" | docker -H unix://${dockerSock} load -q`, opts.ownBase]);
      for (const tag of this.images) docker('tag', opts.ownBase, tag);
      // The store's images, their tags now the own base's: gone, their layers kept by it.
      for (const id of stored) docker('rmi', id);
    }
    const creds = await issue(this.ca, { role: 'node', name, hosts: [ip] });
    writeFileSync(join(dir, 'node.pem'), creds.cert);
    writeFileSync(join(dir, 'node.key'), creds.key, { mode: 0o600 });
    writeFileSync(join(dir, 'ca.pem'), creds.ca);
    const node = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '--import', 'tsx', MAIN], {
      env: {
        PATH: process.env.PATH,
        DOCKER_HOST: `unix://${dockerSock}`,
        // Its workspace mounts and copies of workspace trees: under the host's directory, which close()
        // unmounts and removes (not in dockerd's data root, whose directories Docker refuses to bind-mount).
        KILN_DATA_DIR: join(dir, 'node'),
        KILN_NODE_NAME: name,
        KILN_NODE_CERT: join(dir, 'node.pem'),
        KILN_NODE_KEY: join(dir, 'node.key'),
        KILN_NODE_CA: join(dir, 'ca.pem'),
        KILN_NODE_HOST: ip,
        KILN_NODE_PORT: '7443',
        KILN_LOG_LEVEL: 'warn',
        // No egress proxy on these hosts: their sandboxes have network none.
        KILN_EGRESS: 'off',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.procs.push(node);
    let out = '';
    node.stdout!.on('data', (d) => (out += d));
    node.stderr!.on('data', (d) => (out += d));
    node.on('exit', (code, signal) => {
      if (process.env.KILN_TEST_DEBUG) console.log(`node ${name} exited ${code ?? signal}: ${out.slice(-3000)}`);
    });
    await until(`node ${name} (${out})`, () =>
      out.includes('listening on') ? true : node.exitCode !== null ? true : undefined,
    );
    if (node.exitCode !== null) throw new Error(`node ${name} exited: ${out}`);
    const kill = async () => {
      // What a crash leaves running: cleared by close() through the containers' cgroups.
      for (const id of run('docker', ['-H', `unix://${dockerSock}`, 'ps', '-aq', '--no-trunc'])
        .toString()
        .split('\n')
        .filter(Boolean))
        this.orphans.push(id);
      node.kill('SIGKILL');
      const pid = existsSync(pidfile) ? Number(readFileSync(pidfile, 'utf8')) : dockerd.pid;
      if (pid) quiet('kill', ['-KILL', String(pid)]);
      await until(`node ${name} to die`, () => (node.exitCode !== null || node.signalCode ? true : undefined), 10_000);
    };
    return { name, ip, url: `https://${ip}:7443`, dockerSock, kill, cut };
  }

  /** Stops every node and dockerd, then removes the namespaces, veths and directories. */
  async close(): Promise<void> {
    for (const p of this.procs) if (p.exitCode === null && !p.signalCode && p !== undefined) p.kill('SIGTERM');
    for (const m of this.made) {
      const pid = existsSync(m.pidfile) ? Number(readFileSync(m.pidfile, 'utf8').split('\n')[0]) : undefined;
      if (pid) {
        quiet('kill', [`-${m.signal}`, String(pid)]);
        await until(
          `the daemon of ${m.ns ?? m.dir} to stop`,
          () => {
            try {
              process.kill(pid, 0);
              return undefined;
            } catch {
              return true;
            }
          },
          30_000,
        ).catch(() => quiet('kill', ['-KILL', String(pid)]));
      }
      // A killed dockerd's containerd and shims (in the namespace), then its containers' processes.
      if (m.ns) quiet('sh', ['-c', `ip netns pids ${m.ns} | xargs -r kill -KILL`]);
      // A container's group is docker/<id>, or (the node's fair share on) kiln/team-…/<id>.
      const groupsOf = (id: string) =>
        run('sh', ['-c', `find /sys/fs/cgroup/ -mindepth 2 -maxdepth 4 -type d -name ${id} 2>/dev/null; true`])
          .toString()
          .split('\n')
          .filter(Boolean);
      for (const id of this.orphans) {
        const groups = groupsOf(id);
        const procs = groups.map((g) => join(g, 'cgroup.procs')).filter((f) => f.includes('/pids/'));
        for (const f of procs) quiet('sh', ['-c', `cat ${f} 2>/dev/null | xargs -r kill -KILL`]);
        await until(`the processes of container ${id} to end`, () =>
          procs.every((f) => !existsSync(f) || !readFileSync(f, 'utf8').trim()) ? true : undefined,
        );
        // Their (now empty) groups, in every hierarchy.
        for (const g of groups) quiet('rmdir', [g]);
      }
      // Whatever a killed dockerd left mounted under its directories.
      quiet('sh', ['-c', `grep -o ' ${m.dir}[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l`]);
      if (m.ns) quiet('ip', ['netns', 'del', m.ns]);
      if (m.veth) quiet('ip', ['link', 'del', m.veth]);
      rmSync(m.dir, { recursive: true, force: true });
    }
  }
}
