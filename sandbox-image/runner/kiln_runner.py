"""Kiln's in-container runner: one stateful Python interpreter per session, driven over stdin/stdout.

The host starts this file with `docker exec` (as the sandbox's own uid) and talks to it in frames:
a 4-byte big-endian length followed by UTF-8 JSON, in both directions. The runner is a supervisor:
the user's code runs in a separate worker process (so a crash, an out-of-memory kill or a hung
interpreter never takes the supervisor down), whose stdout/stderr are pipes the supervisor
streams back as they come, keeping head and tail when they are too long.

The user's code runs as the runner's uid, so the runner makes itself non-dumpable first: code of
that uid can then neither open /proc/<runner>/{mem,fd/*} nor ptrace it, and the worker holds no
copy of the runner's stdin/stdout, so the frames the host reads are the runner's alone. Each
result echoes the sha256 of the code the runner handed to the interpreter.

An exec's `env` (the workspace's secrets) is handed to the interpreter with its code and set in
its environment for that cell; the runner never keeps it, and the host masks the values in
whatever comes back.

A sandbox that may be paused (a gVisor checkpoint) cannot keep a `docker exec` alive across the
checkpoint: gVisor restores no exec'd process, nor anything holding its stdio. There the host
starts the runner with `--daemon` (as the sandbox's uid): it hardens itself, listens on the
abstract Unix socket SOCKET, leaves the exec's process tree and stdio, and the exec ends. The
host then speaks to it through `--attach`, a relay it starts as the keeper uid (which the user's
code cannot signal or trace) that moves bytes between its stdio and that socket. The relay's
end is the runner's detach, not its end: the interpreter and its variables stay, the sandbox is
checkpointed, and after a restore a new relay attaches. A connection after the first must prove
it is the host's before anything else: the runner's `ready` carries a nonce (signed with the key,
so the host knows it speaks to its runner) and the first frame back must be
{"op": "auth", "mac": hex(HMAC-SHA256(key, "attach:" + nonce))}; any other connection (code in
the sandbox can reach the socket too) is dropped.

Host -> runner: {"op": "exec", "id", "code", "timeout_ms", "max_output", "env"?} | {"op": "cancel", "id"}
                {"op": "put", "id", "path", "data", "mode"?} | {"op": "get", "id", "path"} | {"op": "ping", "id"}
                {"op": "sync_in", "id", "local": true} | {"op": "delete", "id", "path"}
                {"op": "sync_begin", "id"} | {"op": "sync_chunk", "id", "data"} | {"op": "sync_end", "id"}
Runner -> host: {"ev": "ready", "protocol"} | {"ev": "out", "id", "stream", "data"} | {"ev": "result", "id", ...}
                {"ev": "file", "id", "data", "size"} | {"ev": "ok", "id"} | {"ev": "error", "id", "message"}
"""

import base64
import ctypes
import errno
import hashlib
import hmac
import json
import os
import resource
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tarfile
import threading
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kiln_worker.py")
GRACE_S = 1.0  # after SIGINT, how long the code gets to unwind before it is killed
MAX_FILE = 32 * 1024 * 1024
WORKSPACE = "/workspace"
READ_ONLY = ("skills/builtin",)
OOM_FILE = "/sys/fs/cgroup/memory/memory.oom_control"
OOM_FILE_V2 = "/sys/fs/cgroup/memory.events"
PIDS_FILES = ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
# Under gVisor the container's cgroup holds the whole sandbox (its kernel too): reaching its
# memory limit would end the sandbox, not the code. The host then gives the sandbox some room
# above the workspace's limit and sets this; the runner ends the interpreter when the sandbox's
# memory (gVisor's own accounting, in its /proc/meminfo) passes it, like the OOM killer would.
MEMORY_LIMIT = int(os.environ.get("KILN_MEMORY_LIMIT_BYTES") or 0)
MEMORY_POLL_S = 0.01
# gVisor gives a killed process's memory back to its accounting some time after the kill (20 ms
# for 256 MB on an idle machine, 200 ms for 2 GB, longer under load). Until then the next cell
# would be killed for memory it never took: after a kill for memory the runner waits, this long
# at most, for the sandbox's memory to fall back to where it was before the killed cell ran.
RECLAIM_WAIT_S = 5.0
RECLAIM_SLACK = 8 * 1024 * 1024
# Native thread pools would make every cell look like it left threads behind; a sandbox has
# a CPU or two, so one BLAS/OpenMP thread costs little.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
THREAD_EXIT_POLLS = 20  # a thread the cell joined may still be leaving the kernel: look again, 10 ms apart

PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
# seccomp(2) itself, not prctl: only it takes SECCOMP_FILTER_FLAG_TSYNC, which puts the filter on
# every thread of the process at once (prctl filters only the calling thread).
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
# io_uring_setup, io_uring_enter, io_uring_register: the same numbers on every architecture
# (the unified table from 425 on); the x32 bit is masked so that ABI cannot go round it.
IO_URING_FIRST, IO_URING_LAST, X32_BIT = 425, 427, 0x40000000
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
# A daemon runner's socket (abstract: it goes with the sandbox's network namespace and its checkpoint).
SOCKET = b"\0kiln-runner"
# The version of the frames above, sent in `ready`: the host refuses a runner of another (a sandbox
# image older than its server). Raised with RUNNER_PROTOCOL in apps/api/src/sandbox/runner-client.ts.
PROTOCOL = 1
AUTH_WAIT_S = 5.0  # a connection that has not proved itself the host's by then is dropped
MAX_UNPROVEN = 4  # connections waiting to prove it at once; the oldest goes first
UNPROVEN_FRAME = 4096


def ready_frame(**extra):
    """What a runner says when a host may speak to it: the protocol version and its pid (and, to a
    host that must prove itself, the nonce to answer)."""
    return {"ev": "ready", "protocol": PROTOCOL, "pid": os.getpid(), **extra}


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def harden():
    """Before anything of the user's runs: no /proc or ptrace access to us, and no io_uring.

    Docker's default seccomp profile still allows io_uring (a large kernel surface that
    bypasses per-syscall filtering); seccomp filters stack and are inherited by every child,
    so this one, installed on top of the daemon's own default profile, denies it to the
    runner and to everything the user's code can start. It is installed with TSYNC, on every
    thread the runner has: a thread started before this (nothing should: the runner runs with
    `python3 -I -S`, so no site-packages .pth file runs in it) is filtered too, or the runner
    stops. Every step is required: a runner that cannot take them must not run code.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")
    ld_nr, and_k, jge_k, jgt_k, ret_k = 0x20, 0x54, 0x35, 0x25, 0x06
    program = [
        (ld_nr, 0, 0, 0),  # A = seccomp_data.nr
        (and_k, 0, 0, ~X32_BIT & 0xFFFFFFFF),
        (jge_k, 0, 2, IO_URING_FIRST),  # below the range: allow
        (jgt_k, 1, 0, IO_URING_LAST),  # above it: allow
        (ret_k, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        (ret_k, 0, 0, SECCOMP_RET_ALLOW),
    ]
    filters = (SockFilter * len(program))(*[SockFilter(*ins) for ins in program])
    fprog = SockFprog(len(program), filters)
    nr = SYS_SECCOMP.get(os.uname().machine)
    if nr is None:
        raise OSError(0, "no seccomp syscall number for this architecture: refusing to run code unfiltered")
    syscall = libc.syscall
    syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_void_p]
    # With TSYNC, a thread that cannot take the filter makes the call fail (its id is returned).
    if syscall(nr, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.addressof(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "installing the seccomp filter on every thread failed")


def read_first(paths):
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            continue
    return None


def explain(error):
    """Adds what the sandbox's limits have to do with an error, when they do."""
    if not error:
        return error
    msg = error.get("message", "")
    if error.get("type") == "BlockingIOError" and "Resource temporarily unavailable" in msg:
        error["message"] = f"{msg} (the sandbox's process limit of {process_limit()} was reached)"
    elif "[Errno 28]" in msg:
        error["message"] = f"{msg} (the sandbox's disk space is full)"
    elif "[Errno 27]" in msg:
        error["message"] = f"{msg} (the sandbox's file size limit was reached)"
    elif "[Errno 30]" in msg or ("[Errno 13]" in msg and outside_writable(msg)):
        # runc says EROFS for the read-only root; gVisor checks the file's permissions first (EACCES).
        error["message"] = f"{msg} (only /workspace, /tmp and the home directory are writable)"
    return error


def outside_writable(msg):
    """The path an OSError's message names is absolute and outside /workspace, /tmp and home."""
    _, sep, quoted = msg.partition(": '")
    path = quoted.rsplit("'", 1)[0] if sep else ""
    home = os.environ.get("HOME", "/home/sandbox")
    return path.startswith("/") and not any(path == d or path.startswith(d + "/") for d in (WORKSPACE, "/tmp", home))


def process_limit():
    """The cgroup's pid limit (runc), else RLIMIT_NPROC (gVisor, whose kernel enforces it per uid)."""
    limit = read_first(PIDS_FILES)
    if limit and limit != "max":
        return limit
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return str(soft) if soft != resource.RLIM_INFINITY else "?"


# What gVisor's accounting counts twice since the sandbox was last restored from a checkpoint:
# Debian's runsc (20221219) counts the restored memory again (MemTotal - MemFree doubles and stays
# so), which would have the watchdog kill an interpreter holding more than half its limit at its
# first cell after a resume. Measured when a host attaches again (Runner.read_unproven) and taken off.
RESTORE_OFFSET = [0]


def accounted():
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            fields = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if v.strip()}
        return (fields["MemTotal"] - fields["MemFree"]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def memory_used():
    """Bytes the sandbox uses now, by gVisor's accounting (MemTotal - MemFree); None if unreadable."""
    used = accounted()
    return None if used is None else max(0, used - RESTORE_OFFSET[0])


def oom_kills():
    """How many processes the kernel has killed for memory in this container so far."""
    for path in (OOM_FILE, OOM_FILE_V2):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except OSError:
            continue
    return None


def regular_files(root, skip=(".git",)):
    """(path, stat) of every regular file under root, never following a symbolic link.

    Walked by directory descriptors, each directory opened relative to its parent (O_NOFOLLOW),
    with an explicit stack, not recursion: the user's code decides how deep the tree is, and a deep
    one must neither end the runner (RecursionError) nor make every directory cost a lookup of its
    whole path (quadratic in the depth: 1,200 nested directories took seconds at every sync under
    gVisor). A parent's descriptor is closed once its last subdirectory is opened, so a chain holds
    one; a subtree that finds no descriptor left (the sandbox's open-files limit) is walked by path.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(root, flags)
    except OSError:
        return
    stack = [[fd, root, None]]
    try:
        while stack:
            frame = stack[-1]
            fd, top, subdirs = frame
            if subdirs is None:
                subdirs = frame[2] = []
                try:
                    entries = list(os.scandir(fd))  # listed at once: the listing's own descriptor is closed
                except OSError:
                    entries = []
                yield from files_among(entries, top, skip, subdirs)
            if not subdirs:
                stack.pop()
                os.close(fd)
                continue
            name = subdirs.pop()
            path = os.path.join(top, name)
            try:
                child = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE):
                    yield from regular_files_by_path(path, skip)
                continue
            if not subdirs:
                stack.pop()
                os.close(fd)
            stack.append([child, path, None])
    finally:
        for frame in stack:
            os.close(frame[0])


def regular_files_by_path(root, skip):
    """regular_files by path, for a subtree past the descriptors a walk may hold."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        subdirs = []
        yield from files_among(entries, top, skip, subdirs)
        stack.extend(os.path.join(top, name) for name in subdirs)


def files_among(entries, top, skip, subdirs):
    """(path, stat) of the regular files among a directory's entries; the names of its
    subdirectories (but those in skip) go to subdirs. Links are neither."""
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if e.name not in skip:
                    subdirs.append(e.name)
            elif e.is_file(follow_symlinks=False):
                yield os.path.join(top, e.name), e.stat(follow_symlinks=False)
        except OSError:
            continue


def copyable(member):
    """A tar member the workspace copy takes: a file or directory with a relative path that stays inside."""
    return (member.isfile() or member.isdir()) and not member.name.startswith(("/", "..")) and "/../" not in member.name


def manifest(root):
    """path -> (size, mtime_ns) of every regular file under root (symbolic links are never synced)."""
    return {os.path.relpath(path, root): (st.st_size, st.st_mtime_ns) for path, st in regular_files(root)}


def open_regular(path, flags, mode=0o644):
    """Opens a regular file and nothing else: a FIFO, device or directory the user's code put
    in its place would block the runner (a FIFO with no writer) or be no file at all."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file (it is {kind_of(st.st_mode)})")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def kind_of(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path, limit):
    fd, st = open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise ValueError(f"file larger than {limit} bytes")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"file larger than {limit} bytes")
    return data


class Capture:
    """Keeps the first `head` and last `tail` bytes of a stream and counts the rest."""

    def __init__(self, limit):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        """Returns the part of `data` that still fits in the head (to stream live)."""
        self.total += len(data)
        room = self.head_limit - len(self.head)
        live = data[:room] if room > 0 else b""
        self.head += live
        rest = data[len(live):]
        if rest:
            self.tail += rest
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]
        return live

    @property
    def truncated(self):
        return self.total > len(self.head) + len(self.tail)

    def text(self):
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        tail = self.tail.decode("utf-8", "replace")
        if not self.truncated:
            return head + tail
        omitted = self.total - len(self.head) - len(self.tail)
        return f"{head}\n... [{omitted} bytes omitted of {self.total}] ...\n{tail}"


class Runner:
    def __init__(self, listener=None):
        # Daemon mode (a listening socket): the host comes and goes through it; else stdin/stdout.
        self.listener = listener
        self.conn = None  # daemon mode: the host's connection, while one is attached
        self.unproven = {}  # daemon mode: fd -> [socket, buffer, deadline, nonce]
        self.attached_once = False
        self.out = None if listener else sys.stdout.buffer
        self.inp = None if listener else sys.stdin.buffer
        self.sel = selectors.DefaultSelector()
        self.worker = None
        self.restarted = False
        self.current = None  # the exec in progress
        # Daemon mode: requests of a host connection that another replaced (its replica died
        # mid-execution, another took the sandbox over): what they still send goes nowhere.
        self.orphans = set()
        self.inbuf = bytearray()
        self.synced = None  # manifest of /workspace as last agreed with the host
        # The host's key, from its first frame (before any code ran): every frame after is signed
        # with it. gVisor lets a process of the same uid open /proc/<runner>/fd/1 despite the
        # runner being non-dumpable, so the code could write frames: unsigned, they end the runner.
        self.key = None
        self.unpacking = None  # a streamed tar being unpacked (sync_begin .. sync_end)

    # ---- framing -------------------------------------------------------------------------
    def send(self, msg):
        rid = msg.get("id")
        if rid is not None and rid in self.orphans:
            if msg.get("ev") in ("result", "error"):
                self.orphans.discard(rid)
            return
        data = json.dumps(msg, separators=(",", ":")).encode("utf-8")
        # os.write until all is out: under gVisor a write to the host's pipe can be short even
        # on a blocking descriptor (a buffered write would then drop the rest of the frame).
        if self.key:
            data = hmac.digest(self.key, data, "sha256") + data
        rest = memoryview(struct.pack(">I", len(data)) + data)
        if self.listener:
            self.send_conn(self.conn, rest)
            return
        fd = self.out.fileno()
        while rest:
            try:
                rest = rest[os.write(fd, rest) :]
            except BlockingIOError:
                select.select([], [fd], [])

    def send_conn(self, conn, rest):
        """Daemon mode: a frame to a connection; one that is gone is the host's detach (frames then go nowhere)."""
        if conn is None:
            return
        try:
            while rest:
                rest = rest[conn.send(rest, socket.MSG_NOSIGNAL) :]
        except OSError:
            if conn is self.conn:
                self.detach()

    def frames(self, chunk, buf=None, limit=None):
        buf = self.inbuf if buf is None else buf
        buf += chunk
        while len(buf) >= 4:
            (n,) = struct.unpack(">I", buf[:4])
            if limit is not None and n > limit:
                raise ValueError("frame too large")
            if len(buf) < 4 + n:
                break
            body = bytes(buf[4 : 4 + n])
            del buf[: 4 + n]
            yield json.loads(body)

    # ---- daemon mode: the host attaches and detaches -------------------------------------
    def detach(self):
        """The host's relay is gone (the sandbox is about to be checkpointed, say): the interpreter stays."""
        if self.conn is None:
            return
        self.used_at_detach = accounted()
        try:
            self.sel.unregister(self.conn.fileno())
        except (KeyError, ValueError):
            pass
        self.conn.close()
        self.conn = None
        self.inbuf = bytearray()

    def accept(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if not self.attached_once:
            # The first connection is the host's own relay: nothing of the user's has run yet.
            self.attached_once = True
            self.take_host(conn)
            self.send(ready_frame())
            return
        if self.key is None:  # a host that never gave a key cannot prove anything
            conn.close()
            return
        if len(self.unproven) >= MAX_UNPROVEN:
            oldest = min(self.unproven, key=lambda fd: self.unproven[fd][2])
            self.drop_unproven(oldest)
        nonce = os.urandom(16).hex()
        conn.setblocking(True)
        self.unproven[conn.fileno()] = [conn, bytearray(), time.monotonic() + AUTH_WAIT_S, nonce]
        self.sel.register(conn.fileno(), selectors.EVENT_READ, "unproven")
        body = json.dumps(ready_frame(nonce=nonce), separators=(",", ":")).encode()
        data = hmac.digest(self.key, body, "sha256") + body
        self.send_conn(conn, memoryview(struct.pack(">I", len(data)) + data))

    def take_host(self, conn):
        self.detach()
        conn.setblocking(True)
        self.conn = conn
        self.inbuf = bytearray()
        self.sel.register(conn.fileno(), selectors.EVENT_READ, "host")

    def drop_unproven(self, fd):
        entry = self.unproven.pop(fd, None)
        if entry:
            self.sel.unregister(fd)
            entry[0].close()

    def read_unproven(self, fd):
        conn, buf, _, nonce = self.unproven[fd]
        try:
            chunk = conn.recv(UNPROVEN_FRAME)
            msg = next(self.frames(chunk, buf, UNPROVEN_FRAME), None) if chunk else False
        except (OSError, ValueError):
            msg = False
        if msg is None:
            return  # not a whole frame yet
        want = hmac.new(self.key, b"attach:" + nonce.encode(), "sha256").hexdigest()
        ok = isinstance(msg, dict) and msg.get("op") == "auth" and isinstance(msg.get("mac"), str)
        if not ok or not hmac.compare_digest(msg["mac"], want):
            self.drop_unproven(fd)
            return
        self.unproven.pop(fd)
        self.sel.unregister(fd)
        # A host attaching again: after a restore, what the accounting counts on top of what was
        # used when it let go is the restore's double count (nothing of the user's ran meanwhile).
        # A cell the previous host started runs on (its variables stay), but its output and
        # result were that host's: the new one never asked for them. (Then this is no restore:
        # a restore only follows a pause, which waits for the cell; what the cell allocated is its own.)
        if self.current:
            self.orphans.add(self.current["id"])
        else:
            now, before = accounted(), getattr(self, "used_at_detach", None)
            if now is not None and before is not None:
                RESTORE_OFFSET[0] += max(0, now - before)
        self.take_host(conn)
        # What the host sent right behind its proof is its first request.
        for msg in self.frames(bytes(buf)):
            self.handle(msg)

    def expire_unproven(self):
        now = time.monotonic()
        for fd in [fd for fd, e in self.unproven.items() if e[2] <= now]:
            self.drop_unproven(fd)

    # ---- worker lifecycle ----------------------------------------------------------------
    def start_worker(self):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ, KILN_REQ_FD=str(req_r), KILN_RES_FD=str(res_w), **SINGLE_THREADED)
        for attempt in range(50):
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-u", WORKER],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(req_r, res_w),
                    env=env,
                    start_new_session=True,
                )
                break
            except BlockingIOError:  # pids still being freed after a kill
                time.sleep(0.02 * (attempt + 1))
        else:
            raise RuntimeError("could not start the interpreter: no free processes")
        os.close(req_r)
        os.close(res_w)
        self.worker = {"proc": proc, "req": req_w, "res": res_r, "resbuf": bytearray()}
        for fd, name in ((proc.stdout.fileno(), "stdout"), (proc.stderr.fileno(), "stderr"), (res_r, "res")):
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, name)

    def stop_worker(self):
        """Kills the interpreter and everything the user's code left running (same uid, not us)."""
        w = self.worker
        if not w:
            return
        for fd in (w["proc"].stdout.fileno(), w["proc"].stderr.fileno(), w["res"]):
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        try:
            if os.getuid() != 0:
                os.kill(-1, signal.SIGKILL)  # every process of our uid except this one
            else:  # never sweep as root: that would be every process on the machine
                os.killpg(w["proc"].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        w["proc"].wait()
        for f in (w["proc"].stdout, w["proc"].stderr):
            f.close()
        for fd in (w["req"], w["res"]):
            try:
                os.close(fd)
            except OSError:
                pass
        self.worker = None

    def restart_worker(self, reclaim=False):
        """A fresh interpreter; with reclaim (after a kill for memory), once gVisor has the memory back."""
        self.stop_worker()
        if reclaim:
            self.await_reclaim(self.current["memory_before"])
        self.start_worker()
        self.restarted = True

    # ---- requests ------------------------------------------------------------------------
    def handle(self, msg):
        op = msg.get("op")
        rid = msg.get("id")
        try:
            if op == "key":
                # Only the first: code that opens the runner's stdin could send its own later.
                if self.key is None:
                    self.key = base64.b64decode(msg["key"])
            elif op == "exec":
                self.begin_exec(msg)
            elif op == "cancel":
                if self.current and self.current["id"] == rid:
                    self.interrupt("cancelled")
            elif op == "put":
                self.put_file(msg)
            elif op == "get":
                self.get_file(msg)
            elif op == "sync_in":
                self.sync_in(msg)
            elif op == "sync_begin":
                self.sync_begin(msg)
            elif op == "sync_chunk":
                self.sync_chunk(msg)
            elif op == "sync_end":
                self.sync_end(msg)
            elif op == "delete":
                self.delete_file(msg)
            elif op == "ping":
                self.send({"ev": "ok", "id": rid, "busy": self.current is not None})
            else:
                self.send({"ev": "error", "id": rid, "message": f"unknown op {op!r}"})
        except Exception as e:  # a bad request must never kill the runner
            self.send({"ev": "error", "id": rid, "message": f"{type(e).__name__}: {e}"})

    def begin_exec(self, msg):
        if self.current:
            self.send({"ev": "error", "id": msg["id"], "message": "busy: an execution is already running"})
            return
        env = msg.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env must map names to strings")
        limit = int(msg.get("max_output") or 65536)
        timeout = max(0.001, float(msg.get("timeout_ms") or 60000) / 1000)
        self.current = {
            "id": msg["id"],
            "started": time.monotonic(),
            "deadline": time.monotonic() + timeout,
            "timeout": timeout,
            "stdout": Capture(limit),
            "stderr": Capture(limit),
            "interrupted": None,  # why we sent SIGINT: "timeout" | "cancelled"
            "kill_at": None,
            "oom_before": oom_kills(),
            "memory_before": memory_used() if MEMORY_LIMIT else None,
            "sync": bool(msg.get("sync")),
            "sync_limit": msg.get("sync_limit"),
            "sync_max_files": msg.get("sync_max_files"),
        }
        code = msg.get("code", "")
        # The host accepts the result only if this matches the code it sent: what was
        # approved is what the interpreter is handed.
        self.current["code_sha256"] = hashlib.sha256(code.encode("utf-8")).hexdigest()
        req = json.dumps({"code": code, "env": env}).encode("utf-8") + b"\n"
        os.write(self.worker["req"], req)

    def interrupt(self, why):
        cur = self.current
        if cur["interrupted"]:
            return
        cur["interrupted"] = why
        cur["kill_at"] = time.monotonic() + GRACE_S
        try:
            os.killpg(self.worker["proc"].pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def finish(self, result):
        cur = self.current
        self.drain_output()
        result.update(
            {
                "ev": "result",
                "id": cur["id"],
                "duration_ms": round((time.monotonic() - cur["started"]) * 1000, 2),
                "stdout": cur["stdout"].text(),
                "stderr": cur["stderr"].text(),
                "stdout_bytes": cur["stdout"].total,
                "stderr_bytes": cur["stderr"].total,
                "truncated": cur["stdout"].truncated or cur["stderr"].truncated,
                "restarted": self.restarted,
                "code_sha256": cur["code_sha256"],
            }
        )
        if cur.get("sync") and self.synced is not None:
            result["changes"] = self.changes(int(cur.get("sync_limit") or 16 * 1024 * 1024), int(cur.get("sync_max_files") or 0))
        self.restarted = False
        self.current = None
        self.send(result)

    def worker_died(self):
        """The interpreter exited mid-execution: out of memory, a crash, or os._exit."""
        cur = self.current
        proc = self.worker["proc"]
        self.drain_output()
        code = proc.wait()
        oom_after = oom_kills()
        oom = code == -signal.SIGKILL and (
            cur.get("over_memory") or cur["oom_before"] is None or oom_after is None or oom_after > cur["oom_before"]
        )
        self.restart_worker(reclaim=bool(oom and MEMORY_LIMIT))
        if cur["interrupted"] == "timeout":
            err = self.timeout_error(killed=True)
        elif cur["interrupted"] == "cancelled":
            err = {"type": "Cancelled", "message": "execution cancelled; the interpreter was restarted and its variables are lost"}
        elif oom:
            err = {"type": "OutOfMemory", "message": "the code ran out of memory and was killed; the interpreter was restarted and its variables are lost"}
        elif code < 0:
            err = {"type": "Crashed", "message": f"the interpreter was killed by signal {-code}; it was restarted and its variables are lost"}
        else:
            err = {"type": "Exited", "message": f"the interpreter exited with code {code}; it was restarted and its variables are lost"}
        self.finish({"ok": False, "exit_code": code if code >= 0 else 128 - code, "error": err, "artifacts": []})

    def await_reclaim(self, before):
        """Waits (bounded) until the sandbox's memory is back to what it was before the killed cell."""
        target = MEMORY_LIMIT if before is None else min(MEMORY_LIMIT, before + RECLAIM_SLACK)
        give_up = time.monotonic() + RECLAIM_WAIT_S
        while time.monotonic() < give_up:
            used = memory_used()
            if used is None or used <= target:
                return
            time.sleep(MEMORY_POLL_S)

    def timeout_error(self, killed):
        t = self.current["timeout"]
        if killed:
            return {"type": "Timeout", "message": f"execution exceeded the {t:g} s time limit and did not stop when interrupted; the interpreter was restarted and its variables are lost"}
        return {"type": "Timeout", "message": f"execution exceeded the {t:g} s time limit and was interrupted; variables are kept"}

    def threads_left(self):
        """How many threads besides its main one the interpreter still has after a cell."""
        task_dir = f"/proc/{self.worker['proc'].pid}/task"
        for _ in range(THREAD_EXIT_POLLS):
            try:
                extra = len(os.listdir(task_dir)) - 1
            except OSError:
                return 0
            if extra <= 0:
                return 0
            time.sleep(0.01)
        return extra

    def on_worker_result(self, res):
        cur = self.current
        if not cur:
            return
        # A thread the cell left behind keeps running between cells, where it could read the
        # next cell's code off the request pipe or answer for it: it ends with its cell, as the
        # cell's processes do, and that takes the interpreter with it.
        extra = self.threads_left()
        if extra:
            self.drain_output()
            self.restart_worker()
            note = f"[kiln] the code left {extra} thread(s) running; a cell's threads end with it, so the interpreter was restarted and its variables are lost\n"
            cur["stderr"].add(note.encode("utf-8"))
            self.send({"ev": "out", "id": cur["id"], "stream": "stderr", "data": note})
        res["error"] = explain(res.get("error"))
        why = cur["interrupted"]
        if why and res.get("error", {}).get("type") == "KeyboardInterrupt":
            if why == "timeout":
                res["error"] = self.timeout_error(killed=False)
            else:
                res["error"] = {"type": "Cancelled", "message": "execution cancelled; variables are kept"}
            res["exit_code"] = 124 if why == "timeout" else 130
        self.finish(res)

    # ---- files ---------------------------------------------------------------------------
    def put_file(self, msg):
        data = base64.b64decode(msg["data"])
        if len(data) > MAX_FILE:
            raise ValueError(f"file larger than {MAX_FILE} bytes")
        path = msg["path"]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd, _ = open_regular(path, os.O_WRONLY | os.O_CREAT)
        with os.fdopen(fd, "wb") as f:
            f.truncate(0)
            f.write(data)
        if msg.get("mode") is not None:
            os.chmod(path, int(msg["mode"]) & 0o777)
        self.note_synced(path)
        self.send({"ev": "ok", "id": msg["id"], "size": len(data)})

    def get_file(self, msg):
        data = read_regular(msg["path"], MAX_FILE)
        self.send({"ev": "file", "id": msg["id"], "size": len(data), "data": base64.b64encode(data).decode("ascii")})

    # ---- workspace sync -------------------------------------------------------------------
    def sync_in(self, msg):
        """The host has copied the working tree into /workspace itself (a directory of its own,
        bind-mounted there): there is nothing to unpack, only the manifest to take."""
        if not msg.get("local"):
            raise ValueError("sync_in copies nothing: the host sends a tar with sync_begin, sync_chunk and sync_end")
        self.synced_now(msg["id"])

    def sync_begin(self, msg):
        """Starts unpacking a tar of the workspace that comes in sync_chunk frames, so that neither
        the host nor this runner ever holds all of it. A thread reads it from a pipe the chunks
        are written to; after a failure it keeps reading (and dropping) them, so a write never blocks."""
        if self.unpacking:
            raise ValueError("a workspace copy is already under way")
        r, w = os.pipe()
        state = {"w": w, "error": None}

        def unpack():
            f = os.fdopen(r, "rb")
            try:
                with tarfile.open(fileobj=f, mode="r|") as tar:
                    for m in tar:
                        if copyable(m):
                            tar.extract(m, WORKSPACE, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(m, WORKSPACE)
            except Exception as e:
                state["error"] = f"{type(e).__name__}: {e}"
            finally:
                while f.read(1 << 16):
                    pass
                f.close()

        state["thread"] = threading.Thread(target=unpack, daemon=True)
        state["thread"].start()
        self.unpacking = state
        self.send({"ev": "ok", "id": msg["id"]})

    def sync_chunk(self, msg):
        if not self.unpacking:
            raise ValueError("no workspace copy under way")
        view = memoryview(base64.b64decode(msg["data"]))
        while view:
            view = view[os.write(self.unpacking["w"], view) :]
        self.send({"ev": "ok", "id": msg["id"]})

    def sync_end(self, msg):
        state, self.unpacking = self.unpacking, None
        if not state:
            raise ValueError("no workspace copy under way")
        os.close(state["w"])
        state["thread"].join()
        if state["error"]:
            raise OSError(state["error"])
        self.synced_now(msg["id"])

    def synced_now(self, rid):
        """/workspace holds the host's copy of the workspace: remember it as synced."""
        for rel in READ_ONLY:  # a hint only: the host refuses changes there anyway
            for path, _ in regular_files(os.path.join(WORKSPACE, rel), skip=()):
                os.chmod(path, 0o444)
        self.synced = manifest(WORKSPACE)
        self.send({"ev": "ok", "id": rid, "files": len(self.synced)})

    def delete_file(self, msg):
        path = msg["path"]
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, 0o644)
            os.remove(path)
        self.note_synced(path)
        self.send({"ev": "ok", "id": msg["id"]})

    def note_synced(self, path):
        if self.synced is None or not path.startswith(WORKSPACE + "/"):
            return
        rel = os.path.relpath(path, WORKSPACE)
        try:
            st = os.lstat(path)
            self.synced[rel] = (st.st_size, st.st_mtime_ns)
        except OSError:
            self.synced.pop(rel, None)

    def changes(self, limit, max_files=0):
        """What the code changed in /workspace since the last sync: contents of changed files, deleted paths.

        Collecting stops at the first file past the step's byte limit or its file-count cap
        (`over`): the host refuses such a step whole and replaces the sandbox, so reading (and
        sending) the rest would only cost time and memory.
        """
        now = manifest(WORKSPACE)
        self.synced, before = now, self.synced
        deleted = sorted(set(before) - set(now))
        changed, skipped, total = [], [], 0
        if max_files and len(deleted) > max_files:
            return {"changed": [], "deleted": deleted[: max_files + 1], "skipped": [], "over": "files"}
        for rel, sig in sorted(now.items()):
            if before.get(rel) == sig:
                continue
            if max_files and len(changed) + len(deleted) >= max_files:
                return {"changed": changed, "deleted": deleted, "skipped": skipped, "over": "files"}
            if total + sig[0] > limit:
                return {"changed": changed, "deleted": deleted, "skipped": skipped, "over": "bytes"}
            try:
                data = read_regular(os.path.join(WORKSPACE, rel), limit - total)
            except (OSError, ValueError) as e:
                skipped.append({"path": rel, "reason": str(e)})
                continue
            total += len(data)
            changed.append({"path": rel, "data": base64.b64encode(data).decode("ascii")})
        return {"changed": changed, "deleted": deleted, "skipped": skipped}

    # ---- I/O loop ------------------------------------------------------------------------
    def read_stream(self, name):
        """Reads what is available on the worker's stdout/stderr: 'data', 'empty' or 'eof'."""
        fd = getattr(self.worker["proc"], name).fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return "empty"
        except (OSError, ValueError):
            return "eof"
        if not data:
            return "eof"
        cur = self.current
        if cur:
            live = cur[name].add(data)
            if live:
                self.send({"ev": "out", "id": cur["id"], "stream": name, "data": live.decode("utf-8", "replace")})
        return "data"

    def drain_output(self):
        """Everything the worker wrote before it reported a result is already in the pipes."""
        if not self.worker:
            return
        for name in ("stdout", "stderr"):
            while self.read_stream(name) == "data":
                pass

    def read_results(self):
        w = self.worker
        try:
            data = os.read(w["res"], 65536)
        except BlockingIOError:
            return
        if not data:
            if self.current:
                self.worker_died()
            else:
                w["proc"].wait()
                self.restart_worker()
            return
        w["resbuf"] += data
        while b"\n" in w["resbuf"]:
            line, _, rest = bytes(w["resbuf"]).partition(b"\n")
            w["resbuf"] = bytearray(rest)
            self.on_worker_result(json.loads(line))

    def run(self):
        self.start_worker()
        self.restarted = False
        if self.listener:
            self.sel.register(self.listener.fileno(), selectors.EVENT_READ, "listen")
        else:
            os.set_blocking(self.inp.fileno(), False)
            self.sel.register(self.inp.fileno(), selectors.EVENT_READ, "host")
            self.send(ready_frame())
        while True:
            timeout = None
            if self.unproven:
                self.expire_unproven()
                timeout = max(0.0, min(e[2] for e in self.unproven.values()) - time.monotonic())
            cur = self.current
            if cur:
                now = time.monotonic()
                if not cur["interrupted"] and now >= cur["deadline"]:
                    self.interrupt("timeout")
                elif cur["kill_at"] and now >= cur["kill_at"]:
                    os.killpg(self.worker["proc"].pid, signal.SIGKILL)
                    cur["kill_at"] = None
                if MEMORY_LIMIT and not cur.get("over_memory"):
                    used = memory_used()
                    if used is not None and used > MEMORY_LIMIT:
                        cur["over_memory"] = True
                        try:
                            os.killpg(self.worker["proc"].pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                wake = cur["kill_at"] if cur["interrupted"] else cur["deadline"]
                timeout = max(0.0, wake - time.monotonic()) if wake else 0.05
                if MEMORY_LIMIT:
                    timeout = min(timeout, MEMORY_POLL_S)
            for key, _ in self.sel.select(timeout):
                if key.data == "listen":
                    self.accept()
                elif key.data == "unproven":
                    if key.fd in self.unproven:
                        self.read_unproven(key.fd)
                elif key.data == "host":
                    try:
                        chunk = os.read(key.fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        if self.listener:  # the relay ended: detached, the interpreter stays
                            self.detach()
                            continue
                        self.stop_worker()  # the host went away: leave nothing running
                        return
                    for msg in self.frames(chunk):
                        self.handle(msg)
                elif key.data in ("stdout", "stderr"):
                    if self.worker and self.read_stream(key.data) == "eof":
                        self.sel.unregister(key.fd)
                elif key.data == "res" and self.worker:
                    self.read_results()


def daemonize():
    """`--daemon`: listens first (so the relay that follows finds the socket), then leaves the exec."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET)  # a second runner in one sandbox fails here, and says so
    listener.listen(MAX_UNPROVEN + 1)
    # The host attaches a relay only after reading this: a runner from before daemon mode (an old
    # template image) never prints it, and the host then speaks to it as it always did.
    os.write(1, b"KILN_RUNNER_DAEMON\n")
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    # Nothing of the exec's stays open: gVisor could not restore the sandbox with it.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return listener


def relay():
    """`--attach`: the host's stdin to the daemon runner's socket and its answers to stdout, until either ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(SOCKET)

    def down():
        while True:
            data = conn.recv(1 << 16)
            if not data:
                os._exit(0)
            out = memoryview(data)
            while out:
                out = out[os.write(1, out) :]

    threading.Thread(target=down, daemon=True).start()
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            conn.shutdown(socket.SHUT_WR)
            threading.Event().wait(1.0)  # the answers in flight, then out
            os._exit(0)
        conn.sendall(data)


if __name__ == "__main__":
    if "--attach" in sys.argv[1:]:
        relay()
    harden()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    Runner(daemonize() if "--daemon" in sys.argv[1:] else None).run()
