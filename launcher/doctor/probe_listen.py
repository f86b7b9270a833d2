"""The doctor's listener on the master: binds the master port, so the probes can try to reach it.

Sent as the source of ``python -c`` (stdlib only) with the port as its argument. It
binds every address of the master (dual-stack where the host has IPv6, as the ranks'
store does), prints ``zerorun-doctor-listen ok`` or ``zerorun-doctor-listen busy ERRNO
TEXT`` (the port is taken: a launch would fail there too), then accepts and closes
connections until its stdin closes or 60 s pass.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import sys
import time

TAG = "zerorun-doctor-listen"
LIFETIME = 60.0


def bind(port: int) -> socket.socket:
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        host = "::"
    except OSError:
        s, host = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


def serve(s: socket.socket) -> None:
    deadline = time.monotonic() + LIFETIME
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s, sys.stdin], [], [], 1.0)
        if sys.stdin in ready and not sys.stdin.buffer.read1(4096):  # the doctor is done
            return
        if s in ready:
            with contextlib.suppress(OSError):
                s.accept()[0].close()


def main(port: int) -> None:
    try:
        s = bind(port)
    except OSError as err:
        print(TAG, "busy", errno.errorcode.get(err.errno or 0, "error"), err.strerror, flush=True)
        return
    print(TAG, "ok", flush=True)
    with s:
        serve(s)


if __name__ == "__main__":
    main(int(sys.argv[1]))
