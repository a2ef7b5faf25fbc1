import type Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { startRunner } from '../../apps/api/src/sandbox/docker/runner.ts';
import { RUNNER_PROTOCOL, type RunnerClient } from '../../apps/api/src/sandbox/runner-client.ts';
import { ticksDuring } from '../support/ticks.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const MiB = 1024 * 1024;

/**
 * A stand-in for the runner, run in a real sandbox container over a real `docker exec`: code in
 * a sandbox can write to the runner's stdout, so the host must survive whatever frames it sends.
 */
const FAKE_RUNNER = `
import base64, hashlib, json, struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(body):
    out.write(struct.pack(">I", len(body)) + body)
    out.flush()
send(b'{"ev":"ready","protocol":${RUNNER_PROTOCOL}}')
if sys.argv[1] == "oversized":
    out.write(struct.pack(">I", 60000000))
    out.flush()
    inp.read()  # nothing after the header, ever: the host must refuse it from the header alone
    sys.exit(0)
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    msg = json.loads(inp.read(struct.unpack(">I", head)[0]))
    data = base64.b64encode(bytes(range(256)) * (16 * 1024 * 1024 // 256)).decode()
    send(json.dumps({"ev": "result", "id": msg["id"], "code_sha256": hashlib.sha256(msg["code"].encode()).hexdigest(), "ok": True, "exit_code": 0, "error": None, "stdout": "synced", "stderr": "",
        "stdout_bytes": 6, "stderr_bytes": 0, "truncated": False, "duration_ms": 1.0, "artifacts": [], "restarted": False,
        "changes": {"changed": [{"path": "big.bin", "data": data}], "deleted": [], "skipped": []}}).encode())
`;

describe('runner frames (a real docker exec stream)', () => {
  let container: Docker.Container;
  const clients: RunnerClient[] = [];
  const start = async (mode: string) => {
    const client = await startRunner(docker, container, '65534:65534', 30_000, ['python3', '-c', FAKE_RUNNER, mode]);
    clients.push(client);
    return client;
  };

  beforeAll(async () => {
    container = await docker.createContainer({
      Image: 'kiln-sandbox:latest',
      Cmd: ['sleep', 'infinity'],
      HostConfig: { NetworkMode: 'none', AutoRemove: true },
    });
    await container.start();
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await container.remove({ force: true }).catch(() => undefined);
  });

  it('ends the sandbox on a frame header over the limit, before any of its body arrives', async () => {
    const client = await start('oversized');
    // 60 MB is under the old 64 MiB limit: the host used to wait for (and buffer) the whole body.
    const reason = await new Promise<string>((resolve) => client.onExit(resolve));
    expect(reason).toMatch(/frame of 60000000 bytes \(limit \d+\)/);
    expect(client.alive).toBe(false);
  });

  it('reads a full-size sync result in linear time and parses it off the event loop', async () => {
    const client = await start('valid');
    const concat = vi.spyOn(Buffer, 'concat');
    const parse = vi.spyOn(JSON, 'parse');
    try {
      const { value: result, ticks } = await ticksDuring(() =>
        client.exec('pass', { timeoutMs: 30_000, maxOutputBytes: 65_536, sync: true }),
      );
      const data = Buffer.from(result.changes!.changed[0]!.data, 'base64');
      expect(data.length).toBe(16 * MiB);
      expect([data[0], data[255], data[256], data.at(-1)]).toEqual([0, 255, 0, 255]);
      expect(result.stdout).toBe('synced');
      expect(client.alive).toBe(true);
      const frame = Buffer.byteLength(JSON.stringify(result));
      // Joined once per frame (the Docker stream's demultiplexer copies each chunk once more):
      // chunk by chunk, a 22 MB frame meant gigabytes of copying.
      const copied = concat.mock.results.reduce((n, r) => n + (r.value as Buffer).length, 0);
      expect(copied).toBeLessThan(4 * frame);
      // The frame's JSON was parsed in a worker, never on this thread.
      expect(parse.mock.calls.filter(([text]) => typeof text === 'string' && text.length > MiB)).toHaveLength(0);
      expect(ticks).toBeGreaterThan(10);
    } finally {
      concat.mockRestore();
      parse.mockRestore();
    }
  });
});
