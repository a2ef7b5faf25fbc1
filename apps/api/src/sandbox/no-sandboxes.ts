import { ApiError } from '../lib/errors.ts';
import type { SandboxBackend } from './backend.ts';

const OFF = 'this server runs without a container runtime: sandboxes are off';

/**
 * The backend of a server started without a container runtime (benchmarks of the API alone, the
 * in-process test apps of suites that run no code): there are no containers to list or reap,
 * running code answers 503 `unavailable`, and readiness says why.
 */
export class NoSandboxes implements SandboxBackend {
  private off(): Promise<never> {
    return Promise.reject(new ApiError('unavailable', OFF));
  }

  create() {
    return this.off();
  }
  start() {
    return this.off();
  }
  attachRunner() {
    return this.off();
  }
  update() {
    return this.off();
  }
  async remove(): Promise<void> {}
  async list() {
    return [];
  }
  async stats() {
    return null;
  }
  async capabilities() {
    return {
      runtimes: [{ runtime: 'runc' as const, egress: false }],
      hostWorkspaceMounts: false,
      resizable: () => false,
      teamBound: false,
    };
  }
  ping() {
    return Promise.reject(new Error(OFF));
  }
  isGone(): boolean {
    return false;
  }
}
