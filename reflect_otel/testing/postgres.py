"""A real PostgreSQL server for tests and benchmarks: ``initdb`` and ``pg_ctl`` (Debian's ``postgresql`` package)
into a temporary folder, on a free loopback port, stopped and removed at the end. As root, the server runs as the
``postgres`` user (PostgreSQL refuses to run as root). It may run on a host of a
:class:`~reflect_otel.testing.netns.NetworkLab` instead (``namespace``), listening on that host's addresses; its
Unix socket, in the folder, reaches it from any namespace (:attr:`PostgresServer.socket_url`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresServer", "postgres_binaries"]


def postgres_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest installed version), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


class PostgresServer:
    """``with PostgresServer() as server:`` then ``server.url`` (database ``postgres``, user ``postgres``, trust
    authentication on 127.0.0.1 only).

    On a lab host: ``namespace`` (the host's namespace), ``listen`` (its addresses; :attr:`url` names the first),
    ``trust`` (the networks allowed in, e.g. ``10.213.0.0/16``) and ``settings`` (more ``-c name=value``)."""

    def __init__(
        self,
        *,
        namespace: str | None = None,
        listen: Sequence[str] = ("127.0.0.1",),
        trust: Sequence[str] = (),
        settings: Mapping[str, str] | None = None,
    ) -> None:
        binaries = postgres_binaries()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")
        self.binaries = binaries
        from reflect_otel.llm.local import free_port

        self.namespace = namespace
        self.listen = tuple(listen)
        self.trust = tuple(trust)
        self.settings = dict(settings or {})
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="reflect-pg-"))
        self.url = f"postgresql://postgres@{self.listen[0]}:{self.port}/postgres"
        self.socket_url = f"postgresql://postgres@/postgres?host={self.folder}&port={self.port}"
        """The server over its Unix socket: reachable whatever is cut between the namespaces."""

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.namespace is not None:
            prefix = ["ip", "netns", "exec", self.namespace, *prefix]
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        data = self.folder / "data"
        self._run(str(self.binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        if self.trust:
            with (data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in self.trust)
        self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str, *extra: str) -> None:
        settings = {"listen_addresses": ",".join(self.listen), "fsync": "off", **self.settings}
        options = f"-p {self.port} -k {self.folder} " + " ".join(f"-c {k}={v}" for k, v in settings.items())
        data = str(self.folder / "data")
        self._run(str(self.binaries / "pg_ctl"), "-D", data, "-o", options, "-l", str(self.folder / "log"),
                  "-w", *extra, action)  # fmt: skip

    def restart(self, *, mode: str = "fast") -> None:
        """Stop the server (``fast``: its sessions are ended; ``immediate``: as a crash) and start it again."""
        self._pg_ctl("restart", "-m", mode)

    def stop(self) -> None:
        try:
            self._run(str(self.binaries / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
