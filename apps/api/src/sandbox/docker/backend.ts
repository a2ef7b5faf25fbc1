import { createHash, randomInt } from 'node:crypto';
import { execFile } from 'node:child_process';
import { access, lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { join, normalize } from 'node:path';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { ApiError } from '../../lib/errors.ts';
import type {
  ContainerRequest,
  EgressEvent,
  ListedContainer,
  RunnerChannel,
  SandboxBackend,
  BackendCapabilities,
  RuntimeOffer,
  SandboxContainer,
  Usage,
} from '../backend.ts';
import type { SandboxLimits } from '../limits.ts';
import {
  containerSpec,
  GVISOR_EGRESS_RUNTIME,
  GVISOR_NONET_RUNTIME,
  KEEPER_USER,
  SANDBOX_UID_COUNT,
  SANDBOX_UID_MIN,
  sameShape,
  sandboxUser,
  updateSpec,
} from './container-spec.ts';
import { DockerImages } from './images.ts';
import { EgressProxy, type EgressAttachment, type EgressOptions, NOWHERE_DNS, BRIDGE_MOUNT } from './egress.ts';
import { type FairShareOptions, TeamCgroups, teamGroup } from './cgroups.ts';
import { attachRunner, runToEnd } from './runner.ts';
import { RUNNER_CMD } from '../runner-client.ts';
import { StatsSampler } from './stats.ts';

const LABEL = 'kiln.managed';
/** The label that records a container's sandbox uid: the record every replica on this Docker host checks. */
const UID_LABEL = 'kiln.uid';
const UID_ATTEMPTS = 8;
const NODE_LABEL = 'kiln.node';
/** The one checkpoint a paused sandbox's container has (Docker keeps it beside the container, root-only). */
const CHECKPOINT = 'kiln';
/**
 * containerd (1.6, as Docker 20.10 runs it) restores a checkpoint from a copy it unpacks into a
 * new `ctrd-checkpoint<n>` directory of its temporary directory (its XDG_RUNTIME_DIR, else
 * TMPDIR, else /tmp), root-only, and never removes it (containerd#10166): each resume would leave
 * the sandbox's memory, secret values included, on the host's disk. The backend removes the copy
 * of each restore it makes, and (at start-up and at each restore) what older ones left.
 */
const RESTORE_COPY_MAX_AGE_MS = 10 * 60_000;
/** A Docker container id as the engine gives it (only such names make paths here). */
const CONTAINER_ID = /^[0-9a-f]{64}$/;
/**
 * Where the gVisor runtime keeps each container's state under dockerd's default exec root (one
 * started with another `--exec-root` is found from a running sandbox's shim: `runscRootOf`).
 * Debian's runsc (release 20221219) leaves the state of a container it checkpointed after a
 * restore behind, marked paused, and its own `delete` refuses it ("invalid state transition:
 * paused => stopped"): the next start from a checkpoint is then refused as "id already in use",
 * and the file stays after the container is removed. The backend removes that state itself once
 * the container has exited (an engine on this host only).
 */
const RUNSC_STATE_DIR = '/run/docker/runtime-runc/moby';

/** What a runner started with `--daemon` prints once it listens (kiln_runner.py). */
const DAEMON_READY = 'KILN_RUNNER_DAEMON';

/** What of `docker info` the checkpoint probe is keyed on. */
interface EngineInfo {
  ID?: string;
  ServerVersion?: string;
  KernelVersion?: string;
  DockerRootDir?: string;
}

/** dockerode's checkpoint calls (the experimental API), which its type definitions lack. */
interface Checkpoints {
  createCheckpoint(opts: { CheckpointID: string; Exit: boolean }): Promise<unknown>;
  deleteCheckpoint(name: string): Promise<unknown>;
  /** The checkpoint goes in the query; the body must stay empty (the engine refuses a start with one). */
  start(opts: { _query: { checkpoint: string }; _body: Record<string, never> }): Promise<unknown>;
}

/** The egress proxy's options from the server's configuration; undefined when KILN_EGRESS=off. */
export function egressOf(
  config: { egress: EgressOptions & { enabled: boolean } },
  log?: Logger,
): (EgressOptions & { log?: Logger }) | undefined {
  const { enabled, image, subnets, upstreamNetwork, bridgeDir } = config.egress;
  return enabled ? { image, subnets, upstreamNetwork, bridgeDir, log } : undefined;
}

/** What a Docker backend is given besides its engine; each part is optional. */
export interface DockerBackendOptions {
  /** Unset: no egress proxy (a request for an allowlist sandbox is refused). */
  egress?: EgressOptions & { log?: Logger };
  /** Unset: sandboxes are in Docker's default cgroup parent, each with only its own limits. */
  fairShare?: FairShareOptions & { auto?: boolean; log?: Logger };
  /**
   * A sandbox node's name: its containers carry it (`kiln.node`) and it lists only those, so
   * two nodes on one engine (or a node beside an API that uses the engine itself) keep apart.
   */
  node?: string;
  /**
   * An image with `sleep` (the sandbox image): with it, an engine of this host that serves the
   * checkpoint API is also tried for real once (a gVisor container checkpointed and restored),
   * and the outcome kept beside the engine's data (`kiln-checkpoint-probe-<hash of the image
   * name>.json`, one per image, so that a node and a server of other images on one engine do not
   * undo each other's) until the engine, runsc, the kernel or the image name change. Without it,
   * the API's answer decides.
   */
  probeImage?: string;
}

/** Sandboxes as containers of one Docker Engine, recorded in `kiln.*` labels. */
export class DockerBackend implements SandboxBackend {
  /** Uids of containers this backend is creating, before Docker lists them. */
  private readonly uidsInFlight = new Set<number>();
  private readonly sampler: StatsSampler;
  /** The egress proxy of each API instance, made when its first allowlist sandbox is. */
  private readonly proxies = new Map<string, EgressProxy>();
  /** Allowlist sandboxes' containers: their proxy and sandbox id. */
  private readonly egressOf = new Map<string, { proxy: EgressProxy; sandboxId: string }>();
  /**
   * With fair share in force on this host: each team's sandboxes in a cgroup of its own
   * (cgroups.ts). Decided once, at the first question (`auto`: only where the host allows it).
   */
  private cgroups?: Promise<TeamCgroups | undefined>;
  /** The team of each container made in a team cgroup, whose group it leaves when removed. */
  private readonly teamOf = new Map<string, string>();
  /** Where this engine's runsc keeps container state (findRunscRoot), and whether it was found or is the default. */
  private runscRoot = RUNSC_STATE_DIR;
  /** Where this engine's containerd unpacks a checkpoint to restore it (RESTORE_COPY_MAX_AGE_MS; found with the runsc root). */
  private restoreCopies = '/tmp';
  private runscRootFound = false;
  /** Whether this engine checkpoints gVisor containers (it serves the checkpoint API), why not, and where it keeps them. */
  private checkpoints?: Promise<{ on: boolean; off?: string; root: string | null; runsc: string | null }>;

  /** Template images are built on the same Docker Engine. */
  readonly images: DockerImages;

  private readonly egress?: EgressOptions & { log?: Logger };
  private readonly fairShare?: FairShareOptions & { auto?: boolean; log?: Logger };
  private readonly node?: string;
  private readonly probeImage?: string;

  constructor(
    private readonly docker: Docker,
    o: DockerBackendOptions = {},
  ) {
    ({ egress: this.egress, fairShare: this.fairShare, node: this.node, probeImage: this.probeImage } = o);
    this.images = new DockerImages(docker);
    this.sampler = new StatsSampler(docker);
  }

  private proxyFor(instance: string): EgressProxy {
    if (!this.egress) throw new ApiError('unavailable', 'this server has no egress proxy (KILN_EGRESS=off)');
    let proxy = this.proxies.get(instance);
    if (!proxy) {
      proxy = new EgressProxy(this.docker, instance, this.egress, this.egress.log);
      this.proxies.set(instance, proxy);
    }
    return proxy;
  }

  /**
   * Creates the container with a uid no other live sandbox on this Docker host has (other
   * replicas included). The uid is drawn at random from a range of 10^8 and recorded in a
   * label; after the create, Docker is asked who else carries it: on a clash the new
   * container steps back and draws again (two racing creates may both step back; neither
   * ever runs beside another holder).
   */
  async create(req: ContainerRequest): Promise<SandboxContainer> {
    if (req.network?.mode !== 'allowlist') return this.createWith(req);
    const proxy = this.proxyFor(req.instance);
    // gVisor sandboxes have no network: they reach the proxy through a bridge socket (egress.ts).
    const attachment =
      req.runtime === 'gvisor'
        ? await proxy.reserveBridge(req.sandboxId, req.network.allow)
        : await proxy.reserve(req.sandboxId, req.network.allow);
    // The proxy joins the new network while the container is created on it.
    const [joined, made] = await Promise.allSettled([proxy.join(attachment), this.createWith(req, attachment)]);
    if (joined.status === 'rejected' || made.status === 'rejected') {
      if (made.status === 'fulfilled') await this.remove(made.value.id).catch(() => undefined);
      await proxy.detach(req.sandboxId);
      throw joined.status === 'rejected' ? joined.reason : (made as PromiseRejectedResult).reason;
    }
    this.egressOf.set(made.value.id, { proxy, sandboxId: req.sandboxId });
    const { user, token, proxyIp } = attachment;
    return { ...made.value, proxyUrl: `http://${user}:${token}@${proxyIp}:3128` };
  }

  private async createWith(req: ContainerRequest, egress?: EgressAttachment): Promise<SandboxContainer> {
    // With fair share, warm containers are made for a team too (capabilities: teamBound); one
    // for no team (a contract test's) stays in Docker's default parent.
    const cgroups = await this.teamCgroups();
    const team = cgroups && req.teamId ? req.teamId : undefined;
    const cgroupParent = team ? await cgroups!.enter(team) : undefined;
    try {
      const made = await this.createIn(req, egress, cgroupParent, cgroups !== undefined);
      if (team) this.teamOf.set(made.id, team);
      return made;
    } catch (err) {
      if (team) await cgroups!.leave(team);
      throw err;
    }
  }

  /** The team cgroups when fair share is in force on this host, decided at the first question. */
  private teamCgroups(): Promise<TeamCgroups | undefined> {
    this.cgroups ??= this.decideFairShare();
    return this.cgroups;
  }

  /**
   * `on`: the team cgroups (a host that cannot make them fails each create, naming why).
   * `auto`: the same where this host allows it, else none, logged once with the reason: the
   * engine on a local socket with Docker's cgroupfs driver (a CgroupParent is then a path of
   * this host's cgroup file system), and this process able to make the parent group there.
   */
  private async decideFairShare(): Promise<TeamCgroups | undefined> {
    const o = this.fairShare;
    if (!o) return undefined;
    const cgroups = new TeamCgroups(o);
    if (!o.auto) return this.swept(cgroups);
    let blocker: string | undefined;
    if (!(this.docker.modem as { socketPath?: unknown }).socketPath) blocker = 'the Docker Engine is not on this host';
    else {
      const { CgroupDriver } = (await this.docker.info()) as { CgroupDriver?: string };
      if (CgroupDriver !== 'cgroupfs') blocker = `Docker's cgroup driver is ${CgroupDriver ?? 'unknown'}, not cgroupfs`;
      else
        blocker = await cgroups.check().then(
          () => undefined,
          (err: Error) => err.message,
        );
    }
    if (blocker) {
      o.log?.warn(
        { reason: blocker },
        "fair share is off on this host (KILN_SANDBOX_FAIR_SHARE=auto): each sandbox has only its own limits, and a team's many sandboxes together may take more of the host than another team's one",
      );
      return undefined;
    }
    o.log?.info({ parent: o.parent }, "fair share is on: each team's sandboxes share one cgroup of this host");
    return this.swept(cgroups);
  }

  /** The team cgroups, once the empty team groups a killed process left are removed (best effort). */
  private async swept(cgroups: TeamCgroups): Promise<TeamCgroups> {
    await cgroups.sweep().catch((err) => this.fairShare?.log?.warn({ err }, 'could not sweep empty team cgroups'));
    return cgroups;
  }

  private async createIn(
    req: ContainerRequest,
    egress: EgressAttachment | undefined,
    cgroupParent: string | undefined,
    fair: boolean,
  ): Promise<SandboxContainer> {
    const network = egress?.network ? { name: egress.network, ip: egress.sandboxIp, dns: NOWHERE_DNS } : undefined;
    const bridge = egress?.bridgeDir ? { dir: egress.bridgeDir, mount: BRIDGE_MOUNT } : undefined;
    // A sandbox with a network is never paused: its bridge holds connections no checkpoint can take along.
    const pausable = !!req.pausable && req.runtime === 'gvisor' && !egress && (await this.checkpointing()).on;
    for (let attempt = 0; attempt < UID_ATTEMPTS; attempt++) {
      const uid = SANDBOX_UID_MIN + randomInt(SANDBOX_UID_COUNT);
      if (this.uidsInFlight.has(uid)) continue;
      this.uidsInFlight.add(uid);
      try {
        const container = await this.docker.createContainer(
          containerSpec({
            image: req.image,
            name: `kiln-${req.sandboxId}`,
            limits: this.capped(req.limits, fair),
            uid,
            runtime: req.runtime,
            workspaceDir: req.workspaceDir,
            network,
            bridge,
            cgroupParent,
            labels: {
              [LABEL]: '1',
              ...(pausable ? { 'kiln.pausable': '1' } : {}),
              'kiln.sandbox': req.sandboxId,
              'kiln.owner': req.instance,
              'kiln.team': req.teamId,
              'kiln.session': req.sessionId,
              'kiln.expires': req.expiresAt.toISOString(),
              [UID_LABEL]: String(uid),
              'kiln.runtime': req.runtime,
              ...(this.node ? { [NODE_LABEL]: this.node } : {}),
            },
          }),
        );
        const holders = await this.docker.listContainers({
          all: true,
          filters: { label: [`${LABEL}=1`, `${UID_LABEL}=${uid}`] },
        });
        if (holders.length <= 1)
          return { id: container.id, uid, runtime: req.runtime, ...(pausable ? { pausable } : {}) };
        await container.remove({ force: true }).catch(() => undefined);
      } finally {
        this.uidsInFlight.delete(uid);
      }
    }
    throw new ApiError('sandbox_unavailable', 'could not find a free uid for a new sandbox; try again');
  }

  /**
   * With a cap on each team's CPUs: no sandbox is given more than its team may use together
   * (cgroup v1 refuses a container's quota above its parent's).
   */
  private capped(limits: SandboxLimits, fair: boolean): SandboxLimits {
    const cap = fair ? this.fairShare?.teamCpus : undefined;
    return cap && cap < limits.cpus ? { ...limits, cpus: cap } : limits;
  }

  async start(container: SandboxContainer): Promise<void> {
    await this.docker.getContainer(container.id).start();
    await this.settleTeam(container.id);
    // Its memory and CPU are known from now on, not from a listing's first (second-long) reading.
    this.sampler.watch(container.id);
  }

  async attachRunner(container: SandboxContainer): Promise<RunnerChannel> {
    const c = this.docker.getContainer(container.id);
    if (!container.pausable) return attachRunner(this.docker, c, sandboxUser(container.uid));
    // A pausable sandbox's runner leaves its exec (gVisor restores no exec'd process) and is
    // reached through a relay run as the keeper uid, which the sandbox's code cannot touch.
    const daemon = await runToEnd(this.docker, c, sandboxUser(container.uid), [...RUNNER_CMD, '--daemon']);
    // A runner from before daemon mode (a template built on an older base image) ignored the flag
    // and ended: it is never given a relay (that would run it, and the code, as the keeper uid),
    // but started as it always was, and its sandbox is one that cannot be paused.
    if (!daemon.tail.includes(DAEMON_READY)) {
      container.pausable = false;
      return attachRunner(this.docker, c, sandboxUser(container.uid));
    }
    if (daemon.code !== 0)
      throw new Error(`the sandbox runner did not start (exit ${daemon.code}): ${daemon.tail.trim()}`);
    return attachRunner(this.docker, c, KEEPER_USER, [...RUNNER_CMD, '--attach']);
  }

  /**
   * Whether this engine can checkpoint (decided once): it has gVisor, and it serves the checkpoint
   * API (asked, not read from its experimental flag: a dockerd whose configuration turned the flag
   * on by a reload reports it on, yet refuses checkpoint calls until it is restarted). `off` says
   * why not.
   */
  private checkpointing(): Promise<{ on: boolean; off?: string; root: string | null; runsc: string | null }> {
    this.checkpoints ??= this.docker
      .info()
      .then(async (info: { Runtimes?: Record<string, { path?: string }>; DockerRootDir?: string }) => {
        const local = !!(this.docker.modem as { socketPath?: unknown }).socketPath;
        const runsc = info.Runtimes?.[GVISOR_NONET_RUNTIME]?.path;
        let off = runsc ? await this.checkpointApiOff() : `the engine has no ${GVISOR_NONET_RUNTIME} runtime`;
        if (!off && local && runsc && info.DockerRootDir && this.probeImage)
          off = await this.probeCheckpoint(info as EngineInfo, runsc);
        // What restores before this process left on this host (a restore's own copy goes with it).
        if (local && runsc) await this.dropRestoreCopy();
        return {
          on: !off,
          ...(off ? { off } : {}),
          // Its checkpoints (their sizes, and writing them directly) only when the engine's directory is this host's.
          root: local ? (info.DockerRootDir ?? null) : null,
          runsc: local && runsc ? runsc : null,
        };
      });
    // An engine that did not answer is asked again next time (a transient error is not kept).
    this.checkpoints.catch(() => (this.checkpoints = undefined));
    return this.checkpoints;
  }

  /**
   * Checkpoints and restores a throw-away gVisor container of the probe image, as a pause and a
   * resume do (probeImage); undefined when that worked, else why not. Kept on disk when it worked,
   * so that it runs once per engine, runsc, kernel and image; a failure is tried again at the next
   * start.
   */
  private async probeCheckpoint(info: EngineInfo, runsc: string): Promise<string | undefined> {
    const name = createHash('sha256').update(this.probeImage!).digest('hex').slice(0, 16);
    const file = join(info.DockerRootDir!, `kiln-checkpoint-probe-${name}.json`);
    const bin = await stat(runsc).catch(() => undefined);
    const key = JSON.stringify([
      info.ID,
      info.ServerVersion,
      info.KernelVersion,
      runsc,
      bin?.size,
      bin?.mtimeMs,
      this.probeImage,
    ]);
    if ((await readFile(file, 'utf8').catch(() => '')) === key) return undefined;
    let id: string | undefined;
    try {
      const c = await this.docker.createContainer({
        name: `kiln-checkpoint-probe-${randomInt(1e9)}`,
        Image: this.probeImage,
        Cmd: ['sleep', '600'],
        User: '65534:65534',
        Labels: { 'kiln.probe': '1' },
        HostConfig: { Runtime: GVISOR_NONET_RUNTIME, NetworkMode: 'none', Memory: 128 * 2 ** 20 },
      });
      id = c.id;
      await c.start();
      await this.writeCheckpoint(id, info.DockerRootDir!, runsc);
      const image = await this.checkpointImage(info.DockerRootDir!, id);
      try {
        await (c as unknown as Checkpoints).start({ _query: { checkpoint: CHECKPOINT }, _body: {} });
      } finally {
        await this.dropRestoreCopy(image);
      }
      const { State } = (await c.inspect()) as { State: { Running?: boolean } };
      if (!State.Running) throw new Error('the restored container is not running');
      // Whole or not at all: another process reading it meanwhile probes once more, never reads half.
      const part = `${file}.${randomInt(1e9)}`;
      await writeFile(part, key, { mode: 0o600 });
      await rename(part, file);
      return undefined;
    } catch (err) {
      return `a probe sandbox could not be checkpointed and restored on this engine: ${(err as Error).message.slice(0, 500)}`;
    } finally {
      if (id) {
        await this.docker
          .getContainer(id)
          .remove({ force: true })
          .catch(() => undefined);
        await this.dropStaleRuntimeState(id);
      }
    }
  }

  /** Why the engine refuses checkpoint calls (asked of a container that does not exist), undefined when it serves them. */
  private async checkpointApiOff(): Promise<string | undefined> {
    const probe = this.docker.getContainer(`kiln-checkpoint-probe-${randomInt(1e9)}`) as unknown as {
      listCheckpoint(): Promise<unknown>;
    };
    try {
      await probe.listCheckpoint();
      return undefined;
    } catch (err) {
      const e = err as { statusCode?: number; message?: string };
      // No such container: the route is there.
      if (e.statusCode === 404) return undefined;
      return e.statusCode === 501
        ? "dockerd's checkpoint API is off (its experimental mode takes a restart, not a reload; infra/docker.sh does it)"
        : `dockerd's checkpoint API did not answer as expected (${e.statusCode ?? ''} ${e.message ?? ''})`.trim();
    }
  }

  /**
   * Docker 20.10 writes a checkpoint by copying runsc's image out of the task's work directory,
   * which it removes once the container has exited: a large image (hundreds of MB) is lost now
   * and then mid-copy ("failed to Lchown …/checkpoint.img"). On an engine of this host the backend
   * has runsc write the image straight into the container's checkpoint directory instead (runsc
   * stops the sandbox once it is written; Docker takes the exit in, and restores from that
   * directory as from one of its own); elsewhere, Docker's API.
   */
  async pause(container: SandboxContainer): Promise<{ bytes: number | null }> {
    this.sampler.forget(container.id);
    const { root, runsc } = await this.checkpointing();
    const dir = await this.writeCheckpoint(container.id, root, runsc);
    return { bytes: dir ? await dirBytes(dir) : null };
  }

  /**
   * Writes the running container's checkpoint and waits for it to have exited (see pause);
   * resolves with the checkpoint's directory when it is on this host.
   */
  private async writeCheckpoint(id: string, root: string | null, runsc: string | null): Promise<string | null> {
    const dir = root && join(root, 'containers', id, 'checkpoints', CHECKPOINT);
    if (root) await this.findRunscRoot(id);
    const stateFile = join(this.runscRoot, `${id}_sandbox:${id}.state`);
    if (dir && runsc && CONTAINER_ID.test(id) && (await exists(stateFile))) {
      // A checkpoint left by an earlier pause (one whose deletion at the resume failed) would make runsc refuse.
      await rm(dir, { recursive: true, force: true });
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await run(runsc, ['--root', this.runscRoot, 'checkpoint', '--image-path', dir, id]);
    } else {
      const c = this.docker.getContainer(id) as unknown as Checkpoints;
      await c.createCheckpoint({ CheckpointID: CHECKPOINT, Exit: true });
    }
    // The engine takes the container's exit in after the checkpoint is written: a start from the
    // checkpoint before then would be refused as "already running".
    await this.docker.getContainer(id).wait({ condition: 'not-running' });
    await this.dropStaleRuntimeState(id);
    return dir;
  }

  /**
   * Finds where this engine's runsc keeps container state (the `--root` containerd gives it, under
   * dockerd's exec root) from a running gVisor container's shim: a root process of the host,
   * outside the sandbox, whose arguments name the exec root's containerd socket. Kept for the
   * backend's life (one engine, one exec root); the default until one is found.
   */
  private async findRunscRoot(id: string): Promise<void> {
    if (this.runscRootFound) return;
    try {
      const { State } = (await this.docker.getContainer(id).inspect()) as { State: { Pid?: number } };
      if (!State.Pid) return;
      const stat = await readFile(`/proc/${State.Pid}/stat`, 'utf8');
      // The parent's pid is the second field after the command's name (in parentheses, which may hold anything).
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (!Number.isSafeInteger(ppid) || ppid <= 1) return;
      const args = (await readFile(`/proc/${ppid}/cmdline`, 'utf8')).split('\0');
      const arg = (flag: string) => (args.includes(flag) ? args[args.indexOf(flag) + 1] : undefined);
      const execRoot = /^(\/[^\0]+)\/containerd\/containerd\.sock$/.exec(arg('-address') ?? '')?.[1];
      if (!args[0]?.endsWith('/containerd-shim-runc-v2') || arg('-namespace') !== 'moby' || !execRoot) return;
      if (normalize(execRoot) !== execRoot) return;
      this.runscRoot = join(execRoot, 'runtime-runc', 'moby');
      this.runscRootFound = true;
      // The shim has containerd's environment, which says where it unpacks checkpoints.
      const env = new Map(
        (await readFile(`/proc/${ppid}/environ`, 'utf8'))
          .split('\0')
          .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)] as const),
      );
      const tmp = env.get('XDG_RUNTIME_DIR') || env.get('TMPDIR') || '/tmp';
      if (tmp.startsWith('/') && normalize(tmp) === tmp) this.restoreCopies = tmp.replace(/(.)\/$/, '$1');
    } catch {
      // Gone meanwhile, or not this host's: the default stays.
    }
  }

  /** Removes what runsc left of an exited (checkpointed) container's state on this host (see RUNSC_STATE_DIR). */
  private async dropStaleRuntimeState(id: string): Promise<void> {
    if (!(this.docker.modem as { socketPath?: unknown }).socketPath || !CONTAINER_ID.test(id)) return;
    for (const ext of ['state', 'lock']) await rm(join(this.runscRoot, `${id}_sandbox:${id}.${ext}`), { force: true });
  }

  /**
   * Its moved lifetime is kept beside the engine's data too (an engine of this host), where
   * `list` reads it: a process that reaps by itself (a node) keeps it after a restart. The
   * replicas keep it in the sandbox's row as well.
   */
  async resume(container: SandboxContainer, lifetimeEndsAt?: number): Promise<RunnerChannel> {
    const c = this.docker.getContainer(container.id);
    const cp = c as unknown as Checkpoints;
    await this.dropStaleRuntimeState(container.id);
    const { root } = await this.checkpointing().catch(() => ({ root: null }));
    const image = await this.checkpointImage(root, container.id);
    try {
      await cp.start({ _query: { checkpoint: CHECKPOINT }, _body: {} });
      await this.settleTeam(container.id, true);
    } finally {
      // Restored or not, the copy containerd made of it for the restore goes, and any an earlier
      // restore left (one cut short, or whose checkpoint was not known by its image).
      await this.dropRestoreCopy(image);
    }
    this.sampler.watch(container.id);
    // Not kept (the disk refused): a node's reaper still has it in memory until the node restarts.
    if (lifetimeEndsAt !== undefined) await this.keepLifetime(container.id, lifetimeEndsAt).catch(() => undefined);
    // Restored, its memory is the container's again: the copy on disk goes now (and a next pause makes a new one).
    await cp.deleteCheckpoint(CHECKPOINT).catch(() => undefined);
    return this.reattach(container);
  }

  /**
   * A started (or restored) container's team group gets its weights again (TeamCgroups.settle):
   * the runtime made the group anew if another process removed it meanwhile. Its team is known
   * from its creation, or (`restored`: after a restart, or made by another replica) from its
   * label, where its cgroup parent says it was made in that team's group. Never fails the start:
   * a group left with the kernel's defaults is logged.
   */
  private async settleTeam(id: string, restored = false): Promise<void> {
    const cgroups = await this.teamCgroups();
    if (!cgroups) return;
    let team = this.teamOf.get(id);
    if (!team && restored) {
      const info = await this.docker
        .getContainer(id)
        .inspect()
        .catch(() => undefined);
      const label = info?.Config.Labels?.['kiln.team'];
      if (label && info?.HostConfig.CgroupParent === `/${this.fairShare!.parent}/${teamGroup(label)}`) team = label;
    }
    if (team)
      await cgroups
        .settle(team)
        .catch((err) =>
          this.fairShare?.log?.warn({ err, container: id }, "a team's cgroup could not be given its weights again"),
        );
  }

  /** The size and modification time of a paused container's checkpoint image (an engine of this host), to know its copies by. */
  private async checkpointImage(root: string | null, id: string): Promise<{ size: number; mtime: number } | undefined> {
    if (!root || !CONTAINER_ID.test(id)) return undefined;
    const s = await lstat(join(root, 'containers', id, 'checkpoints', CHECKPOINT, 'checkpoint.img')).catch(
      () => undefined,
    );
    return s?.isFile() ? { size: s.size, mtime: Math.floor(s.mtimeMs / 1000) } : undefined;
  }

  /**
   * Removes the copy of a checkpoint that containerd unpacked to restore it (see
   * RESTORE_COPY_MAX_AGE_MS): the one whose image has the checkpoint image's size and (to the
   * second, as the tar between them keeps it) modification time, and in the same pass every copy
   * older than RESTORE_COPY_MAX_AGE_MS (what restores that were cut short, or ran before this
   * existed, left). An engine of this host only; it never throws.
   */
  private async dropRestoreCopy(image?: { size: number; mtime: number }): Promise<void> {
    if (!(this.docker.modem as { socketPath?: unknown }).socketPath) return;
    const dir = this.restoreCopies;
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      if (!/^ctrd-checkpoint\d+$/.test(name)) continue;
      const copy = join(dir, name);
      const d = await lstat(copy).catch(() => undefined);
      if (!d?.isDirectory() || d.uid !== 0) continue;
      const f = image && (await lstat(join(copy, 'checkpoint.img')).catch(() => undefined));
      const ours = f?.isFile() && f.size === image!.size && Math.floor(f.mtimeMs / 1000) === image!.mtime;
      if (!ours && Date.now() - d.mtimeMs <= RESTORE_COPY_MAX_AGE_MS) continue;
      // Never a resume's failure: one that could not go now goes by its age at a later one.
      await rm(copy, { recursive: true, force: true }).catch(() => undefined);
    }
  }

  /** A new relay (as the keeper uid) to the runner the container's daemon keeps. */
  reattach(container: SandboxContainer): Promise<RunnerChannel> {
    return attachRunner(this.docker, this.docker.getContainer(container.id), KEEPER_USER, [...RUNNER_CMD, '--attach']);
  }

  async update(container: SandboxContainer, limits: SandboxLimits): Promise<void> {
    const fair = (await this.teamCgroups()) !== undefined;
    await this.docker.getContainer(container.id).update(updateSpec(this.capped(limits, fair), container.runtime));
  }

  async remove(containerId: string): Promise<void> {
    this.sampler.forget(containerId);
    const container = this.docker.getContainer(containerId);
    await container.remove({ force: true }).catch(async (err: { statusCode?: number; message?: string }) => {
      if (err.statusCode === 404) return;
      // Another caller (the reaper, a session's close, another replica) is removing it: done once it is gone.
      if (err.statusCode === 409 && /already in progress/.test(err.message ?? '')) {
        await container.wait({ condition: 'removed' }).catch((e: { statusCode?: number }) => {
          if (e.statusCode !== 404) throw e;
        });
        return;
      }
      throw err;
    });
    const lifetimes = await this.lifetimesDir();
    if (lifetimes && CONTAINER_ID.test(containerId)) await rm(join(lifetimes, containerId), { force: true });
    const team = this.teamOf.get(containerId);
    this.teamOf.delete(containerId);
    if (team) await (await this.teamCgroups())!.leave(team);
    const egress = this.egressOf.get(containerId);
    this.egressOf.delete(containerId);
    if (egress) await egress.proxy.detach(egress.sandboxId);
  }

  async setAllow(container: SandboxContainer, allow: readonly string[]): Promise<void> {
    const egress = this.egressOf.get(container.id);
    if (egress) await egress.proxy.setAllow(egress.sandboxId, allow);
  }

  async takeEgress(container: SandboxContainer): Promise<EgressEvent[]> {
    const egress = this.egressOf.get(container.id);
    return egress ? egress.proxy.take(egress.sandboxId) : [];
  }

  /**
   * The networks of an instance's sandboxes whose container is gone (a crash's leftovers); with
   * `all` (the instance shuts down), its proxy and egress network too.
   */
  async sweepEgress(instance: string, opts: { all?: boolean } = {}): Promise<void> {
    if (!this.egress) return;
    await this.proxyFor(instance).sweep(opts);
    if (opts.all) this.proxies.delete(instance);
  }

  async list(): Promise<ListedContainer[]> {
    const containers = await this.docker.listContainers({
      all: true,
      filters: { label: [`${LABEL}=1`, ...(this.node ? [`${NODE_LABEL}=${this.node}`] : [])] },
    });
    // Without a node name, a node's containers on the same engine are that node's, not this backend's.
    const own = this.node ? containers : containers.filter((c) => !c.Labels[NODE_LABEL]);
    const moved = await this.movedLifetimes(new Set(containers.map((c) => c.Id)));
    return own.map((c) => {
      const expires = Date.parse(c.Labels['kiln.expires'] ?? '');
      return {
        id: c.Id,
        sandboxId: c.Labels['kiln.sandbox'] ?? '',
        instance: c.Labels['kiln.owner'] ?? '',
        expiresAt: moved.get(c.Id) ?? (Number.isNaN(expires) ? undefined : expires),
        ...(c.Labels['kiln.pausable'] === '1' && c.State !== 'running' ? { stopped: true } : {}),
      };
    });
  }

  /** `<DockerRootDir>/kiln-lifetimes`, where the lifetimes resumes moved on are kept; null for an engine of another host. */
  private async lifetimesDir(): Promise<string | null> {
    // Not known (the engine did not answer): nothing read or kept this time, the listing still made.
    const root = await this.checkpointing().then(
      (c) => c.root,
      () => null,
    );
    return root && join(root, 'kiln-lifetimes');
  }

  /** Keeps a resumed container's moved lifetime in a root-only file named by its id (written whole, by rename). */
  private async keepLifetime(containerId: string, endsAt: number): Promise<void> {
    const dir = await this.lifetimesDir();
    if (!dir || !CONTAINER_ID.test(containerId)) return;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const part = join(dir, `.${containerId}.${randomInt(1e9)}`);
    await writeFile(part, String(endsAt), { mode: 0o600 });
    await rename(part, join(dir, containerId));
  }

  /**
   * The moved lifetimes of the containers listed (`ids`: this engine's Kiln containers). A file
   * whose container the engine no longer has (removed by another process, or by hand) goes.
   */
  private async movedLifetimes(ids: Set<string>): Promise<Map<string, number>> {
    const moved = new Map<string, number>();
    const dir = await this.lifetimesDir();
    const names = dir ? await readdir(dir).catch(() => [] as string[]) : [];
    for (const name of names) {
      if (!CONTAINER_ID.test(name)) continue;
      const file = join(dir!, name);
      if (!ids.has(name)) {
        const gone = await this.docker
          .getContainer(name)
          .inspect()
          .then(
            () => false,
            (err: { statusCode?: number }) => err.statusCode === 404,
          );
        if (gone) await rm(file, { force: true });
        continue;
      }
      const endsAt = Number(await readFile(file, 'utf8').catch(() => ''));
      if (Number.isSafeInteger(endsAt) && endsAt > 0) moved.set(name, endsAt);
    }
    return moved;
  }

  stats(containerId: string): Promise<Usage | null> {
    return this.sampler.sample(containerId);
  }

  /**
   * runc always; gvisor when the engine reports the kiln-gvisor-nonet runtime (infra/docker.sh registers it);
   * its sandboxes reach the egress proxy through a host Unix socket when the engine also has
   * kiln-gvisor-egress and runs on this host (bridgeDir: the socket is a file here, mounted into the sandbox).
   */
  async capabilities(): Promise<BackendCapabilities> {
    const info = (await this.docker.info()) as { Runtimes?: Record<string, unknown> };
    const egress = !!this.egress;
    const runtimes: RuntimeOffer[] = [{ runtime: 'runc', egress }];
    if (info.Runtimes && GVISOR_NONET_RUNTIME in info.Runtimes)
      runtimes.push({
        runtime: 'gvisor',
        egress: egress && !!this.egress?.bridgeDir && GVISOR_EGRESS_RUNTIME in info.Runtimes,
        ...(await this.checkpointing().then((c) => ({ pause: c.on, ...(c.off ? { pauseOff: c.off } : {}) }))),
      });
    // A bind mount names a path of the engine's host: this one only when the engine is on a local socket.
    const hostWorkspaceMounts = !!(this.docker.modem as { socketPath?: unknown }).socketPath;
    const teamBound = (await this.teamCgroups()) !== undefined;
    return { runtimes, hostWorkspaceMounts, resizable: sameShape, teamBound };
  }

  /** The engine host's memory and CPUs, which placement weighs the limits of its sandboxes against. */
  async capacity(): Promise<{ memoryMb: number; cpus: number }> {
    const info = (await this.docker.info()) as { MemTotal?: number; NCPU?: number };
    return { memoryMb: Math.floor((info.MemTotal ?? 0) / 2 ** 20), cpus: info.NCPU ?? 0 };
  }

  async ping(timeoutMs = 2000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      await Promise.race([this.docker.ping(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Docker no longer has the container (404) or it is not running (409). */
  isGone(err: unknown): boolean {
    return [404, 409].includes((err as { statusCode?: number } | undefined)?.statusCode ?? 0);
  }
}

/** The bytes of the files under a directory (a checkpoint's); null when it cannot be read. */
async function dirBytes(dir: string): Promise<number | null> {
  try {
    const entries = await readdir(dir, { recursive: true, withFileTypes: true });
    const sizes = await Promise.all(
      entries.filter((e) => e.isFile()).map((e) => stat(join(e.parentPath ?? e.path, e.name)).then((s) => s.size)),
    );
    return sizes.reduce((a, b) => a + b, 0);
  } catch {
    return null;
  }
}

const exists = (path: string) =>
  access(path).then(
    () => true,
    () => false,
  );

/** Runs a program with an argument array (no shell); rejects with its error output. */
async function run(file: string, args: string[]): Promise<void> {
  await promisify(execFile)(file, args, { timeout: 600_000, maxBuffer: 1024 * 1024 }).catch(
    (err: Error & { stderr?: string }) => {
      throw new Error(`${file} ${args[2] ?? ''} failed: ${(err.stderr || err.message).trim().slice(-1000)}`);
    },
  );
}
