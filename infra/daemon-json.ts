/**
 * Registers Kiln's gVisor runtimes in dockerd's daemon.json, and turns on its experimental API
 * (only for checkpoints: idle gVisor sandboxes are paused to disk), run by infra/docker.sh:
 *
 *   tsx infra/daemon-json.ts <daemon.json> <runsc path> <platform>   → prints "changed" or "unchanged"
 *   tsx infra/daemon-json.ts <daemon.json> --platform                  → prints the recorded platform, or nothing
 *
 * Every other key of the file (and every other runtime) is kept as it is; the file is written
 * (atomically) only when its entries differ from what is there, so a second run changes nothing.
 */
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
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
  const [file, runsc, platform] = process.argv.slice(2);
  if (!file || !runsc) throw new Error('usage: daemon-json.ts <daemon.json> (<runsc> <platform> | --platform)');
  if (runsc === '--platform') {
    process.stdout.write(`${recordedPlatform(read(file)) ?? ''}\n`);
  } else {
    if (!platform || !/^[a-z0-9_-]+$/.test(platform)) throw new Error(`not a platform name: ${platform}`);
    const before = read(file);
    const { text, changed } = mergeRuntimes(before, runsc, platform);
    if (changed) {
      writeFileSync(`${file}.kiln-tmp`, text, { mode: 0o644 });
      renameSync(`${file}.kiln-tmp`, file);
    }
    process.stdout.write(changed ? 'changed\n' : 'unchanged\n');
  }
}
