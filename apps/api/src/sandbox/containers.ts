import type { Logger } from 'pino';
import type { ContainerRequest, SandboxBackend, SandboxContainer } from './backend.ts';
import type { SandboxLimits } from './limits.ts';
import { RunnerClient } from './runner-client.ts';

/** A started container with a ready runner, warm or a session's. */
export interface Sandbox {
  id: string;
  container: SandboxContainer;
  client: RunnerClient;
  limits: SandboxLimits;
  /** Its hard lifetime (epoch ms), as its container records it for every replica's reaper. */
  expiresAt: number;
}

/** The team and session a container is created for; empty for a warm one. */
type SessionOf = Pick<ContainerRequest, 'teamId' | 'sessionId' | 'network'>;
const WARM: SessionOf = { teamId: '', sessionId: '' };

export interface ContainerOptions {
  image: string;
  /** This API instance, recorded on every container it creates. */
  owner: string;
  maxLifetimeMs: number;
  now: () => number;
}

/** Creates sandboxes (container and runner) through the backend, and ends them. */
export class Containers {
  /** Sandbox ids whose container is being created right now: never reaped. */
  private readonly creating = new Set<string>();

  constructor(
    private readonly backend: SandboxBackend,
    private readonly opts: ContainerOptions,
    private readonly log: Logger,
  ) {}

  isCreating(sandboxId: string): boolean {
    return this.creating.has(sandboxId);
  }

  /** Creates, starts and connects to a hardened container; a warm one is for no team or session yet. */
  async create(id: string, limits: SandboxLimits, session: SessionOf = WARM): Promise<Sandbox> {
    this.creating.add(id);
    try {
      return await this.createNow(id, limits, session);
    } finally {
      this.creating.delete(id);
    }
  }

  private async createNow(id: string, limits: SandboxLimits, session: SessionOf): Promise<Sandbox> {
    const expiresAt = this.opts.now() + this.opts.maxLifetimeMs;
    const container = await this.backend.create({
      image: this.opts.image,
      sandboxId: id,
      owner: this.opts.owner,
      ...session,
      expiresAt: new Date(expiresAt),
      limits,
    });
    try {
      await this.backend.start(container);
      const client = await RunnerClient.start(await this.backend.attachRunner(container));
      return { id, container, client, limits, expiresAt };
    } catch (err) {
      await this.backend.remove(container.id).catch(() => undefined);
      throw err;
    }
  }

  /** Closes the runner and removes the container. */
  async destroy(c: Sandbox): Promise<void> {
    c.client.close();
    await this.backend.remove(c.container.id).catch((err) => {
      this.log.warn({ err, sandbox: c.id }, 'could not remove sandbox container');
    });
  }
}
