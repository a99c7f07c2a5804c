"""A fleet on hosts you can cut apart, for the fault tests and ``python -m benchmarks.fleet_faults``: PostgreSQL,
collectors, workers, the agents and a scripted LLM endpoint, each on a host of its own
(:class:`~reflect_otel.testing.netns.NetworkLab`)::

    agents --- c1 ---+           +--- w1 ---+
          \\-- c2 ---+---- db ----+--- w2 ---+--- llm

Each line is a link of its own (agents-c1, agents-c2, c1-db, c2-db, w1-db, w2-db, w1-llm, w2-llm), so cutting
c1-db leaves c1 receiving from the agents while it cannot reach the store, and cutting w1-db leaves w1 talking to
the endpoint while it cannot reach the database. The collectors and workers are the real commands (``reflect-otel
collect --attribute`` and ``reflect-otel worker``) as processes; PostgreSQL is a real server (started in the db
host's namespace, keepalives on so a cut client's session ends in about 11 s); the endpoint is
:class:`~reflect_otel.testing.openai_server.ScriptedOpenAIServer` (a double: it answers an all-at-once attribution
at once, or after :attr:`FleetModel.delay_s`), with :class:`~reflect_otel.testing.openai_server.EndpointFaults` to throttle
or stall it. The agents are threads of this process on the agents host that post OTLP/JSON runs and retry, as an
OTLP exporter does, until a collector acknowledges each. The store is read over PostgreSQL's Unix socket, which no
cut reaches.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from reflect_otel.testing.netns import NetworkLab
from reflect_otel.testing.openai_server import EndpointFaults, ScriptedOpenAIServer, ScriptedTurn
from reflect_otel.testing.otlp_bodies import wrong_run_body
from reflect_otel.testing.postgres import PostgresServer

__all__ = ["AAO_ANSWER", "Fleet", "FleetModel", "Sent", "trace_of"]

AAO_ANSWER = {
    "error_step": 1,
    "responsible_agent": None,
    "reason": "the lookup answered Lyon",
    "error_type": "tool_error",
    "confidence": 0.5,
}
"""What the scripted endpoint answers: an all-at-once attribution (``--method aao``) naming the lookup."""
HOSTS = ("db", "c1", "c2", "w1", "w2", "agents", "llm")
LINKS = (
    ("agents", "c1"), ("agents", "c2"), ("c1", "db"), ("c2", "db"), ("w1", "db"), ("w2", "db"), ("w1", "llm"),
    ("w2", "llm"),
)  # fmt: skip
OTLP_PORT = 4318
DATABASE = "fleet"


def trace_of(number: int) -> str:
    """The trace id of run ``number`` (:func:`~reflect_otel.testing.otlp_bodies.wrong_run_body`'s)."""
    return f"{number + 1:032x}"


@dataclass
class Sent:
    """What the agents' posts came to: each acknowledged run's trace id and the collector that took it, the
    answers asking to retry (429 / 503), the posts that met no answer (a cut link, a timeout), and the runs given
    up unacknowledged."""

    acked: dict[str, str] = field(default_factory=dict)
    refused: int = 0
    unanswered: int = 0
    given_up: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, slots=True)
class FleetModel:
    """The fleet's scripted model endpoint, and how the workers use it."""

    delay_s: float = 0.0
    """How long the endpoint takes to answer."""
    timeout_s: float = 10.0
    """The workers' ``REFLECT_LLM_TIMEOUT_S``."""
    concurrency: int | None = None
    """The workers' ``--llm-concurrency``."""
    max_concurrent: int | None = None
    """Requests the endpoint serves at once (more are refused, :class:`EndpointFaults`)."""


class Fleet:
    """``with Fleet(folder) as fleet:`` starts everything (``collectors`` and ``workers`` name which of c1, c2 and
    w1, w2 start at once; the others can be started later); ``fleet.lab`` cuts and restores links; leaving stops
    everything and removes the hosts. Process logs go to ``folder``."""

    def __init__(
        self,
        folder: Path,
        *,
        collectors: Sequence[str] = ("c1", "c2"),
        workers: Sequence[str] = ("w1", "w2"),
        model: FleetModel = FleetModel(),
        stalled_after_s: float = 3.0,
    ) -> None:
        self.folder = folder
        self.collectors = tuple(collectors)
        self.workers = tuple(workers)
        self.llm_delay_s = model.delay_s
        self.stalled_after_s = stalled_after_s
        self.llm_timeout_s = model.timeout_s
        self.llm_concurrency = model.concurrency
        self.faults = EndpointFaults(max_concurrent=model.max_concurrent)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.lab: NetworkLab | None = None
        self.db: PostgresServer | None = None
        self.llm: ScriptedOpenAIServer | None = None

    # -- lifetime --------------------------------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        lab = self.lab = NetworkLab()
        for name in HOSTS:
            lab.add_host(name)
        for a, b in LINKS:
            lab.link(a, b)
        db = lab.hosts["db"]
        peers = [peer for a, b in LINKS for peer in (a, b) if "db" in (a, b) and peer != "db"]
        self.db = PostgresServer(
            namespace=db.namespace,
            listen=[db.address_for(peer) for peer in peers],
            trust=("10.213.0.0/16",),
            settings={"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3"},
        ).start()
        import psycopg

        with psycopg.connect(self.db.socket_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DATABASE}")
        self.llm = ScriptedOpenAIServer(self._turn, host="0.0.0.0", faults=self.faults)  # on the llm host only
        lab.hosts["llm"].call(self.llm.__enter__)
        for name in self.collectors:
            self.start_collector(name)
        for name in self.workers:
            self.start_worker(name)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        if self.llm is not None:
            self.llm.__exit__()
            self.llm = None
        if self.db is not None:
            with contextlib.suppress(RuntimeError):
                self.db.stop()
            self.db = None
        if self.lab is not None:
            self.lab.close()
            self.lab = None

    def _turn(self, body: dict[str, Any]) -> ScriptedTurn:
        if self.llm_delay_s:
            time.sleep(self.llm_delay_s)
        return ScriptedTurn(text=json.dumps(AAO_ANSWER))

    # -- the processes ---------------------------------------------------------------------------------------
    @property
    def store_socket_url(self) -> str:
        """The store over the server's Unix socket (for reading it whatever is cut)."""
        assert self.db is not None
        return self.db.socket_url.replace("/postgres?", f"/{DATABASE}?")

    def store_url(self, host: str) -> str:
        """The store as ``host`` reaches it: the db host's address on their link."""
        assert self.lab is not None and self.db is not None
        return f"postgresql://postgres@{self.lab.hosts['db'].address_for(host)}:{self.db.port}/{DATABASE}"

    def llm_url(self, host: str) -> str:
        assert self.lab is not None and self.llm is not None
        return f"http://{self.lab.hosts['llm'].address_for(host)}:{self.llm.port}/v1"

    def collector_address(self, name: str) -> str:
        assert self.lab is not None
        return self.lab.hosts[name].address_for("agents")

    def _env(self, host: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REFLECT_", "OPENAI_"))}
        env |= {"PYTHONUNBUFFERED": "1", "REFLECT_LLM_API_KEY": "t", "REFLECT_LLM_MODEL": "scripted",
                "REFLECT_LLM_TIMEOUT_S": str(self.llm_timeout_s)}  # fmt: skip
        if host.startswith("w"):
            env["REFLECT_LLM_BASE_URL"] = self.llm_url(host)
        return env

    def _start(self, host: str, argv: list[str], ready: str, *, log_name: str) -> subprocess.Popen[bytes]:
        assert self.lab is not None
        log = self.folder / f"{log_name}.log"
        with log.open("ab") as out:
            process = self.lab.hosts[host].popen(
                [sys.executable, "-m", "reflect_otel", *argv], stdout=out, stderr=out, env=self._env(host)
            )
        self.processes[log_name] = process
        deadline = time.monotonic() + 60
        while ready not in log.read_text(encoding="utf-8", errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{log_name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        return process

    def start_collector(self, name: str) -> subprocess.Popen[bytes]:
        argv = ["collect", "--http", f"{self.collector_address(name)}:{OTLP_PORT}", "--allow-remote",
                "-o", str(self.folder / f"{name}.jsonl"), "--store", self.store_url(name), "--attribute",
                "--grace", "0.2"]  # fmt: skip
        return self._start(name, argv, "listening for OTLP", log_name=name)

    def start_worker(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = ["worker", "--store", self.store_url(name), "--method", "aao",
                "--stalled-after", str(self.stalled_after_s), *extra]  # fmt: skip
        if self.llm_concurrency:
            argv += ["--llm-concurrency", str(self.llm_concurrency)]
        return self._start(name, argv, "taking attribution jobs", log_name=name)

    def stop(self, name: str, *, timeout_s: float = 60.0) -> int:
        """SIGTERM ``name``'s process and wait for it; its exit status."""
        process = self.processes[name]
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=timeout_s)

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def running(self) -> dict[str, int]:
        """The processes still running and their pids."""
        return {name: p.pid for name, p in self.processes.items() if p.poll() is None}

    # -- the agents ------------------------------------------------------------------------------------------
    def send(
        self,
        numbers: Iterable[int],
        *,
        right: Collection[int] = (),
        patience_s: float = 120.0,
        senders: int = 4,
        sent: Sent | None = None,
    ) -> Sent:
        """Post run ``n`` of ``numbers`` (answering 'Paris', right, for those in ``right``; else 'Lyon', wrong) from
        the agents host, each to collector ``n % 2`` first and the other after a failure, retrying after a 429 or
        503 (its ``Retry-After``) or no answer, until acknowledged or ``patience_s`` has passed."""
        assert self.lab is not None
        sent = sent if sent is not None else Sent()
        work: queue.SimpleQueue[int] = queue.SimpleQueue()
        for number in numbers:
            work.put(number)
        deadline = time.monotonic() + patience_s
        targets = [self.collector_address(name) for name in ("c1", "c2") if name in self.processes]

        def sender() -> None:
            while True:
                try:
                    number = work.get_nowait()
                except queue.Empty:
                    return
                self._deliver(number, number in right, targets, deadline, sent)

        threads = [self.lab.hosts["agents"].thread(sender, name=f"agent-{i}") for i in range(senders)]
        for thread in threads:
            thread.join()
        return sent

    def _deliver(self, number: int, right: bool, targets: list[str], deadline: float, sent: Sent) -> None:
        body = wrong_run_body(number, answer="Paris" if right else "Lyon")
        tries = 0
        while time.monotonic() < deadline:
            target = targets[(number + tries) % len(targets)]
            tries += 1
            connection = http.client.HTTPConnection(target, OTLP_PORT, timeout=5)
            try:
                connection.request("POST", "/v1/traces", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                if response.status == 200:
                    with sent.lock:
                        sent.acked[trace_of(number)] = target
                    return
                with sent.lock:
                    sent.refused += 1
                time.sleep(min(5.0, float(response.getheader("Retry-After") or 1)))
            except (OSError, http.client.HTTPException):
                with sent.lock:
                    sent.unanswered += 1
                time.sleep(0.2)
            finally:
                connection.close()
        with sent.lock:
            sent.given_up.append(trace_of(number))

    # -- the store ---------------------------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.store_socket_url, autocommit=True) as db:
            try:
                return [tuple(row) for row in db.execute(sql, list(params)).fetchall()]
            except psycopg.errors.UndefinedTable:
                return []  # nothing made the tables yet

    def jobs(self) -> dict[str, int]:
        """Attribution jobs by status."""
        return {
            str(status): int(count)
            for status, count in self.query("SELECT status, count(*) FROM attribution_jobs GROUP BY 1")
        }

    def queue_left(self) -> int:
        """procrastinate jobs waiting or being done."""
        rows = self.query("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
        return int(rows[0][0]) if rows else 0

    def settled(self, traces: Collection[str]) -> bool:
        """Whether every run of ``traces`` is stored and its job done, and no job is left anywhere."""
        rows = self.query("SELECT trace_id, status FROM attribution_jobs")
        statuses = dict(rows)
        return (
            all(statuses.get(t) == "done" for t in traces)
            and not any(s in ("pending", "running") for s in statuses.values())
            and self.queue_left() == 0
        )

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in self.processes)
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}")
            time.sleep(0.2)

    def requests_from(self, host: str) -> int:
        """Requests the endpoint received from ``host`` (answered or refused)."""
        assert self.llm is not None
        address = self.lab.hosts[host].address_for("llm") if self.lab is not None else ""
        return sum(1 for r in list(self.llm.received) if r.client == address)
