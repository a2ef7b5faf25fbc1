import { readFileSync } from 'node:fs';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { HostLost, type RunnerChannel } from '../../apps/api/src/sandbox/backend.ts';
import {
  RUNNER_PROTOCOL,
  RunnerClient,
  RunnerGoneError,
  RunnerOutdated,
} from '../../apps/api/src/sandbox/runner-client.ts';

/** A frame as a runner writes it (unsigned). */
function frame(msg: Record<string, unknown>): Buffer {
  const body = Buffer.from(JSON.stringify(msg));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  return Buffer.concat([head, body]);
}

/**
 * A channel whose runner says `ready` with these fields, whether the client dropped it, and a way
 * to end its connection (as a backend does: `err` a HostLost when the runner's host stopped answering).
 */
function channelSaying(ready: Record<string, unknown>) {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const closers: ((err?: Error) => void)[] = [];
  const state = {
    destroyed: false,
    close: (err?: Error) => {
      for (const l of closers) l(err);
    },
  };
  const channel: RunnerChannel = {
    stdin: new PassThrough(),
    stdout,
    stderr,
    destroy: () => {
      state.destroyed = true;
    },
    onClose: (listener) => closers.push(listener),
  };
  queueMicrotask(() => stdout.write(frame({ ev: 'ready', ...ready })));
  return { channel, state, stdout };
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

  it('a runner whose connection fails because its host stopped answering ended as node_lost; its calls say why', async () => {
    const { channel, state } = channelSaying({ protocol: RUNNER_PROTOCOL, pid: 7 });
    const client = await RunnerClient.start(channel, 5_000);
    state.close(new HostLost('node kf1 stopped answering'));
    expect(client.alive).toBe(false);
    expect(client.lostAs).toBe('node_lost');
    const err = await client.exec('print(1)', { timeoutMs: 5_000, maxOutputBytes: 1024 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RunnerGoneError);
    expect((err as Error).message).toBe('runner stream failed: node kf1 stopped answering');
  });

  it('the first cause wins: a runner dropped for a forged frame stays runner_lost when its host is lost after', async () => {
    const { channel, state, stdout } = channelSaying({ protocol: RUNNER_PROTOCOL, pid: 7 });
    const client = await RunnerClient.start(channel, 5_000);
    const reasons: string[] = [];
    client.onExit((reason) => reasons.push(reason));
    stdout.write(frame({ ev: 'result', id: 'nobody-asked' }));
    await new Promise((r) => setImmediate(r));
    expect(client.alive).toBe(false);
    state.close(new HostLost('node kf1 stopped answering'));
    expect(client.lostAs).toBe('runner_lost');
    expect(reasons).toHaveLength(1);
    expect(reasons[0]).toContain('frame for no pending request');
  });
});
