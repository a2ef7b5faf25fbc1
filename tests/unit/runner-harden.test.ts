import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const RUNNER_DIR = fileURLToPath(new URL('../../sandbox-image/runner', import.meta.url));

/**
 * The runner's harden(), run on this machine's kernel in a Python process of its own: the seccomp
 * filter must reach a thread that was already running when it was installed (TSYNC), as a thread
 * left behind by code that ran before the runner hardened itself would be.
 */
describe('runner hardening (sandbox-image/runner/kiln_runner.py)', () => {
  it('denies io_uring to every thread, one started before harden() included', () => {
    const script = `
import ctypes, json, sys, threading
sys.path.insert(0, sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def io_uring_setup():
    # EPERM from the filter; EFAULT (bad params pointer) when io_uring is reachable.
    return ctypes.get_errno() if libc.syscall(425, 1, None) == -1 else 0
started, hardened, out = threading.Event(), threading.Event(), {}
def early():
    started.set(); hardened.wait(); out["early_thread"] = io_uring_setup()
t = threading.Thread(target=early); t.start(); started.wait()
out["before"] = io_uring_setup()
import kiln_runner
kiln_runner.harden()
hardened.set(); t.join()
out["main_thread"] = io_uring_setup()
print(json.dumps(out))
`;
    const out = JSON.parse(execFileSync('python3', ['-I', '-S', '-c', script, RUNNER_DIR], { encoding: 'utf8' }));
    const EPERM = 1;
    const EFAULT = 14;
    // This machine's kernel has io_uring (else the check proves nothing).
    expect(out.before).toBe(EFAULT);
    expect(out).toEqual({ before: EFAULT, early_thread: EPERM, main_thread: EPERM });
  });
});
