import { spawn } from 'node:child_process';

/** What one sync_chunk frame carries (base64 in JSON: about 5.3 MiB on the wire). */
const CHUNK_BYTES = 4 * 1024 * 1024;

/**
 * A tar of a workspace's working tree without its .git, to copy into a sandbox (the tar path,
 * when the sandbox has no host workspace mount), in chunks of about `chunkBytes` as `tar`
 * writes it: the API never holds more than a chunk of it, whatever the size of the tree (the
 * sandbox's /workspace is what bounds it). Stopping early ends the `tar` process.
 */
export async function* tarChunks(dir: string, chunkBytes = CHUNK_BYTES): AsyncGenerator<Buffer> {
  const child = spawn(
    'tar',
    [
      '-C',
      dir,
      '--exclude=./.git',
      '--exclude=.kiln-*.tmp',
      '--no-xattrs',
      '--numeric-owner',
      '--owner=10001',
      '--group=10001',
      '-cf',
      '-',
      '.',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d: string) => {
    if (stderr.length < 4096) stderr += d;
  });
  const exited = new Promise<number | null>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', resolve);
  });
  let done = false;
  try {
    let pending: Buffer = Buffer.alloc(0);
    for await (const data of child.stdout as AsyncIterable<Buffer>) {
      pending = pending.length ? Buffer.concat([pending, data]) : data;
      while (pending.length >= chunkBytes) {
        yield pending.subarray(0, chunkBytes);
        pending = pending.subarray(chunkBytes);
      }
    }
    const code = await exited;
    if (code !== 0) throw new Error(`tar of the workspace failed (${code}): ${stderr.trim()}`);
    if (pending.length) yield pending;
    done = true;
  } finally {
    if (!done) {
      child.kill('SIGKILL');
      await exited.catch(() => undefined);
    }
  }
}
