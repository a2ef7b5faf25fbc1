import { PassThrough, type Duplex } from 'node:stream';
import type Docker from 'dockerode';
import type { RunnerChannel } from '../backend.ts';
import { RUNNER_CMD, RunnerClient } from '../runner-client.ts';

/**
 * Starts `cmd` (the runner, or another program speaking its protocol in tests) in a running
 * container as `user`, as one long-lived `docker exec` whose attached stdin and stdout carry
 * the frames; Docker multiplexes stdout and stderr on one stream, taken apart here.
 */
export async function attachRunner(
  docker: Docker,
  container: Docker.Container,
  user: string,
  cmd = RUNNER_CMD,
): Promise<RunnerChannel> {
  const exec = await container.exec({
    Cmd: cmd,
    User: user,
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
    Tty: false,
  });
  const stream = (await exec.start({ hijack: true, stdin: true })) as Duplex;
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  docker.modem.demuxStream(stream, stdout, stderr);
  // Listened to from the start, so that an end (or an error) before the client listens is kept for it.
  let closed: { err?: Error } | undefined;
  const listeners: ((err?: Error) => void)[] = [];
  const close = (err?: Error) => {
    if (closed) return;
    closed = { err };
    for (const l of listeners.splice(0)) l(err);
  };
  stream.on('end', () => close());
  stream.on('close', () => close());
  stream.on('error', close);
  return {
    stdin: stream,
    stdout,
    stderr,
    destroy: () => stream.destroy(),
    onClose(listener) {
      if (closed) listener(closed.err);
      else listeners.push(listener);
    },
  };
}

/** Runs `cmd` in the container as `user` to its end: its exit code and the tail of its output. */
export async function runToEnd(
  docker: Docker,
  container: Docker.Container,
  user: string,
  cmd: string[],
): Promise<{ code: number | null; tail: string }> {
  const exec = await container.exec({ Cmd: cmd, User: user, AttachStdout: true, AttachStderr: true, Tty: false });
  const stream = (await exec.start({ hijack: true, stdin: false })) as Duplex;
  let tail = '';
  const keep = new PassThrough();
  keep.on('data', (c: Buffer) => (tail = (tail + c.toString('utf8')).slice(-1000)));
  docker.modem.demuxStream(stream, keep, keep);
  await new Promise<void>((resolve, reject) => {
    stream.on('end', resolve);
    stream.on('close', resolve);
    stream.on('error', reject);
  });
  const { ExitCode } = await exec.inspect();
  return { code: ExitCode ?? null, tail };
}

/** Starts a runner in a running container and waits until it is ready. */
export async function startRunner(
  docker: Docker,
  container: Docker.Container,
  user: string,
  readyTimeoutMs?: number,
  cmd?: string[],
): Promise<RunnerClient> {
  return RunnerClient.start(await attachRunner(docker, container, user, cmd), readyTimeoutMs);
}
