"""The hosts the fleet tests cut apart: a server on one namespace reached from another over their link, the link
cut (connections meet silence) and restored, throttled (a transfer takes as long as the rate says), delayed where
the kernel has netem, and the machine's own namespace left as it was."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from reflect_otel.testing.netns import NetworkLab, namespaces_missing, netem_missing

_listeners: list[socket.socket] = []


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    reason = namespaces_missing()
    if reason is not None:
        pytest.skip(f"hosts cannot be cut apart here: {reason}")
    with NetworkLab() as made:
        made.add_host("one")
        made.add_host("two")
        made.link("one", "two")
        yield made
        while _listeners:
            _listeners.pop().close()


def _own_network() -> str:
    return (
        subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        + subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    )


def _serve(lab: NetworkLab) -> tuple[str, int]:
    """A server on host two that sends 64 kB to whoever connects; its address as host one reaches it."""
    address = lab.hosts["two"].address_for("one")
    listener = lab.hosts["two"].call(lambda: socket.create_server((address, 0)))
    _listeners.append(listener)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"x" * 65_536)

    threading.Thread(target=serve, daemon=True).start()
    return address, listener.getsockname()[1]


def _fetch(lab: NetworkLab, address: str, port: int, timeout_s: float) -> float:
    """Seconds host one takes to read the server's 64 kB (raises on a timeout)."""

    def fetch() -> float:
        started = time.monotonic()
        with socket.create_connection((address, port), timeout=timeout_s) as connection:
            got = 0
            while got < 65_536:
                chunk = connection.recv(65_536)
                if not chunk:
                    break
                got += len(chunk)
        assert got == 65_536
        return time.monotonic() - started

    return lab.hosts["one"].call(fetch)


def test_a_link_is_cut_restored_and_throttled_and_the_machines_own_network_is_left_alone(lab: NetworkLab) -> None:
    before = _own_network()
    address, port = _serve(lab)
    assert _fetch(lab, address, port, 5) < 2
    lab.cut("one", "two")
    with pytest.raises(OSError):  # silence: the connection attempt times out (or finds no route), never answered
        _fetch(lab, address, port, 1)
    lab.restore("one", "two")
    assert _fetch(lab, address, port, 5) < 2
    lab.throttle("one", "two", kbit=256)  # 64 kB at 256 kbit/s: about 2 s
    assert _fetch(lab, address, port, 30) > 1.0
    lab.restore("one", "two")
    assert _fetch(lab, address, port, 5) < 1.0
    assert _own_network() == before


def test_a_delay_needs_netem_and_says_so_where_the_kernel_has_none(lab: NetworkLab) -> None:
    reason = netem_missing()
    if reason is None:
        lab.delay("one", "two", ms=200)
        address, port = _serve(lab)
        assert _fetch(lab, address, port, 5) >= 0.4  # the handshake and the data each cross the link both ways
    else:
        assert "netem" in reason
        with pytest.raises(RuntimeError, match="netem"):
            lab.delay("one", "two", ms=200)
