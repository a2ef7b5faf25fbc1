/**
 * Builds the sandbox image offline: debootstrap a Debian base (python3, numpy, pandas,
 * matplotlib from Debian packages), `docker import` it, then build the runner layer on top.
 * Both images are tagged with a hash of their inputs, so an unchanged build is a no-op.
 * `KILN_SANDBOX_BASE` replaces the debootstrapped base with any image that has python3.
 * The egress proxy image (egress/: Squid from Debian's packages) is built on the same base.
 */
import { createHash } from 'node:crypto';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import Docker from 'dockerode';

export const SANDBOX_REPO = 'kiln-sandbox';
export const EGRESS_REPO = 'kiln-egress';
/** The egress proxy's sources: its own image, never part of the sandbox image's inputs. */
const EGRESS_DIR = 'egress';
const BASE_REPO = 'kiln-sandbox-base';
const SUITE = 'bookworm';
const BASE_PACKAGES = ['python3', 'python3-numpy', 'python3-pandas', 'python3-matplotlib', 'ca-certificates'];
const TRIM = ['usr/share/doc', 'usr/share/man', 'usr/share/info', 'var/cache/apt/archives', 'var/lib/apt/lists'];
const here = fileURLToPath(new URL('.', import.meta.url));

const log = (msg: string) => process.stderr.write(`\x1b[36m[sandbox-image]\x1b[0m ${msg}\n`);

function hashOf(parts: (string | Buffer)[]): string {
  const h = createHash('sha256');
  for (const p of parts) h.update(p).update('\0');
  return h.digest('hex').slice(0, 16);
}

/** Build outputs that are never runner inputs: Python's bytecode caches are written wherever the runner was imported. */
const NOT_INPUTS = new Set(['__pycache__']);

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .filter((e) => !NOT_INPUTS.has(e.name))
    .flatMap((e) => (e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)]))
    .sort();
}

/** Hash of everything that goes into the debootstrapped base. */
export function baseHash(): string {
  return hashOf([SUITE, ...BASE_PACKAGES, ...TRIM]);
}

/** Hash of the runner layer's inputs plus the base it builds on. */
export function runnerHash(base: string, dir = here): string {
  const files = filesUnder(dir).filter((f) => isRunnerInput(relative(dir, f)));
  return hashOf([base, ...files.flatMap((f) => [relative(dir, f), readFileSync(f)])]);
}

const isRunnerInput = (rel: string) => rel !== 'build.ts' && !rel.startsWith(`${EGRESS_DIR}/`);

/** Hash of the egress proxy image's inputs (Dockerfile, squid.conf, the helper) plus its base. */
export function egressHash(base: string, dir = join(here, EGRESS_DIR)): string {
  return hashOf([base, ...filesUnder(dir).flatMap((f) => [relative(dir, f), readFileSync(f)])]);
}

/** Whether the Docker Engine has the image (the API's templates ask it too). */
export async function imageExists(docker: Docker, ref: string): Promise<boolean> {
  try {
    await docker.getImage(ref).inspect();
    return true;
  } catch (err) {
    if ((err as { statusCode?: number }).statusCode === 404) return false;
    throw err;
  }
}

function run(cmd: string, args: string[], onLine?: (line: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let tail = '';
    const feed = (chunk: Buffer) => {
      tail = (tail + chunk.toString()).slice(-4000);
      for (const line of chunk.toString().split('\n')) if (line.trim()) onLine?.(line.trim());
    };
    child.stdout.on('data', feed);
    child.stderr.on('data', feed);
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} exited ${code}:\n${tail}`))));
  });
}

/** The Debian mirror this machine's apt already uses, so the build needs no extra configuration. */
export function debianMirror(): string {
  if (process.env.KILN_DEBIAN_MIRROR) return process.env.KILN_DEBIAN_MIRROR;
  const sources = ['/etc/apt/sources.list.d/debian.sources', '/etc/apt/sources.list'].filter(existsSync);
  for (const file of sources) {
    const uri = mirrorFromSources(readFileSync(file, 'utf8'));
    if (uri) return uri;
  }
  throw new Error('no Debian mirror found in /etc/apt; set KILN_DEBIAN_MIRROR');
}

/** The first non-security archive URI in an apt sources file (deb822 or one-line format). */
export function mirrorFromSources(text: string): string | undefined {
  const deb822 = [...text.matchAll(/^URIs:\s*(\S+)/gm)].map((m) => m[1]!);
  const oneLine = [...text.matchAll(/^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+/gm)].map((m) => m[1]!);
  return [...deb822, ...oneLine].find((uri) => !uri.includes('security'));
}

async function buildBase(docker: Docker, tag: string): Promise<void> {
  if (process.getuid?.() !== 0)
    throw new Error('building the sandbox base needs root (debootstrap); run as root or set KILN_SANDBOX_BASE');
  if (!existsSync('/usr/sbin/debootstrap')) {
    log('installing debootstrap');
    await run('bash', ['-c', `source ${JSON.stringify(join(here, '../infra/lib.sh'))} && apt_install debootstrap`]);
  }
  const root = mkdtempSync(join(tmpdir(), 'kiln-rootfs-'));
  try {
    const mirror = debianMirror();
    log(`debootstrap ${SUITE} from ${mirror} (a few minutes on first build)`);
    let n = 0;
    await run(
      'debootstrap',
      ['--variant=minbase', `--include=${BASE_PACKAGES.join(',')}`, SUITE, root, mirror],
      (line) => {
        if (line.startsWith('I: ') && (++n % 25 === 0 || /Base system|Configuring python3 /.test(line)))
          log(line.slice(3));
      },
    );
    for (const p of TRIM) rmSync(join(root, p), { recursive: true, force: true });
    log(`importing base as ${tag}`);
    const tar = spawn('tar', ['-C', root, '--numeric-owner', '-c', '.'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [repo, version] = tag.split(':') as [string, string];
    const stream = await docker.importImage(tar.stdout, { repo, tag: version });
    await followProgress(docker, stream);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

function followProgress(docker: Docker, stream: NodeJS.ReadableStream, onEvent?: (e: { stream?: string }) => void) {
  return new Promise<void>((resolve, reject) => {
    docker.modem.followProgress(
      stream,
      (err: Error | null, output: { error?: string }[]) => {
        const failed = err ?? output.find((o) => o.error);
        if (failed) reject(failed instanceof Error ? failed : new Error(failed.error));
        else resolve();
      },
      onEvent,
    );
  });
}

/** The base image both images build on: KILN_SANDBOX_BASE, else the debootstrapped one (built when missing). */
async function ensureBase(docker: Docker, base: string | undefined): Promise<string> {
  let baseRef = base;
  if (!baseRef) {
    baseRef = `${BASE_REPO}:${baseHash()}`;
    if (await imageExists(docker, baseRef)) log(`base ${baseRef} is cached`);
    else await buildBase(docker, baseRef);
  } else if (!(await imageExists(docker, baseRef))) {
    log(`pulling ${baseRef}`);
    await followProgress(docker, await docker.pull(baseRef));
  }
  return baseRef;
}

/**
 * Builds `repo:<hash>` from a Dockerfile context on the base unless it exists, and tags it
 * `repo:latest` too: an unchanged build is a no-op.
 */
async function ensureLayer(
  docker: Docker,
  l: { repo: string; hash: string; context: string; src: string[]; baseRef: string; what: string },
): Promise<string> {
  const tag = `${l.repo}:${l.hash}`;
  if (await imageExists(docker, tag)) {
    log(`${tag} is up to date`);
  } else {
    log(`building ${l.what} ${tag} on ${l.baseRef}`);
    const stream = await docker.buildImage(
      { context: l.context, src: l.src },
      { t: tag, buildargs: { BASE: l.baseRef }, rm: true, forcerm: true },
    );
    await followProgress(docker, stream, (e) => {
      const line = e.stream?.trim();
      if (line?.startsWith('Step ')) log(line);
    });
  }
  await docker.getImage(tag).tag({ repo: l.repo, tag: 'latest' });
  return tag;
}

/**
 * Ensures the sandbox image exists and returns its content-addressed tag (`<repo>:<hash>`, also
 * tagged `<repo>:latest`). `repo` is kiln-sandbox unless a server runs another name (`--image`).
 */
export async function ensureSandboxImage(
  docker = new Docker(),
  base = process.env.KILN_SANDBOX_BASE,
  repo = SANDBOX_REPO,
): Promise<string> {
  const baseRef = await ensureBase(docker, base);
  const src = filesUnder(here)
    .map((f) => relative(here, f))
    .filter(isRunnerInput);
  const hash = runnerHash(baseRef);
  return ensureLayer(docker, { repo, hash, context: here, src, baseRef, what: 'runner layer' });
}

/**
 * Ensures the egress proxy image exists (Squid installed with apt from the base's Debian
 * mirror, inside the build) and returns its content-addressed tag; also tagged `latest`.
 */
export async function ensureEgressImage(docker = new Docker(), base = process.env.KILN_SANDBOX_BASE): Promise<string> {
  const baseRef = await ensureBase(docker, base);
  const dir = join(here, EGRESS_DIR);
  const src = filesUnder(dir).map((f) => relative(dir, f));
  const hash = egressHash(baseRef, dir);
  return ensureLayer(docker, {
    repo: EGRESS_REPO,
    hash,
    context: dir,
    src,
    baseRef,
    what: 'the egress proxy (apt-get install squid)',
  });
}

/**
 * `--image <name>:latest`: build the sandbox image under the name a server runs
 * (`KILN_SANDBOX_IMAGE`), as a self-update's restart does for a server whose image is not
 * kiln-sandbox:latest; undefined without the flag.
 */
function imageRepoArg(argv: string[]): string | undefined {
  const i = argv.indexOf('--image');
  if (i < 0) return undefined;
  const repo = /^([a-z0-9][a-z0-9._/-]*):latest$/.exec(argv[i + 1] ?? '')?.[1];
  if (!repo)
    throw new Error(`--image takes <name>:latest (the name a server runs), not ${JSON.stringify(argv[i + 1])}`);
  return repo;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const started = Date.now();
  (async () => {
    const repo = imageRepoArg(process.argv.slice(2)) ?? SANDBOX_REPO;
    const tag = await ensureSandboxImage(undefined, undefined, repo);
    // Without the proxy image only sandboxes with network allowlist are unavailable (503).
    const egress = await ensureEgressImage().catch((err: Error) => {
      log(`the egress proxy image failed to build (sandbox.network allowlist will answer 503): ${err.message}`);
      return 'no egress proxy image';
    });
    log(`ready: ${tag} (also ${repo}:latest) and ${egress} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  })().catch((err: Error) => {
    log(`failed: ${err.message}`);
    process.exit(1);
  });
}
