import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

let launches = 0;
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface KilnProcess {
  child: ChildProcess;
  url: string;
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code (or signal name) once the process is gone. */
  exited: Promise<number | string>;
}

/** Starts `apps/api/src/main.ts` (of the checkout `cwd`) as a real child process and waits for its "listening" banner. */
export async function startKiln(env: Record<string, string>, cwd = ROOT): Promise<KilnProcess> {
  const proc = launchKiln(env, cwd);
  const url = await new Promise<string>((resolve, reject) => {
    const onData = () => {
      const m = /Kiln is listening on (\S+)/.exec(proc.stdout());
      if (m) {
        proc.child.stdout!.off('data', onData);
        resolve(m[1]!);
      }
    };
    proc.child.stdout!.on('data', onData);
    proc.exited.then((code) =>
      reject(new Error(`kiln exited (${code}) before listening:\n${proc.stderr()}\n${proc.stdout()}`)),
    );
  });
  return { ...proc, url };
}

/** Spawns the server without waiting for it, for start-up failures. */
export function launchKiln(env: Record<string, string>, cwd = ROOT): Omit<KilnProcess, 'url'> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'apps/api/src/main.ts'], {
    cwd,
    env: {
      PATH: process.env.PATH!,
      HOME: process.env.HOME ?? '/root',
      KILN_PORT: '0',
      KILN_LOG_LEVEL: 'warn',
      // No warm pool unless a test asks, and an owner of its own, so a killed test server's
      // containers are never confused with anyone else's.
      KILN_SANDBOX_POOL_SIZE: '0',
      // Words only: the built-in encoder's threads would take a core from the suite at each start.
      KILN_EMBEDDINGS_MODEL: 'none',
      KILN_INSTANCE_ID: `e2e-${process.pid}-${++launches}`,
      // An instance of its own never comes back to resume what it paused at shutdown: it removes its sandboxes.
      KILN_SANDBOX_PAUSE_AT_SHUTDOWN: 'off',
      // The image under test, as for the in-process test apps.
      ...(process.env.KILN_SANDBOX_IMAGE ? { KILN_SANDBOX_IMAGE: process.env.KILN_SANDBOX_IMAGE } : {}),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<number | string>((resolve) =>
    child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)),
  );
  return { child, stdout: () => out, stderr: () => err, exited };
}
