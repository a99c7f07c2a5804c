"""Steady OTLP/JSON load over keep-alive HTTP connections, recording which traces the receiver acknowledged."""

from __future__ import annotations

import http.client
import json
import threading

from reflect_otel.testing.otlp_bodies import json_trace, trace_id


class SteadyLoad:
    """``workers`` threads, each POSTing whole traces (ids ``worker * 1_000_000 + n``) until :meth:`stop`.
    ``acknowledged``: ids answered 200; ``refused``: (status, Retry-After) of every other answer. A closed or
    refused connection is reopened and the trace counts as neither."""

    def __init__(self, port: int, workers: int = 4) -> None:
        self.port = port
        self.acknowledged: set[str] = set()
        self.refused: list[tuple[int, str | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(w + 1,)) for w in range(workers)]

    def start(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(30)

    def _send(self, worker: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        number = worker * 1_000_000
        while not self._stop.is_set():
            number += 1
            try:
                connection.request(
                    "POST", "/v1/traces", json.dumps(json_trace(number)), {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                connection.close()  # closed after its answer, or nobody listens (yet, or any more): reconnect
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self._stop.wait(0.01)
                continue
            with self._lock:
                if response.status == 200:
                    self.acknowledged.add(trace_id(number))
                else:
                    self.refused.append((response.status, response.getheader("Retry-After")))
        connection.close()


def rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``); 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """Samples :func:`rss_bytes` every 5 ms from ``with`` to its end; ``growth`` is peak minus start."""

    def __init__(self) -> None:
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes())
