import { stripVTControlCharacters } from 'node:util';
import { Readable } from 'node:stream';
import type Docker from 'dockerode';
import { type ImageBuilder, ImageBuildFailed, type ImageRecipe, TEMPLATE_LABEL } from '../backend.ts';

/** The uid the base image's runner layer ends with (sandbox-image/Dockerfile); containers run as their own uid anyway. */
const IMAGE_USER = '65534:65534';

/** The base image's compiler purge, word for word (sandbox-image/Dockerfile). */
const PURGE_COMPILERS = [
  `pkgs="$(dpkg-query -W -f '\${Package}\\n' 'gcc*' 'g++*' 'cpp*' 'binutils*' 'libgcc-*-dev' 2>/dev/null | grep -v -- '-base$' || true)"`,
  'if [ -n "$pkgs" ]; then dpkg --purge --force-depends $pkgs; fi',
  `for f in cc c++ cpp gcc g++ as ld; do ! command -v "$f" >/dev/null || { echo "compiler $f still present" >&2; exit 1; }; done`,
].join(' && ');

const run = (argv: string[]) => `RUN ${JSON.stringify(argv)}`;

/**
 * The Dockerfile of a template. Every RUN is in exec (JSON array) form and every package is
 * one argv word, so no shell ever parses a tenant's input; the names themselves were checked
 * against the Debian and PEP 508 grammars at the edge. Steps run from the most shared to the
 * least, so templates that differ only in their pip list reuse the apt layers.
 */
export function dockerfileOf(input: ImageRecipe): string {
  const spec = input;
  const lines = [
    `FROM ${input.base}`,
    'USER 0:0',
    ...(input.debianMirror ? ['COPY sources.list /etc/apt/sources.list'] : []),
    'ARG KILN_APT_DAY',
  ];
  const usesApt = spec.pip.length > 0 || spec.apt.length > 0;
  if (usesApt) {
    const install = ['apt-get', 'install', '-y', '--no-install-recommends', '-o', 'Dpkg::Use-Pty=0'];
    // The base image's purged compilers are empty stubs of the same versions (sandbox-image/Dockerfile),
    // so apt works on it as it is: nothing is downloaded again only to be purged at the end.
    lines.push(run(['apt-get', 'update']));
    // pip next, in a layer of its own: every template with Python packages shares it.
    if (spec.pip.length) lines.push(run([...install, 'python3-pip']));
    if (spec.apt.length) lines.push(run([...install, ...spec.apt]));
  }
  if (spec.pip.length) {
    // Wheels only: no package's setup.py (or any build backend) runs at build time.
    lines.push(
      run([
        'python3',
        '-m',
        'pip',
        'install',
        '--no-cache-dir',
        '--no-input',
        '--disable-pip-version-check',
        '--root-user-action=ignore',
        '--break-system-packages',
        '--only-binary=:all:',
        '--index-url',
        input.pipIndexUrl,
        ...spec.pip,
      ]),
    );
  }
  if (spec.files.length) lines.push(`COPY files/ ${input.filesDir}/`);
  // The base image's hardening again (sandbox-image/Dockerfile): no compiler, and no setuid or
  // setgid file, whatever the packages brought. A fixed script: no tenant input in it.
  if (usesApt) lines.push(run(['/bin/sh', '-c', PURGE_COMPILERS]));
  lines.push(
    run(['find', '/', '-xdev', '-type', 'f', '-perm', '/6000', '-exec', 'chmod', 'ug-s', '{}', '+']),
    run(['rm', '-rf', '/var/lib/apt/lists', '/var/cache/apt/archives']),
    `USER ${IMAGE_USER}`,
    'WORKDIR /workspace',
  );
  return `${lines.join('\n')}\n`;
}

/** One ustar entry: a 512-byte header and the content padded to 512 bytes. */
function tarEntry(name: string, data: Buffer): Buffer {
  const header = Buffer.alloc(512);
  const put = (value: string, offset: number, length: number) => header.write(value, offset, length, 'utf8');
  const octal = (n: number, length: number) => `${n.toString(8).padStart(length - 1, '0')}\0`;
  put(name, 0, 100);
  put(octal(0o644, 8), 100, 8);
  put(octal(0, 8), 108, 8);
  put(octal(0, 8), 116, 8);
  put(octal(data.length, 12), 124, 12);
  put(octal(0, 12), 136, 12);
  put('        ', 148, 8);
  put('0', 156, 1);
  put('ustar\0', 257, 6);
  put('00', 263, 2);
  let sum = 0;
  for (const b of header) sum += b;
  put(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8);
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return Buffer.concat([header, data, pad]);
}

/** The build context, made in memory: the Dockerfile, the apt sources when a mirror is set, the files. */
function contextTar(input: ImageRecipe): Buffer {
  const entries = [tarEntry('Dockerfile', Buffer.from(dockerfileOf(input)))];
  if (input.debianMirror)
    entries.push(tarEntry('sources.list', Buffer.from(`deb ${input.debianMirror} bookworm main\n`)));
  for (const f of input.files) entries.push(tarEntry(`files/${f.path}`, Buffer.from(f.content)));
  return Buffer.concat([...entries, Buffer.alloc(1024)]);
}

interface BuildEvent {
  stream?: string;
  status?: string;
  error?: string;
  errorDetail?: { message?: string };
}

/**
 * Builds the image with the Docker Engine's builder, host networking (apt reaches the mirror
 * and pip the index as the host does), each output line passed to `onLine`. An abort drops
 * the connection, which stops the build.
 */
async function buildImage(
  docker: Docker,
  input: ImageRecipe,
  opts: Parameters<ImageBuilder['build']>[1],
): Promise<undefined> {
  const abort = new AbortController();
  const timer = setTimeout(
    () => abort.abort(new ImageBuildFailed(`the build took longer than ${opts.timeoutMs / 1000} s`)),
    opts.timeoutMs,
  );
  const onAbort = () => abort.abort(opts.signal.reason);
  opts.signal.addEventListener('abort', onAbort, { once: true });
  let lastStep = '';
  try {
    if (opts.signal.aborted) throw opts.signal.reason;
    const stream = await docker.buildImage(Readable.from([contextTar(input)]), {
      t: input.tag,
      labels: input.labels,
      buildargs: { KILN_APT_DAY: input.aptDay },
      networkmode: 'host',
      rm: true,
      forcerm: true,
      abortSignal: abort.signal,
    } as Docker.ImageBuildOptions);
    await new Promise<void>((resolve, reject) => {
      abort.signal.addEventListener('abort', () => {
        (stream as Readable).destroy?.();
        reject(abort.signal.reason);
      });
      docker.modem.followProgress(
        stream,
        (err: Error | null, output: BuildEvent[]) => {
          if (abort.signal.aborted) return reject(abort.signal.reason);
          if (err) return reject(err);
          const failed = output.find((o) => o.error);
          if (failed) {
            const message = failed.errorDetail?.message ?? failed.error ?? 'the build failed';
            return reject(new ImageBuildFailed(lastStep ? `${lastStep}: ${message}` : message));
          }
          resolve();
        },
        (e: BuildEvent) => {
          // Docker colours a step's stderr: the log keeps plain text.
          for (const line of stripVTControlCharacters(e.stream ?? e.status ?? '').split('\n')) {
            const text = line.trimEnd();
            if (!text.trim()) continue;
            if (/^Step \d+\/\d+ : /.test(text)) lastStep = text;
            opts.onLine(text);
          }
          if (e.error) opts.onLine(e.errorDetail?.message ?? e.error);
        },
      );
    });
  } finally {
    clearTimeout(timer);
    opts.signal.removeEventListener('abort', onAbort);
  }
}

/** Template images on the Docker Engine the sandboxes run on. */
export class DockerImages implements ImageBuilder {
  constructor(private readonly docker: Docker) {}

  async idOf(ref: string): Promise<string | null> {
    const info = await this.docker
      .getImage(ref)
      .inspect()
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode === 404) return null;
        throw err;
      });
    return info?.Id ?? null;
  }

  build(recipe: ImageRecipe, opts: Parameters<ImageBuilder['build']>[1]): Promise<undefined> {
    return buildImage(this.docker, recipe, opts);
  }

  async remove(ref: string): Promise<void> {
    await this.docker
      .getImage(ref)
      .remove()
      .catch(() => undefined);
  }

  async held(): Promise<string[]> {
    const images = await this.docker.listImages({ filters: { label: [TEMPLATE_LABEL] } });
    return images
      .flatMap((i) => i.RepoTags ?? [])
      .filter((t) => t !== '<none>:<none>')
      .sort();
  }
}
