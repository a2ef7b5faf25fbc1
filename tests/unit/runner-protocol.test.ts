import { readFileSync } from 'node:fs';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import type { RunnerChannel } from '../../apps/api/src/sandbox/backend.ts';
import { RUNNER_PROTOCOL, RunnerClient, RunnerOutdated } from '../../apps/api/src/sandbox/runner-client.ts';

/** A channel whose runner says `ready` with these fields, and whether the client dropped it. */
function channelSaying(ready: Record<string, unknown>) {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const state = { destroyed: false };
  const channel: RunnerChannel = {
    stdin: new PassThrough(),
    stdout,
    stderr,
    destroy: () => {
      state.destroyed = true;
    },
    onClose: () => {},
  };
  const body = Buffer.from(JSON.stringify({ ev: 'ready', ...ready }));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  queueMicrotask(() => stdout.write(Buffer.concat([head, body])));
  return { channel, state };
}

/** The runner and the server name the version of the frames they speak, and a server refuses another. */
describe('the runner protocol', () => {
  it('the runner in the sandbox image speaks the version this server does', () => {
    const runner = readFileSync(new URL('../../sandbox-image/runner/kiln_runner.py', import.meta.url), 'utf8');
    expect(Number(/^PROTOCOL = (\d+)$/m.exec(runner)?.[1])).toBe(RUNNER_PROTOCOL);
  });

  it('a runner of this version is spoken to', async () => {
    const { channel, state } = channelSaying({ protocol: RUNNER_PROTOCOL, pid: 7 });
    const client = await RunnerClient.start(channel, 5_000);
    expect(client.alive).toBe(true);
    expect(state.destroyed).toBe(false);
  });

  it('one of an image built before versions, or of another version, is refused and dropped, saying why', async () => {
    for (const [ready, spoken] of [
      [{ pid: 7 }, 'no protocol version'],
      [{ protocol: RUNNER_PROTOCOL + 1, pid: 7 }, `protocol ${RUNNER_PROTOCOL + 1}`],
      [{ protocol: String(RUNNER_PROTOCOL), pid: 7 }, 'no protocol version'],
    ] as const) {
      const { channel, state } = channelSaying(ready);
      const err = await RunnerClient.start(channel, 5_000).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RunnerOutdated);
      expect((err as Error).message).toContain(`the sandbox's runner speaks ${spoken}, this server ${RUNNER_PROTOCOL}`);
      expect((err as Error).message).toContain('npm run sandbox:build');
      expect(state.destroyed).toBe(true);
    }
  });
});
