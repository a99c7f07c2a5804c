"""A real PostgreSQL server for tests and benchmarks: ``initdb`` and ``pg_ctl`` (Debian's ``postgresql`` package)
into a temporary folder, on a free loopback port, stopped and removed at the end. As root, the server runs as the
``postgres`` user (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
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
    authentication on 127.0.0.1 only)."""

    def __init__(self) -> None:
        binaries = postgres_binaries()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")
        self.binaries = binaries
        from reflect_otel.llm.local import free_port

        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="reflect-pg-"))
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        data = self.folder / "data"
        self._run(str(self.binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.folder / "log"),
                  "-w", "start")  # fmt: skip
        return self

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
