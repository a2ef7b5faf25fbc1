import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  baseHash,
  ensureSandboxImage,
  mirrorFromSources,
  runnerHash,
  SANDBOX_REPO,
} from '../../sandbox-image/build.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';

const docker = connectDocker(process.env.DOCKER_HOST);
const imageDir = fileURLToPath(new URL('../../sandbox-image', import.meta.url));

/** Runs a command in a throwaway container of the image, with no network, and returns its output. */
async function runInImage(image: string, cmd: string[], user?: string): Promise<{ code: number; out: string }> {
  const container = await docker.createContainer({
    Image: image,
    Cmd: cmd,
    User: user,
    HostConfig: { NetworkMode: 'none', AutoRemove: false },
  });
  try {
    await container.start();
    const { StatusCode } = await container.wait();
    const logs = await container.logs({ stdout: true, stderr: true });
    // Strip the 8-byte multiplexing headers of each frame.
    let out = '';
    for (let i = 0; i + 8 <= logs.length; ) {
      const len = logs.readUInt32BE(i + 4);
      out += logs.subarray(i + 8, i + 8 + len).toString();
      i += 8 + len;
    }
    return { code: StatusCode, out };
  } finally {
    await container.remove({ force: true });
  }
}

describe('sandbox image', () => {
  it('is built, tagged by its input hash and as latest, and a second build is a no-op', async () => {
    const tag = await ensureSandboxImage(docker);
    const before = await docker.getImage(tag).inspect();
    expect(tag).toMatch(new RegExp(`^${SANDBOX_REPO}:[0-9a-f]{16}$`));
    expect((await docker.getImage(`${SANDBOX_REPO}:latest`).inspect()).Id).toBe(before.Id);
    expect(await ensureSandboxImage(docker)).toBe(tag);
    const after = await docker.getImage(tag).inspect();
    expect(after.Id).toBe(before.Id);
    expect(after.Created).toBe(before.Created);
  });

  it('runs python3 with numpy, pandas and matplotlib as a non-root user, offline', async () => {
    const tag = await ensureSandboxImage(docker);
    const script = [
      'import os, io, numpy, pandas, matplotlib.pyplot as plt',
      'df = pandas.DataFrame({"x": numpy.arange(4)})',
      'plt.plot(df.x, df.x ** 2); buf = io.BytesIO(); plt.savefig(buf, format="png")',
      'print(os.getuid(), int(df.x.sum()), buf.getvalue()[:4] == b"\\x89PNG", os.getcwd())',
    ].join('\n');
    // Any uid: each sandbox gets its own, and nothing in the image belongs to a fixed one.
    const r = await runInImage(tag, ['python3', '-c', script], '2000012345:2000012345');
    expect(r.out.trim()).toBe('2000012345 6 True /workspace');
    expect(r.code).toBe(0);
  });

  it('ships no compiler and no setuid or setgid file', async () => {
    const tag = await ensureSandboxImage(docker);
    const script = [
      'for c in cc c++ cpp gcc g++ as ld; do command -v "$c"; done',
      'ls /usr/lib/gcc/*/*/cc1 2>/dev/null',
      'find / -xdev -type f -perm /6000 2>/dev/null',
      'echo end',
    ].join('; ');
    const r = await runInImage(tag, ['sh', '-c', script], '0:0');
    expect(r.out).toBe('end\n');
  });

  it('the runner hash follows its inputs and its base', () => {
    const copy = mkdtempSync(join(tmpdir(), 'kiln-image-'));
    try {
      cpSync(imageDir, copy, { recursive: true });
      const h = runnerHash('base:a', copy);
      expect(runnerHash('base:a', copy)).toBe(h);
      expect(runnerHash('base:b', copy)).not.toBe(h);
      writeFileSync(join(copy, 'runner', 'extra.py'), 'print(1)\n');
      expect(runnerHash('base:a', copy)).not.toBe(h);
      writeFileSync(join(copy, 'build.ts'), '// build logic is not a runner input\n');
      // Nor is Python's bytecode cache, written wherever the runner was imported.
      mkdirSync(join(copy, 'runner', '__pycache__'), { recursive: true });
      writeFileSync(join(copy, 'runner', '__pycache__', 'kiln_runner.cpython-311.pyc'), 'bytecode');
      rmSync(join(copy, 'runner', 'extra.py'));
      expect(runnerHash('base:a', copy)).toBe(h);
    } finally {
      rmSync(copy, { recursive: true, force: true });
    }
    expect(baseHash()).toMatch(/^[0-9a-f]{16}$/);
  });

  it('finds the Debian mirror in both apt source formats, skipping the security archive', () => {
    const deb822 =
      'Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\nTypes: deb\nURIs: http://mirror.example/debian\n';
    expect(mirrorFromSources(deb822)).toBe('http://mirror.example/debian');
    const classic =
      '# comment\ndeb [arch=amd64] http://mirror.example/debian bookworm main\ndeb http://mirror.example/debian-security bookworm-security main\n';
    expect(mirrorFromSources(classic)).toBe('http://mirror.example/debian');
    expect(mirrorFromSources('# nothing here\n')).toBeUndefined();
  });
});
