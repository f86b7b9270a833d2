"""The doctor's probe: what one host can say about itself, in one JSON line.

Sent as the source of ``python -c`` (stdlib only, never imports torch: it must answer
in well under a second), with one JSON argument ``{"master", "port", "cwd", "connect",
"timeout", "retry", "paths"}``. It prints ``zerorun-doctor {...}``: versions (Python, zerorun, torch and
the CUDA it was built for, read from files, NCCL's wheel, the driver), GPU device
files, /dev/shm, ``ulimit -l``/``-n``, the free space under each of ``paths`` (the save
dir, the config's NVMe paths), its clock, the master as this host resolves it,
the interface and address of its route to the master and that interface's MTU, and a
TCP connect to the master's port. The only traffic it sends goes to the master.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib.metadata as metadata
import importlib.util
import json
import os
import platform
import re
import resource
import socket
import struct
import sys
import time

TAG = "zerorun-doctor"
_SIOCGIFADDR = 0x8915


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda() -> str | None:
    """The CUDA torch was built for, read from torch/version.py without importing torch."""
    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.submodule_search_locations:
            with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
                found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
                return found.group(1) if found else None
    return None


NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl")
"""The names torch's CUDA wheels depend on: looked up by name (reading every installed
package's metadata costs a tenth of a second in a large environment)."""


def nccl_wheel() -> str | None:
    return next((v for v in map(_version, NCCL_WHEELS) if v), None)


def driver() -> str | None:
    with contextlib.suppress(OSError), open("/proc/driver/nvidia/version") as f:
        found = re.search(r"Kernel Module\s+(\S+)", f.read())
        return found.group(1) if found else None
    return None


def versions() -> dict[str, object]:
    return {"python": platform.python_version(), "python_path": sys.executable, "zerorun": _version("zerorun"),
            "torch": _version("torch"), "cuda": torch_cuda(), "nccl": nccl_wheel(), "driver": driver()}


def limits() -> dict[str, object]:
    shm = None
    with contextlib.suppress(OSError):
        st = os.statvfs("/dev/shm")
        shm = {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    soft = lambda which: resource.getrlimit(which)[0]  # noqa: E731
    return {"shm": shm, "memlock": soft(resource.RLIMIT_MEMLOCK), "nofile": soft(resource.RLIMIT_NOFILE),
            "unlimited": resource.RLIM_INFINITY,
            "gpus": len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])}


def interfaces() -> dict[str, list[str]]:
    """Every interface with its addresses (IPv4 through an ioctl, IPv6 from /proc/net/if_inet6)."""
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        import fcntl

        for _, name in socket.if_nameindex():
            found[name] = []
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                found[name].append(socket.inet_ntoa(packed[20:24]))
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as f:
        for line in f:
            hexaddr, *_, name = line.split()
            addr = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexaddr))
            found.setdefault(name, []).append(addr)
    return found


def mtu(name: str) -> int | None:
    with contextlib.suppress(OSError, ValueError), open(f"/sys/class/net/{name}/mtu") as f:
        return int(f.read())
    return None


def route(addr: str, port: int, ifaces: dict[str, list[str]]) -> dict[str, object]:
    """The source address of the route to ``addr`` (a UDP connect: no packet is sent) and its interface."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))
            src = str(s.getsockname()[0])
    except OSError as err:
        return {"error": f"{errno.errorcode.get(err.errno or 0, 'error')}: {err.strerror}"}
    name = next((n for n, addrs in ifaces.items() if src in addrs), None)
    return {"source": src, "interface": name, "mtu": mtu(name) if name else None}


def connect_once(addr: str, port: int, timeout: float) -> dict[str, object]:
    """One TCP connect to the master's port: ok, refused, timeout, or the error's name."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return {"result": "ok"}
    except TimeoutError:
        return {"result": "timeout"}
    except OSError as err:
        name = errno.errorcode.get(err.errno or 0, "error")
        result = {errno.ECONNREFUSED: "refused", errno.ENETUNREACH: "no_route", errno.EHOSTUNREACH: "no_route"}
        return {"result": result.get(err.errno or 0, name), "error": f"{name}: {err.strerror}"}


def connect(addr: str, port: int, timeout: float, retry: float) -> dict[str, object]:
    """Connect, retrying a refusal for ``retry`` seconds: the doctor's listener starts alongside the probes."""
    start = time.monotonic()
    while True:
        out = connect_once(addr, port, timeout)
        if out["result"] != "refused" or time.monotonic() - start > retry:
            return {**out, "seconds": time.monotonic() - start}
        time.sleep(0.05)


def network(master: str, port: int, do_connect: bool, timeout: float, retry: float) -> dict[str, object]:
    try:
        resolved = sorted({str(ai[4][0]) for ai in socket.getaddrinfo(master, port, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError) as err:
        return {"resolved": [], "error": f"cannot resolve {master!r}: {err}"}
    ifaces = interfaces()
    addr = next((a for a in resolved if ":" not in a), resolved[0])  # ranks use IPv4 first, as getaddrinfo's users do
    out: dict[str, object] = {"resolved": resolved, "address": addr, "route": route(addr, port, ifaces),
                              "interfaces": ifaces,
                              "env": {k: os.environ[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                                      if k in os.environ}}
    if do_connect:
        out["connect"] = connect(addr, port, timeout, retry)
    return out


def disk(path: str) -> dict[str, object]:
    """Free space and writability where ``path`` is, or would be created (its nearest existing folder)."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    try:
        st = os.statvfs(here)
    except OSError as err:
        return {"path": path, "error": str(err)}
    return {"path": path, "exists": os.path.isdir(path), "checked": here, "writable": os.path.isdir(here) and os.access(here, os.W_OK),
            "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}


def main(arg: str) -> None:
    opts = json.loads(arg)
    facts: dict[str, object] = {"hostname": socket.gethostname(), "cwd_ok": os.path.isdir(opts["cwd"]),
                                "versions": versions(), "limits": limits(),
                                "disks": {label: disk(p) for label, p in opts.get("paths", {}).items()}}
    facts["network"] = network(opts["master"], int(opts["port"]), bool(opts["connect"]), float(opts["timeout"]),
                               float(opts.get("retry", 0.0)))
    facts["time"] = time.time()
    print(TAG, json.dumps(facts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
