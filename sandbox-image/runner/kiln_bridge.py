"""Kiln's egress bridge inside a gVisor sandbox with network allowlist.

Such a sandbox has no network at all (gVisor's `--network=none`: a loopback interface and
nothing else). The host hands it one Unix socket, /run/kiln-egress/egress.sock, whose other end
is Kiln's bridge to the egress proxy; this process is the sandbox's main process (as the keeper
uid, which the user's code cannot signal) and makes that socket reachable as the proxy address
the interpreter is given, 127.0.0.1:3128. It moves bytes and nothing else: identity and every
decision are the proxy's (the sandbox's credentials, checked there, and the address the host's
bridge vouches for).
"""

import os
import signal
import socket
import sys
import threading

SOCKET = "/run/kiln-egress/egress.sock"
LISTEN = ("127.0.0.1", 3128)
MAX_CONNECTIONS = 64  # as many as the proxy accepts from one sandbox
CHUNK = 64 * 1024

slots = threading.BoundedSemaphore(MAX_CONNECTIONS)


def pump(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # The other direction may still be talking (a request sent, its answer coming): half-close.
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def serve(client):
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(SOCKET)
        except OSError:
            upstream.close()
            client.close()
            return
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        upstream.close()
        client.close()
    finally:
        slots.release()


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(LISTEN)
    server.listen(MAX_CONNECTIONS)
    while True:
        client, _ = server.accept()
        # Past the limit a connection waits in the backlog until one ends: never more threads.
        slots.acquire()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


if __name__ == "__main__":
    try:
        main()
    except OSError as err:
        # Without its bridge the sandbox simply has no egress; the container keeps running.
        sys.stderr.write(f"kiln_bridge: {err}\n")
        signal.pause()
