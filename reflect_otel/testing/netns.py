"""Hosts you can cut apart, for fault tests of a fleet: network namespaces joined by point-to-point veth links.

Each host is a network namespace of its own (``ip netns``) with its loopback up; each link is a veth pair between
two hosts, on a /24 of its own in ``10.213.0.0/16`` (a host reaches a peer at the peer's address on their link;
there is no routing). Nothing here touches the namespace this process started in: no address, route or link of
the machine's own network is added, changed or removed, so whatever talks over the machine's loopback is left
alone. A link can be cut (both ends ``ip link set down``: packets vanish, as when a cable is pulled or a firewall
drops them, and a connection meets silence, not a reset), throttled (``tc qdisc ... tbf``), delayed (``tc qdisc
... netem``, where the kernel has it: :func:`netem_missing` says) and restored.

Processes run on a host through :meth:`Host.popen` (``ip netns exec``). This process makes sockets on a host with
:meth:`Host.call` or :meth:`Host.thread`: a thread joins the namespace (setns(2) moves the calling thread only), and
a socket stays in the namespace it was made in whichever thread uses it afterwards, so a server bound there serves
on that host. Making namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): :func:`namespaces_missing` says why
they cannot be made here, for a test to skip with.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["Host", "Link", "NetworkLab", "namespaces_missing", "netem_missing"]

T = TypeVar("T")
_CLONE_NEWNET = 0x40000000
_NETNS = Path("/run/netns")
_PREFIX = "rfl"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_SUBNET = "10.213"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def namespaces_missing() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip``, the kernel refuses), or None when they can:
    a probe namespace with a veth pair is made and removed."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); CI runs these tests as root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "ip and tc are not installed (apt-get install iproute2); .ci/run installs them"
    probe = f"{_PREFIX}{os.getpid()}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed here: {made.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if veth.returncode != 0:
            return f"veth pairs cannot be made here: {veth.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def netem_missing() -> str | None:
    """Why ``tc netem`` (a fixed delay on a link) cannot be used here, or None when it can."""
    reason = namespaces_missing()
    if reason is not None:
        return reason
    probe = f"{_PREFIX}{os.getpid()}-netem"
    try:
        _ip("netns", "add", probe)
        result = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            return f"tc netem is not available in this kernel ({result.stderr.strip()}: no sch_netem)"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def _join(namespace: str) -> None:
    """Move the calling thread into ``namespace`` (setns(2); os.setns is Python 3.12's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(_NETNS / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns into {namespace}: {os.strerror(code)}")
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Link:
    """A veth pair between hosts ``a`` and ``b``: ``a`` is ``a_address`` on it, ``b`` is ``b_address``."""

    a: str
    b: str
    a_address: str
    b_address: str

    def interface(self, host: str) -> str:
        """The link's interface on ``host``: ``to-`` and the peer's name."""
        return f"to-{self.b if host == self.a else self.a}"


@dataclass
class Host:
    """One namespace of a :class:`NetworkLab`."""

    name: str
    namespace: str
    lab: NetworkLab
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def address_for(self, peer: str) -> str:
        """This host's address on its link to ``peer`` (what ``peer`` connects to)."""
        link = self.lab.link_between(self.name, peer)
        return link.a_address if link.a == self.name else link.b_address

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on this host (``ip netns exec`` execs it: the process is the command itself); it is
        killed when the lab closes."""
        process = subprocess.Popen(self.command(argv), **kwargs)
        self.processes.append(process)
        return process

    def call(self, work: Callable[[], T]) -> T:
        """``work()`` run on a thread that joined this host's namespace; its sockets stay on this host."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                _join(self.namespace)
                box["value"] = work()
            except BaseException as error:  # handed to the caller's thread
                box["error"] = error

        thread = threading.Thread(target=run, name=f"netns-{self.name}")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    def thread(self, work: Callable[[], object], *, name: str = "") -> threading.Thread:
        """A started daemon thread running ``work()`` on this host."""

        def run() -> None:
            _join(self.namespace)
            work()

        started = threading.Thread(target=run, name=name or f"netns-{self.name}", daemon=True)
        started.start()
        return started


class NetworkLab:
    """Hosts (:meth:`add_host`) and links (:meth:`link`); :meth:`close` (or leaving the ``with``) kills the
    processes started on the hosts and removes every namespace, which removes the links with them.

    Namespaces are named ``rfl<pid>-<host>``; ones left by a process that no longer runs (a killed test run) are
    removed when a lab starts."""

    def __init__(self) -> None:
        reason = namespaces_missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.hosts: dict[str, Host] = {}
        self.links: list[Link] = []
        self._cut: set[tuple[str, str]] = set()
        _remove_stale()

    def add_host(self, name: str) -> Host:
        if not _NAME.match(name):
            raise ValueError(f"host name {name!r}: 1-8 lower-case letters and digits, starting with a letter")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        namespace = f"{_PREFIX}{os.getpid()}-{name}"
        _ip("netns", "add", namespace)
        host = Host(name, namespace, self)
        self.hosts[name] = host
        _ip("-n", namespace, "link", "set", "lo", "up")
        return host

    def link(self, a: str, b: str) -> Link:
        """Join hosts ``a`` and ``b`` with a veth pair, ``a`` at ``10.213.N.1`` and ``b`` at ``10.213.N.2``."""
        number = len(self.links) + 1
        if number > 254:
            raise ValueError("a lab has at most 254 links")
        link = Link(a, b, f"{_SUBNET}.{number}.1", f"{_SUBNET}.{number}.2")
        one, other = self.hosts[a], self.hosts[b]
        _ip("-n", one.namespace, "link", "add", link.interface(a), "type", "veth", "peer", "name",
            link.interface(b), "netns", other.namespace)  # fmt: skip
        for host, address in ((one, link.a_address), (other, link.b_address)):
            _ip("-n", host.namespace, "addr", "add", f"{address}/24", "dev", link.interface(host.name))
            _ip("-n", host.namespace, "link", "set", link.interface(host.name), "up")
        self.links.append(link)
        return link

    def link_between(self, a: str, b: str) -> Link:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise KeyError(f"no link between {a} and {b}")

    def _ends(self, a: str, b: str) -> Iterator[tuple[str, str]]:
        link = self.link_between(a, b)
        for host in (link.a, link.b):
            yield self.hosts[host].namespace, link.interface(host)

    def cut(self, a: str, b: str) -> None:
        """Take the link between ``a`` and ``b`` down at both ends: what is sent on it is lost."""
        for namespace, interface in self._ends(a, b):
            _ip("-n", namespace, "link", "set", interface, "down")
        self._cut.add((a, b))

    def restore(self, a: str, b: str) -> None:
        """Bring the link back up, without any throttle or delay (its addresses were kept while down)."""
        for namespace, interface in self._ends(a, b):
            _ip("-n", namespace, "link", "set", interface, "up")
            self._tc(namespace, "qdisc", "del", "dev", interface, "root", check=False)
        self._cut.discard((a, b))

    def throttle(self, a: str, b: str, *, kbit: int) -> None:
        """Let the link carry ``kbit`` kilobits a second each way (``tc tbf``): a congested or slow link."""
        for namespace, interface in self._ends(a, b):
            self._tc(namespace, "qdisc", "replace", "dev", interface, "root", "tbf", "rate", f"{kbit}kbit",
                     "burst", "16kb", "latency", "10s")  # fmt: skip

    def delay(self, a: str, b: str, *, ms: int) -> None:
        """Delay every packet on the link by ``ms`` each way (``tc netem``); raises RuntimeError naming the cause
        where the kernel has no netem (:func:`netem_missing`)."""
        for namespace, interface in self._ends(a, b):
            self._tc(namespace, "qdisc", "replace", "dev", interface, "root", "netem", "delay", f"{ms}ms")

    @staticmethod
    def _tc(namespace: str, *args: str, check: bool = True) -> None:
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True, timeout=30, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"tc {' '.join(args)} failed: {result.stderr.strip()}")

    def close(self) -> None:
        for host in self.hosts.values():
            for process in host.processes:
                if process.poll() is None:
                    process.kill()
            for process in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=30)
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)
        self.hosts.clear()
        self.links.clear()

    def __enter__(self) -> NetworkLab:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _remove_stale() -> None:
    """Remove the namespaces of labs whose process no longer runs."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        match = re.match(rf"^{_PREFIX}(\d+)-", name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except OSError as error:
            if error.errno == errno.ESRCH:
                _ip("netns", "del", name, check=False)
