/**
 * Registers Kiln's gVisor runtimes in dockerd's daemon.json, and turns on its experimental API
 * (only for checkpoints: idle gVisor sandboxes are paused to disk), run by infra/docker.sh:
 *
 *   tsx infra/daemon-json.ts <daemon.json> <runsc path> <platform> [slice µs]   → prints "changed" or "unchanged"
 *   tsx infra/daemon-json.ts <daemon.json> --platform                             → prints the recorded platform, or nothing
 *
 * With a slice (KILN_GVISOR_SLICE_US, 300 by default), the runtimes run runsc through a wrapper
 * (`sliceWrapper`) that gives it, and so every process of the sandbox, that CPU time slice.
 *
 * Every other key of the file (and every other runtime) is kept as it is; the file is written
 * (atomically) only when its entries differ from what is there, so a second run changes nothing.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * kiln-gvisor: gVisor's own netstack (Debian 12's runsc cannot join a Docker network with it);
 * kiln-gvisor-nonet: for NetworkMode none, every gVisor sandbox without egress;
 * kiln-gvisor-egress: no network either, but the sandbox may connect to a host Unix socket
 * mounted into it (only the egress bridge's socket is): gVisor sandboxes with network allowlist.
 */
export const RUNTIMES = {
  'kiln-gvisor': [] as string[],
  'kiln-gvisor-nonet': ['--network=none'],
  'kiln-gvisor-egress': ['--network=none', '--host-uds=open'],
};

/** sched_getattr and sched_setattr, by the host's architecture (the wrapper calls them by number). */
const SCHED_SYSCALLS: Partial<Record<NodeJS.Architecture, { get: number; set: number }>> = {
  x64: { get: 315, set: 314 },
  arm64: { get: 275, set: 274 },
};

/**
 * The text of a wrapper that runs `runsc` with a fair-class (SCHED_OTHER) CPU time slice of
 * `sliceUs` µs (sched_setattr's sched_runtime, Linux ≥ 6.12; ignored by older kernels), which
 * every process it starts inherits: the sandbox's sentry, gofer and (on ptrace) the stubs its
 * code runs in. The kernel's default slice is ~0.7 ms times a factor of the CPU count (1.4 ms on 2
 * cores); a waking task waits out the running one's, and on gVisor's ptrace platform an execution is
 * a chain of many wake-ups, so with another team's sandboxes spinning every wake-up of a quiet
 * team's sandbox, and of the API serving it, waited that long. Shorter slices for the sandboxes
 * bound that wait; the API and the rest of the host keep the default. Undefined where the
 * architecture's system call numbers are not known here.
 */
export function sliceWrapper(runsc: string, sliceUs: number, arch: NodeJS.Architecture): string | undefined {
  const nr = SCHED_SYSCALLS[arch];
  if (!nr) return undefined;
  if (!Number.isInteger(sliceUs) || sliceUs < 100 || sliceUs > 100_000)
    throw new Error(`a slice is 100 to 100000 µs, not ${sliceUs}`);
  const quoted = `'${runsc.replaceAll('\\', '\\\\').replaceAll("'", "\\'")}'`;
  return `#!/usr/bin/perl
# Written by Kiln's infra/docker.sh (infra/daemon-json.ts); a change is a new file under a new name.
# Runs runsc with a CPU time slice of ${sliceUs} us for everything it starts (inherited across fork
# and exec); a kernel without custom slices ignores it. The nice value is kept.
my $attr = "\\0" x 48;
if (syscall(${nr.get}, 0, $attr, 48, 0) == 0) {
  my @f = unpack("LLQlLQQQ", $attr);
  # Only the normal policy has a slice; size 48, no flags, the same nice, this runtime.
  syscall(${nr.set}, 0, pack("LLQlLQQQ", 48, 0, 0, $f[3], 0, ${sliceUs * 1000}, 0, 0), 0) if $f[1] == 0;
}
exec { ${quoted} } ${quoted}, @ARGV;
die "kiln: cannot run " . ${quoted} . ": $!\\n";
`;
}

/**
 * Writes the wrapper under `dir` by the hash of its text (never rewritten in place: a runtime in
 * use keeps its file) and returns its path.
 */
export function installWrapper(dir: string, text: string): string {
  const file = join(dir, `runsc-${createHash('sha256').update(text).digest('hex').slice(0, 12)}`);
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    writeFileSync(`${file}.kiln-tmp`, text, { mode: 0o755 });
    renameSync(`${file}.kiln-tmp`, file);
  }
  return file;
}

type Runtime = { path?: unknown; runtimeArgs?: unknown };
type DaemonJson = Record<string, unknown> & { runtimes?: Record<string, Runtime> };

/** The daemon.json text with every runtime registered for this runsc and platform, and whether that changed anything. */
export function mergeRuntimes(text: string, runsc: string, platform: string): { text: string; changed: boolean } {
  const current: DaemonJson = text.trim() ? JSON.parse(text) : {};
  if (typeof current !== 'object' || current === null || Array.isArray(current))
    throw new Error('daemon.json does not hold a JSON object');
  const runtimes = { ...(current.runtimes ?? {}) };
  let changed = false;
  for (const [name, extra] of Object.entries(RUNTIMES)) {
    const want = { path: runsc, runtimeArgs: [`--platform=${platform}`, ...extra] };
    const have = runtimes[name];
    if (JSON.stringify({ path: have?.path, runtimeArgs: have?.runtimeArgs }) === JSON.stringify(want)) continue;
    runtimes[name] = want;
    changed = true;
  }
  // Docker's checkpoint API (pausing idle gVisor sandboxes to disk) is behind its experimental switch.
  if (current.experimental !== true) changed = true;
  if (!changed) return { text, changed };
  return { text: `${JSON.stringify({ ...current, runtimes, experimental: true }, null, 2)}\n`, changed };
}

/** The platform recorded in the kiln-gvisor-nonet entry, if any. */
export function recordedPlatform(text: string): string | undefined {
  const current: DaemonJson = text.trim() ? JSON.parse(text) : {};
  const args = current.runtimes?.['kiln-gvisor-nonet']?.runtimeArgs;
  if (!Array.isArray(args)) return undefined;
  const flag = args.find((a): a is string => typeof a === 'string' && a.startsWith('--platform='));
  return flag?.slice('--platform='.length);
}

function read(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return '';
    throw err;
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [file, runsc, platform, slice] = process.argv.slice(2);
  if (!file || !runsc)
    throw new Error('usage: daemon-json.ts <daemon.json> (<runsc> <platform> [slice µs] | --platform)');
  if (runsc === '--platform') {
    process.stdout.write(`${recordedPlatform(read(file)) ?? ''}\n`);
  } else {
    if (!platform || !/^[a-z0-9_-]+$/.test(platform)) throw new Error(`not a platform name: ${platform}`);
    const before = read(file);
    const wrapper = Number(slice ?? 0) > 0 ? sliceWrapper(runsc, Number(slice), process.arch) : undefined;
    const path = wrapper ? installWrapper(process.env.KILN_RUNTIME_DIR ?? '/usr/local/lib/kiln', wrapper) : runsc;
    const { text, changed } = mergeRuntimes(before, path, platform);
    if (changed) {
      writeFileSync(`${file}.kiln-tmp`, text, { mode: 0o644 });
      renameSync(`${file}.kiln-tmp`, file);
    }
    process.stdout.write(changed ? 'changed\n' : 'unchanged\n');
  }
}
