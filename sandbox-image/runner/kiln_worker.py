"""The interpreter process behind kiln_runner.py: runs each cell in one persistent namespace.

Requests arrive as JSON lines on KILN_REQ_FD, results leave as JSON lines on KILN_RES_FD;
stdout and stderr are the pipes the runner streams back. Like a notebook, the value of a
trailing expression is printed, and open matplotlib figures come back as PNG artifacts.
"""

import ast
import base64
import ctypes
import io
import json
import os
import signal
import sys
import time
import traceback

REQ = os.fdopen(int(os.environ.pop("KILN_REQ_FD")), "rb", buffering=0)
RES_FD = int(os.environ.pop("KILN_RES_FD"))
PID = os.getpid()
NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}
SECRETS = set()  # the names the last cell's env set
PR_SET_CHILD_SUBREAPER = 36


def set_env(env):
    """The cell's secrets become its environment (and its subprocesses'): the ones set for the
    previous cell and not given now are removed, so a deleted secret is gone at the next cell."""
    for name in SECRETS - set(env):
        os.environ.pop(name, None)
    SECRETS.clear()
    for name, value in env.items():
        os.environ[name] = value
        SECRETS.add(name)


def send(obj):
    data = memoryview(json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n")
    while data:
        data = data[os.write(RES_FD, data) :]


def figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    out = []
    try:
        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png", dpi=100, bbox_inches="tight")
            out.append({"name": f"figure-{num}.png", "mime": "image/png", "base64": base64.b64encode(buf.getvalue()).decode("ascii")})
    finally:
        plt.close("all")
    return out


def error_of(e, tb):
    lines = traceback.format_exception(type(e), e, tb)
    text = "".join(lines)
    sys.stderr.write(text)
    return {"type": type(e).__name__, "message": str(e), "traceback": text}


def run(code):
    exit_code, error = 0, None
    try:
        try:
            tree = ast.parse(code, "<cell>", "exec")
        except SyntaxError as e:
            return 1, error_of(e, None)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), NAMESPACE)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), NAMESPACE)
            if value is not None:
                print(repr(value))
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if exit_code:
            error = {"type": "SystemExit", "message": f"exit code {exit_code}"}
    except KeyboardInterrupt:
        exit_code, error = 130, {"type": "KeyboardInterrupt", "message": "interrupted"}
    except BaseException as e:  # noqa: BLE001 - the user's error is the result
        # Skip this module's own frame so the traceback starts in the user's cell.
        exit_code, error = 1, error_of(e, e.__traceback__.tb_next if e.__traceback__ else None)
    finally:
        if os.getpid() != PID:  # a process the user forked must never report a result
            os._exit(0)
    return exit_code, error


def leftovers():
    """Every other process of our uid except the runner (our parent), with its parent pid."""
    uid, keep = str(os.getuid()), {PID, os.getppid()}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            found.append((int(name), int(fields.get("PPid", "0"))))
    return found


def end_cell_processes():
    """A cell's subprocesses end with it (a fork bomb's too), and none is left, not even a zombie,
    when its result leaves.

    Each round kills what it finds and waits for those that are ours. Where the kernel lets this
    process be its cells' subreaper (main; runc), every orphan is, once its parent is killed, ours
    by the next round; where it does not (gVisor's prctl refuses it), the container's init reaps
    orphans, and the rounds poll until it has."""
    if os.getuid() == 0:  # never as root: that would be the host's processes
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        procs = leftovers()
        if not procs:
            break
        for pid, _ in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ours = [pid for pid, ppid in procs if ppid == PID]
        for pid in ours:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        if not ours:
            time.sleep(0.002)  # dying or zombies of someone else's to reap: look again shortly
    while True:  # children that had already exited on their own
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def main():
    # The runner ignores SIGINT and ignored signals survive exec: take it back, so an
    # interrupt (timeout, cancel) raises KeyboardInterrupt in the user's code.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Orphans of a cell (a fork bomb's grandchildren) become ours, not the container init's, so
    # end_cell_processes reaps them itself (gVisor refuses this: there it waits for init to).
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # under memory pressure, the kernel takes this process, not the runner
    except OSError:
        pass
    while True:
        try:
            line = REQ.readline()
            if not line:
                return
            req = json.loads(line)
            set_env(req.get("env") or {})
            exit_code, error = run(req["code"])
            end_cell_processes()
            sys.stdout.flush()
            sys.stderr.flush()
            artifacts = figures()
            send({"ok": error is None, "exit_code": exit_code, "error": error, "artifacts": artifacts})
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between cells


if __name__ == "__main__":
    main()
