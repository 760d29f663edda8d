"""A real multi-host network on one machine: hosts are network namespaces, links are capped.

Each host is a Linux network namespace with one interface, ``eth0``, whose
veth peer sits on a bridge in a switch namespace of its own. Every host's link
is capped both ways by a token bucket (``tbf``): on ``eth0`` for what the host
sends, on its switch port for what it receives. Traffic between the processes
of one host goes over that host's loopback, uncapped, as on a real node.

Nothing sent can leave the machine: the hosts' addresses lie in 198.18.0.0/24
(RFC 2544's benchmarking range, owned here by the testbed), no namespace gets a
default route, forwarding stays off, and the root namespace has no interface on
the bridge.

Run as root::

    python -m experiments.network.testbed up --hosts 4 --procs-per-host 1 --rate 5mbit
    python -m experiments.network.testbed run -- topology=ring train.max_steps=60
    python -m experiments.network.testbed status
    python -m experiments.network.testbed down

or build, run and tear down in one command (also on Ctrl-C and on errors)::

    python -m experiments.network.testbed run --hosts 4 --rate 5mbit -- topology=ring

``make testbed-up``, ``make testbed-run`` and ``make testbed-down`` are the same.
This module builds and removes the network; :mod:`.launch` runs jobs on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .stop import teardown_on_signals

__all__ = [
    "PREFIX",
    "Spec",
    "TestbedError",
    "address",
    "down",
    "host_ns",
    "link_stats",
    "missing",
    "current",
    "parse_rate",
    "read_state",
    "testbed",
    "up",
]

PREFIX = "ddptb"
"""Every name the testbed makes starts with this and a dash."""
SUBNET = "198.18.0"
IFACE = "eth0"
BRIDGE = "br0"
MAX_HOSTS = 250
_ETC_NETNS = Path("/etc/netns")
_NIC_QUEUE_BYTES = 1000 * 1514


class TestbedError(RuntimeError):
    """The testbed cannot be built, found or used; the message is one line."""


@dataclass(frozen=True)
class Spec:
    """What ``up`` builds.

    Args:
        hosts: Number of hosts (namespaces), 1 to 250.
        procs_per_host: Processes ``run`` starts on each host (torchrun's ``--nproc_per_node``).
        rate_bps: Each host's link rate in bits per second, both ways.
        queue_ms: How long a packet may wait at a host's switch port before it is
            dropped (``tbf``'s ``latency``): the switch's buffer, in time. A host's
            own interface queues 1000 frames, as a NIC does.
        prefix: Start of every name the testbed makes (namespaces, state file).
        nic_queue_ms: Give each host's own interface a queue of this many ms at
            the line rate instead of a NIC's 1000 frames (``None``). A short one
            drops the host's own packets, as a shaper on the sending host does.
    """

    hosts: int
    procs_per_host: int = 1
    rate_bps: int = 100_000_000
    queue_ms: float = 50.0
    prefix: str = PREFIX
    nic_queue_ms: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise TestbedError(
                f"hosts={self.hosts} is invalid; it must be between 1 and {MAX_HOSTS}"
            )
        if self.procs_per_host < 1:
            raise TestbedError(f"procs_per_host={self.procs_per_host} is invalid; it must be >= 1")
        if self.rate_bps < 8_000:
            raise TestbedError(f"rate_bps={self.rate_bps} is invalid; it must be >= 8000 (8 kbit)")
        if not self.queue_ms > 0:
            raise TestbedError(f"queue_ms={self.queue_ms} is invalid; it must be > 0")
        if self.nic_queue_ms is not None and not self.nic_queue_ms > 0:
            raise TestbedError(f"nic_queue_ms={self.nic_queue_ms} is invalid; it must be > 0")
        if not re.fullmatch(r"[a-z][a-z0-9]{1,7}", self.prefix):
            raise TestbedError(
                f"prefix={self.prefix!r} is invalid; it must be 2-8 lowercase letters or digits"
            )

    @property
    def burst_bytes(self) -> int:
        """The token bucket's depth: 1 ms at the line rate, at least two full frames."""
        return max(3028, self.rate_bps // 8 // 1000)

    def namespaces(self) -> list[str]:
        """Every namespace ``up`` makes, the switch first."""
        return [switch_ns(self.prefix)] + [host_ns(i, self.prefix) for i in range(self.hosts)]


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit|b|bps)?(?:/s)?", re.IGNORECASE)


def parse_rate(text: str | int | float) -> int:
    """Bits per second from ``5mbit``, ``100M``, ``1gbit``, ``500kbit`` or a plain number.

    Raises:
        TestbedError: ``text`` is not a rate.
    """
    if isinstance(text, int | float):
        return int(text)
    m = _RATE.fullmatch(text.strip())
    if m is None:
        raise TestbedError(
            f"rate {text!r} is invalid; use a number of bits/s with an optional k, m or g "
            "and 'bit' (e.g. 5mbit, 100mbit, 1gbit)"
        )
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def switch_ns(prefix: str = PREFIX) -> str:
    """The switch namespace's name."""
    return f"{prefix}-sw"


def host_ns(i: int, prefix: str = PREFIX) -> str:
    """Host ``i``'s namespace name (hosts count from 0)."""
    return f"{prefix}-h{i}"


def address(i: int) -> str:
    """Host ``i``'s address on the testbed's network."""
    return f"{SUBNET}.{i + 1}"


def _state_dir() -> Path:
    run = Path("/run")
    base = run if os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / "decent-dp-testbed"


def _state_path(prefix: str) -> Path:
    return _state_dir() / f"{prefix}.json"


def read_state(prefix: str = PREFIX) -> dict[str, Any] | None:
    """What ``up`` recorded (its spec and the namespaces it made), or ``None``."""
    try:
        return json.loads(_state_path(prefix).read_text())
    except (OSError, ValueError):
        return None


def _write_state(spec: Spec, made: list[str], complete: bool) -> None:
    path = _state_path(spec.prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"spec": asdict(spec), "made": made, "complete": complete}))
    os.replace(tmp, path)


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        err = " ".join((proc.stderr or proc.stdout).split())
        raise TestbedError(f"`{' '.join(args)}` failed: {err}")
    return proc


def _netns_list() -> set[str]:
    proc = _sh("ip", "netns", "list", check=False)
    return {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}


_missing_cache: dict[str, str | None] = {}


def missing() -> str | None:
    """One line naming what this machine lacks for the testbed, or ``None`` if nothing.

    Checks root, ``ip`` and ``tc``, and the kernel's network namespaces, veth
    pairs, bridges and the ``tbf`` qdisc by building (and removing) a probe.
    """
    if "result" in _missing_cache:
        return _missing_cache["result"]
    result = _probe()
    _missing_cache["result"] = result
    return result


def _probe() -> str | None:
    if sys.platform != "linux":
        return f"the testbed needs Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, veth, tc); run it as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs `{tool}` (Debian package iproute2); it is not on PATH"
    a, b = f"{PREFIX}-probe{os.getpid()}a", f"{PREFIX}-probe{os.getpid()}b"
    steps = [
        ("network namespaces", ("ip", "netns", "add", a)),
        ("network namespaces", ("ip", "netns", "add", b)),
        ("veth pairs", ("ip", "-n", a, "link", "add", IFACE, "type", "veth", "peer", "name", "p0", "netns", b)),
        ("bridges", ("ip", "-n", b, "link", "add", BRIDGE, "type", "bridge")),
        ("the tbf qdisc", ("tc", "-n", a, "qdisc", "add", "dev", IFACE, "root", "tbf", "rate", "1mbit", "burst", "3028", "latency", "50ms")),
    ]  # fmt: skip
    try:
        for feature, cmd in steps:
            proc = _sh(*cmd, check=False)
            if proc.returncode != 0:
                why = " ".join(proc.stderr.split())
                return f"the kernel lacks {feature} for the testbed ({why})"
        return None
    finally:
        for ns in (a, b):
            _sh("ip", "netns", "del", ns, check=False)


def _cap(ns: str, dev: str, spec: Spec, *, nic: bool) -> None:
    """Cap ``dev`` at the link rate.

    A host's own interface (``nic``) queues like a NIC's transmit queue (1000
    frames, Linux's default ``txqueuelen``): a real kernel holds its sockets back
    rather than drop its own packets. A switch port drops what waits longer than
    ``queue_ms``, as a switch's buffer does when senders converge on one port.
    """
    if nic and spec.nic_queue_ms is None:
        queue = ["limit", str(_NIC_QUEUE_BYTES)]
    else:
        queue = ["latency", f"{spec.nic_queue_ms if nic else spec.queue_ms}ms"]
    _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
        "rate", f"{spec.rate_bps}bit", "burst", str(spec.burst_bytes), *queue)  # fmt: skip


def _sysctl(ns: str, *settings: str) -> None:
    _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings)


def up(spec: Spec) -> Spec:
    """Build the testbed ``spec`` describes; idempotent.

    A testbed of the same spec that is up stays as it is; one of another spec,
    made by the testbed, is torn down and built anew. A partial build is torn
    down before the error is raised.

    Raises:
        TestbedError: The machine lacks a feature (:func:`missing`), or a name the
            testbed needs exists and is not the testbed's own.
    """
    why = missing()
    if why is not None:
        raise TestbedError(why)
    state = read_state(spec.prefix)
    present = _netns_list()
    if state is not None:
        same = state.get("complete") and Spec(**state["spec"]) == spec
        if same and all(ns in present for ns in spec.namespaces()):
            return spec
        down(spec.prefix)
        present = _netns_list()
    ours = set(state["made"]) if state else set()
    for ns in spec.namespaces():
        if ns in present and ns not in ours:
            raise TestbedError(
                f"network namespace {ns} exists and was not made by the testbed; remove it "
                f"(ip netns del {ns}) or choose another --prefix"
            )
    made: list[str] = []
    try:
        _build(spec, made)
    except BaseException:
        down(spec.prefix)
        raise
    _write_state(spec, made, complete=True)
    return spec


def _add_ns(spec: Spec, ns: str, made: list[str]) -> None:
    made.append(ns)
    _write_state(spec, made, complete=False)  # so a crash mid-build can still be torn down
    _sh("ip", "netns", "add", ns)
    _sh("ip", "-n", ns, "link", "set", "lo", "up")
    # no forwarding, no IPv6 chatter: the only traffic is what the hosts' processes send
    _sysctl(ns, "net.ipv4.ip_forward=0", "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1")  # fmt: skip


def _etc(spec: Spec, ns: str) -> None:
    """The host's own /etc/hosts and an empty resolv.conf (``ip netns exec`` mounts them).

    Without them every reverse lookup of a peer's address waits for a DNS
    server that the namespace cannot reach, adding seconds to each rendezvous.
    """
    etc = _ETC_NETNS / ns
    etc.mkdir(parents=True, exist_ok=True)
    names = "".join(f"{address(i)} {host_ns(i, spec.prefix)}\n" for i in range(spec.hosts))
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
    (etc / "resolv.conf").write_text("# testbed host: no DNS\n")


def _build(spec: Spec, made: list[str]) -> None:
    sw = switch_ns(spec.prefix)
    _add_ns(spec, sw, made)
    _sh("ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge")
    _sh("ip", "-n", sw, "link", "set", BRIDGE, "up")
    for i in range(spec.hosts):
        ns, port = host_ns(i, spec.prefix), f"p{i}"
        _add_ns(spec, ns, made)
        _etc(spec, ns)
        _sh("ip", "-n", ns, "link", "add", IFACE, "type", "veth", "peer", "name", port, "netns", sw)
        _sh("ip", "-n", sw, "link", "set", port, "master", BRIDGE)
        _sh("ip", "-n", sw, "link", "set", port, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{address(i)}/24", "dev", IFACE)
        _sh("ip", "-n", ns, "link", "set", IFACE, "up")
        _cap(ns, IFACE, spec, nic=True)  # what the host sends
        _cap(sw, port, spec, nic=False)  # what it receives
        routes = _sh("ip", "-n", ns, "route", "show", "default").stdout.strip()
        if routes:
            raise TestbedError(f"host {ns} has a default route ({routes}); refusing to go on")


def down(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace the testbed recorded as its own; idempotent.

    Returns:
        The namespaces removed. Namespaces with the prefix that the testbed did
        not record are left alone.
    """
    state = read_state(prefix)
    if state is None:
        return []
    present = _netns_list()
    removed = []
    for ns in reversed(state.get("made", [])):
        if ns in present:
            _sh("ip", "netns", "del", ns, check=False)  # takes its veth ends with it
            removed.append(ns)
        shutil.rmtree(_ETC_NETNS / ns, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        _state_path(prefix).unlink()
    return removed


def current(prefix: str = PREFIX) -> Spec:
    """The spec of the testbed that is up.

    Raises:
        TestbedError: None is up.
    """
    state = read_state(prefix)
    if state is None or not state.get("complete"):
        raise TestbedError(
            "no testbed is up; build one with `python -m experiments.network.testbed up --hosts N`"
        )
    spec = Spec(**state["spec"])
    absent = [ns for ns in spec.namespaces() if ns not in _netns_list()]
    if absent:
        raise TestbedError(
            f"the testbed is broken ({', '.join(absent)} missing); run `down`, then `up`"
        )
    return spec


def netns_pids(ns: str) -> list[int]:
    """The processes running in namespace ``ns`` (none if it does not exist)."""
    out = _sh("ip", "netns", "pids", ns, check=False).stdout
    return [int(x) for x in out.split()]


def link_stats(spec: Spec) -> list[dict[str, int]]:
    """Each host's link counters: bytes and packets sent and received, and the drops of both caps."""
    out = []
    for i in range(spec.hosts):
        ns = host_ns(i, spec.prefix)
        link = json.loads(_sh("ip", "-j", "-s", "-n", ns, "link", "show", IFACE).stdout)[0]
        st = link["stats64"]
        row = {
            "tx_bytes": int(st["tx"]["bytes"]),
            "rx_bytes": int(st["rx"]["bytes"]),
            "tx_packets": int(st["tx"]["packets"]),
            "rx_packets": int(st["rx"]["packets"]),
        }
        for side, (qns, dev) in (("tx", (ns, IFACE)), ("rx", (switch_ns(spec.prefix), f"p{i}"))):
            q = json.loads(_sh("tc", "-j", "-s", "-n", qns, "qdisc", "show", "dev", dev).stdout)[0]
            row[f"{side}_drops"] = int(q.get("drops", 0))
            row[f"{side}_overlimits"] = int(q.get("overlimits", 0))
        out.append(row)
    return out


@contextlib.contextmanager
def testbed(spec: Spec) -> Iterator[Spec]:
    """Build the testbed for the ``with`` block and tear it down after, also on SIGTERM or SIGINT
    (:func:`.stop.teardown_on_signals`).

    A testbed of the same spec that was already up is left up.

    Example::

        with testbed(Spec(hosts=2, rate_bps=parse_rate("10mbit"))) as bed:
            subprocess.run(["ip", "netns", "exec", host_ns(0), "true"], check=True)
    """
    before = read_state(spec.prefix)
    keep = bool(before and before.get("complete") and Spec(**before["spec"]) == spec)
    with teardown_on_signals():
        try:
            yield up(spec)
        finally:
            if not keep:
                down(spec.prefix)
