"""The hardening probes of issue 13 at their original sizes, against a real ``reflect-otel collect`` process (HTTP
and gRPC, ``--out`` and ``--store``) and the real CLI, printed as one table.

Columns, per probe: ``tried`` inputs; ``crashes`` (a 5xx, gRPC INTERNAL/UNKNOWN, a connection closed without an
answer, a Python traceback, a process that died); ``hangs`` (no answer within the timeout); ``lost`` (acknowledged,
then missing or cut in the ``--out`` file or the store); ``wrong status`` (an answer other than the one the input
calls for); ``other`` (what a row's note names: a secret written verbatim, a file the ``sql`` command touched).
All inputs are seeded, so two runs send the same bytes. ``--quick`` sends a tenth of them, ``--smoke`` a
hundredth (every probe once, to check the script runs).
Last line: ``hardening_failures=N`` (every column but ``tried``, summed).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import grpc
import httpx

from benchmarks._common import add_smoke_option
from reflect_otel.collectors.receiver import OTLPReceiver, ReceiverLimits
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.llm.local import free_port
from reflect_otel.testing.otlp_bodies import (
    WEIRD_JSON_VALUES,
    gzipped,
    huge_spans_body,
    json_trace,
    mutate_bytes,
    mutate_json,
    proto_trace,
    trace_id,
)
from reflect_otel.testing.otlp_load import PeakRss, SteadyLoad

SEED = 20261122
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
JSON = {"Content-Type": "application/json"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}
CLI = [sys.executable, "-m", "reflect_otel"]
TIMEOUT_S = 60.0


@dataclass
class Row:
    probe: str
    tried: int = 0
    crashes: int = 0
    hangs: int = 0
    lost: int = 0
    wrong_status: int = 0
    other: int = 0
    note: str = ""
    seen: list[str] = field(default_factory=list)
    """What each failure was (the first ones are printed to stderr)."""

    def saw(self, what: str) -> None:
        with _COUNTING:
            self.seen.append(what[:3000])

    @property
    def failures(self) -> int:
        return self.crashes + self.hangs + self.lost + self.wrong_status + self.other


@dataclass
class Collect:
    """A running ``reflect-otel collect`` and where it writes."""

    process: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    out: Path
    store: Path
    stderr: str = ""
    returncode: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, self.stderr = self.process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()
        self.returncode = self.process.returncode

    def written(self) -> dict[str, dict[str, object]]:
        """Trace id -> trace, from the ``--out`` file (a torn last line, after kill -9, is skipped)."""
        traces: dict[str, dict[str, object]] = {}
        if self.out.exists():
            for line in self.out.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    trace = json.loads(line)
                except ValueError:
                    continue
                traces[str(trace["trace_id"])] = trace
        return traces

    def stored(self) -> dict[str, int]:
        """Trace id -> step count, from the store."""
        if not self.store.exists():
            return {}
        with duckdb.connect(str(self.store), read_only=True) as db:
            return dict(db.execute("SELECT trace_id, step_count FROM traces").fetchall())


@contextmanager
def collecting(folder: Path, *extra: str) -> Iterator[Collect]:
    http_port, grpc_port = free_port(), free_port()
    out, store = folder / f"out-{http_port}.jsonl", folder / f"store-{http_port}.duckdb"
    command = [*CLI, "collect", "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}"]
    command += ["--out", str(out), "--store", str(store), "--grace", "0.5", *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    running = Collect(process, http_port, grpc_port, out, store)
    try:
        _wait_listening(running)
        yield running
    finally:
        if running.returncode is None:
            running.stop()


def _wait_listening(running: Collect) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"collect exited: {running.process.communicate()[1][-2000:]}")
        try:
            urllib.request.urlopen(running.url, timeout=1)
        except urllib.error.HTTPError:
            return  # it answers (405 to a GET): listening
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("collect did not start listening")


def _ended_badly(row: Row, running: Collect, *, expected_code: int = 0) -> None:
    """The collector's own end: a traceback or an unexpected exit code is a crash."""
    if "Traceback" in running.stderr or running.returncode != expected_code:
        row.crashes += 1
        row.note += f"; collect exited {running.returncode}"
        at = running.stderr.find("Traceback")
        row.saw(
            f"collect exited {running.returncode}: {running.stderr[at:][:4000] if at >= 0 else running.stderr[-500:]}"
        )


_COUNTING = threading.Lock()  # probes post from several threads into one row


def _post(client: httpx.Client, url: str, body: bytes, headers: dict[str, str], row: Row) -> httpx.Response | None:
    """POST ``body``, counting it in ``row`` (tried, and a hang or crash); None when nothing answered."""
    response: httpx.Response | None = None
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.TimeoutException:
        fault = "hangs"
    except httpx.TransportError:
        fault = "crashes"  # closed without an answer
    else:
        fault = "crashes" if response.status_code >= 500 and response.status_code != 503 else ""
    with _COUNTING:
        row.tried += 1
        if fault:
            setattr(row, fault, getattr(row, fault) + 1)
    return response


def _missing(ids: list[str] | set[str], written: dict[str, dict[str, object]], stored: dict[str, int]) -> int:
    """How many of ``ids`` (acknowledged) are absent from the file or the store."""
    return sum(1 for tid in ids if tid not in written or tid not in stored)


def _whole(written: dict[str, dict[str, object]], stored: dict[str, int], ids: list[str], steps: int) -> int:
    """How many of ``ids`` are missing, or not whole, in the file or the store."""
    missing = 0
    for tid in ids:
        trace = written.get(tid)
        if trace is None or len(trace.get("steps", [])) != steps or stored.get(tid) != steps:  # type: ignore[arg-type]
            missing += 1
    return missing


# -- 3. bad values and fuzzed bodies ----------------------------------------------------------------------------
def probe_fuzz(folder: Path, scale: float) -> list[Row]:
    rng = random.Random(SEED)
    http_row, grpc_row = Row("fuzzed OTLP bodies, HTTP"), Row("fuzzed OTLP bodies, gRPC")
    statuses: dict[object, int] = {}
    with collecting(folder) as running:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            for n in range(int(1_800 * scale)):
                number = 1_000_000 + n
                choice = rng.randrange(4)
                if choice == 0:
                    body, headers = mutate_json(rng, number), JSON
                elif choice == 1:
                    body, headers = mutate_bytes(rng, proto_trace(number)), PROTOBUF
                elif choice == 2:
                    body, headers = (
                        mutate_bytes(rng, gzipped(proto_trace(number))),
                        PROTOBUF | {"Content-Encoding": "gzip"},
                    )
                else:
                    encoding = rng.choice(["gzip", "x-gzip"])
                    body, headers = gzipped(mutate_json(rng, number)), JSON | {"Content-Encoding": encoding}
                response = _post(client, running.url, body, headers, http_row)
                if response is not None:
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code not in (200, 400, 413, 415) and response.status_code < 500:
                        http_row.wrong_status += 1
        with grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            for n in range(int(1_500 * scale)):
                grpc_row.tried += 1
                try:
                    export(mutate_bytes(rng, proto_trace(2_000_000 + n)), timeout=TIMEOUT_S)
                    statuses["grpc OK"] = statuses.get("grpc OK", 0) + 1
                except grpc.RpcError as error:
                    code = error.code()  # type: ignore[attr-defined]
                    statuses[f"grpc {code.name}"] = statuses.get(f"grpc {code.name}", 0) + 1
                    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                        grpc_row.hangs += 1
                    elif code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE):
                        grpc_row.crashes += 1
                    elif code is not grpc.StatusCode.INVALID_ARGUMENT:
                        grpc_row.wrong_status += 1
            # afterwards, valid traces over both transports must arrive whole in both outputs
            after_http = [trace_id(n) for n in range(1, 21)]
            after_grpc = [trace_id(n) for n in range(101, 121)]
            for n in range(1, 21):
                httpx.post(running.url, content=json.dumps(json_trace(n)), headers=JSON, timeout=TIMEOUT_S)
            for n in range(101, 121):
                export(proto_trace(n), timeout=TIMEOUT_S)
        running.stop()
        _ended_badly(http_row, running)
        written, stored = running.written(), running.stored()
    http_row.lost = _whole(written, stored, after_http, 3)
    grpc_row.lost = _whole(written, stored, after_grpc, 3)
    answers = sorted(statuses.items(), key=str)
    http_row.note += "; answers " + ", ".join(f"{k}: {v}" for k, v in answers if not str(k).startswith("grpc"))
    grpc_row.note = "answers " + ", ".join(f"{k[5:]}: {v}" for k, v in answers if str(k).startswith("grpc"))
    grpc_row.note += "; lost counts the 20 valid traces sent after the fuzz (on both rows)"
    return [http_row, grpc_row]


def _weird_bodies() -> Iterator[tuple[int, bytes]]:
    """Every weird JSON value in every place a decoder reads one, each in a trace of its own."""
    number = 3_000_000
    places = ['"1000"', '"9000"', '"2050"', '"12"', '"ok"', '"AGENT"', '"question {n}"', '"fuzz"', '"tool_0"']
    for value in WEIRD_JSON_VALUES:
        for place in places:
            number += 1
            text = json.dumps(json_trace(number))
            text = text.replace(place.replace("{n}", str(number)), value, 1)
            yield number, text.encode("utf-8", "surrogatepass")


def probe_bad_values(folder: Path) -> Row:
    """Acknowledged with every span accepted, a trace must be in the file and the store; partly accepted, it
    must still be in both (what was kept of it)."""
    row = Row("bad values (Infinity, NaN, 1e27, 2^70, lone surrogates, deep nesting)")
    acknowledged: list[str] = []
    bodies: dict[str, bytes] = {}
    with collecting(folder) as running, httpx.Client(timeout=TIMEOUT_S) as client:
        for number, body in _weird_bodies():
            bodies[trace_id(number)] = body
            response = _post(client, running.url, body, JSON, row)
            if response is None:
                continue
            if response.status_code == 200:
                partial = response.json().get("partialSuccess") or {}
                if int(partial.get("rejectedSpans", 0) or 0) < 4:  # some span of the trace was kept
                    acknowledged.append(trace_id(number))
            elif response.status_code != 400:
                row.wrong_status += 1
        running.stop()
        _ended_badly(row, running)
        written, stored = running.written(), running.stored()
    for tid in acknowledged:
        if tid not in written or tid not in stored:
            row.lost += 1
            row.saw(f"{tid}: in the file {tid in written}, in the store {tid in stored}; sent {bodies[tid][:300]!r}")
    row.note = f"{len(acknowledged)} acknowledged, each checked in the file and the store"
    return row


def probe_framing(folder: Path) -> Row:
    """Truncated gzip streams (400), x-gzip (accepted as gzip), two Content-Length headers (400)."""
    row = Row("HTTP framing (truncated gzip, x-gzip, two Content-Length)")
    rng = random.Random(SEED + 1)
    with collecting(folder) as running, httpx.Client(timeout=TIMEOUT_S) as client:
        for n in range(50):
            zipped = gzipped(proto_trace(4_000_000 + n))
            cut = zipped[: rng.randrange(1, len(zipped) - 1)]
            response = _post(client, running.url, cut, PROTOBUF | {"Content-Encoding": "gzip"}, row)
            if response is not None and response.status_code != 400:
                row.wrong_status += 1
        response = _post(client, running.url, gzipped(proto_trace(5)), PROTOBUF | {"Content-Encoding": "x-gzip"}, row)
        if response is not None and response.status_code != 200:
            row.wrong_status += 1
        payload = json.dumps(json_trace(6)).encode()
        row.tried += 1
        with socket.create_connection(("127.0.0.1", running.http_port), timeout=TIMEOUT_S) as raw:
            raw.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\nContent-Length: 5\r\n\r\n".encode()
                + payload
            )
            answer = raw.recv(4096)
        if not answer:
            row.crashes += 1
        elif not answer.startswith(b"HTTP/1.1 400"):
            row.wrong_status += 1
        running.stop()
        _ended_badly(row, running)
        written, stored = running.written(), running.stored()
    row.lost = _whole(written, stored, [trace_id(5)], 3)
    return row


# -- 1. shutdown under load, and kill -9 ---------------------------------------------------------------------------
def probe_shutdown(folder: Path, runs: int) -> Row:
    row = Row("collect stopped under load (SIGTERM, SIGINT)")
    refused: set[int] = set()
    for run in range(runs):
        with collecting(folder) as running:
            load = SteadyLoad(running.http_port).start()
            time.sleep(2.0)
            running.stop(signal.SIGTERM if run % 2 == 0 else signal.SIGINT)
            load.stop()
            _ended_badly(row, running)
            written, stored = running.written(), running.stored()
        row.tried += len(load.acknowledged)
        row.lost += _missing(load.acknowledged, written, stored)
        refused |= {status for status, _ in load.refused}
        row.wrong_status += sum(1 for status, _ in load.refused if status != 503)
    row.note = f"tried = traces acknowledged over {runs} runs; refusals answered {sorted(refused) or 'none'}"
    return row


def probe_kill(folder: Path, runs: int) -> Row:
    """After kill -9 the file is the source of truth: ``collect --reingest`` must bring the store up to it."""
    row = Row("collect killed (-9) under load, then --reingest")
    lagged = 0
    for _ in range(runs):
        with collecting(folder) as running:
            load = SteadyLoad(running.http_port).start()
            time.sleep(2.0)
            running.stop(signal.SIGKILL)
            load.stop()
            written, before = running.written(), running.stored()
            lagged += len(set(written) - set(before))
            row.tried += len(written)
            reingest = subprocess.run(
                [*CLI, "collect", "--reingest", str(running.out), "--store", str(running.store)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if reingest.returncode != 0 or "Traceback" in reingest.stderr:
                row.crashes += 1
            stored = running.stored()
        row.lost += sum(1 for tid, trace in written.items() if stored.get(tid) != len(trace["steps"]))  # type: ignore[arg-type]
    row.note = f"tried = traces in the files; the store lagged them by {lagged} before --reingest, lost counts after"
    return row


# -- 2. memory ---------------------------------------------------------------------------------------------------
def probe_memory(requests: int) -> Row:
    """The original flood (gzip requests of 60 spans with 1 MiB attributes, roots never sent, 8 at once) against a
    receiver in this process bounded to 64 MiB buffered and 64 MiB in flight: RSS growth is printed beside them."""
    row = Row("flood of 1 MiB-attribute spans (memory)")
    bound = 64 * 2**20
    receiver = OTLPReceiver(
        lambda trace: None,
        http=("127.0.0.1", 0),
        limits=ReceiverLimits(max_inflight_bytes=bound),
        buffer_limits=BufferLimits(max_buffered_bytes=bound, max_bytes_per_trace=16 * 2**20, ttl_s=600),
    ).start()
    bodies = [huge_spans_body(600 + number, 60, 2**20) for number in range(requests)]  # before the first sample
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    answers: list[int] = []
    try:
        with PeakRss() as rss, httpx.Client(timeout=TIMEOUT_S * 2) as client:

            def post(body: bytes) -> None:
                response = _post(client, url, body, PROTOBUF | {"Content-Encoding": "gzip"}, row)
                if response is not None:
                    with _COUNTING:
                        answers.append(response.status_code)
                        row.wrong_status += response.status_code not in (200, 429)

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(post, bodies))
    finally:
        receiver.shutdown(60_000)
    row.note = (
        f"RSS growth {rss.growth / 2**20:.0f} MiB for {requests * 60} MiB of attributes sent "
        f"(bounds {2 * bound / 2**20:.0f} MiB); answers 200: {answers.count(200)}, 429: {answers.count(429)}"
    )
    return row


# -- 4. files at the command line ---------------------------------------------------------------------------------
def _trail_file(folder: Path, name: str, spans: object) -> Path:
    """A TRAIL trace file (``spans`` as objects, or as JSON text already written)."""
    traces = folder / name / "traces"
    traces.mkdir(parents=True)
    path = traces / ("e" * 32 + ".json")
    text = spans if isinstance(spans, str) else json.dumps(spans)
    path.write_text(f'{{"trace_id": "{"e" * 32}", "spans": {text}}}')
    return path


def _trail_span(span_id: str, parent: str, timestamp: str = "2025-01-01T00:00:00Z", **extra: object) -> object:
    attributes = {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": "thought"}
    return {
        "span_id": span_id,
        "parent_span_id": parent,
        "timestamp": timestamp,
        "span_name": "llm",
        "span_attributes": attributes,
        "child_spans": [],
    } | extra


def _malformed_files(folder: Path) -> list[Path]:
    """The shapes of input that once crashed, hung or lost files beside them: 34 files."""
    good_otlp = json.dumps(json_trace(7))
    texts: dict[str, str | bytes] = {
        "truncated.json": good_otlp[: len(good_otlp) // 2],
        "empty.json": "",
        "blank.json": "  \n\t ",
        "garbage.json": bytes(random.Random(SEED).randbytes(4096)),
        "utf16.json": good_otlp.encode("utf-16"),
        "bom.json": b"\xef\xbb\xbf" + good_otlp.encode(),
        "array.json": "[1, 2, 3]",
        "string.json": '"just a string"',
        "null.json": "null",
        "number.json": "1e400",
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep_object.json": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "infinity.json": good_otlp.replace('"1000"', "Infinity"),
        "nan.json": good_otlp.replace('"9000"', "NaN"),
        "minus_infinity.json": good_otlp.replace('"2050"', "-Infinity"),
        "surrogate.json": good_otlp.replace('"question 7"', '"\\ud800 question"'),
        "huge_time.json": good_otlp.replace('"9000"', '"1e30"'),
        "negative_time.json": good_otlp.replace('"1000"', '"-1000"'),
        "huge_tokens.json": good_otlp.replace('"12"', f'"{2**70}"'),
        "spans_not_list.json": good_otlp.replace('"spans": [', '"spans": {"x": [', 1).replace("}]}]}", "}]}}]}"),
        "bad_trace_id.json": good_otlp.replace(trace_id(7), "not-hex-at-all"),
        "attributes_not_list.json": good_otlp.replace('"attributes": [', '"attributes": {"k": [', 1),
        "no_resource_spans.json": json.dumps({"something": "else"}),
        "bad_lines.jsonl": f"{good_otlp}\n{{oops\n{good_otlp.replace(trace_id(7), trace_id(8))}\n",
        "bbm_missing_fields.jsonl": json.dumps({"input": "q"}) + "\n",
    }
    paths = []
    for name, text in texts.items():
        path = folder / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        paths.append(path)
    ids = [c * 16 for c in "abcd"]
    paths += [
        _trail_file(folder, "trail_cycle", [_trail_span(ids[i], ids[i % 3 + 1]) for i in range(1, 4)]),
        _trail_file(folder, "trail_year_one", [_trail_span(ids[0], "None", "0001-01-01T00:00:00Z")]),
        _trail_file(folder, "trail_bad_time", [_trail_span(ids[0], "None", "yesterday")]),
        _trail_file(folder, "trail_spans_object", {"a": 1}),
        _trail_file(folder, "trail_deep", _deep_trail(5_000)),
        _trail_file(folder, "trail_self_parent", [_trail_span(ids[0], ids[0])]),
        _trail_file(folder, "trail_nan_time", [_trail_span(ids[0], "None", float("nan"))]),
        _trail_file(folder, "trail_child_not_object", [_trail_span(ids[0], "None", child_spans=[1, "x", None])]),
        _trail_file(folder, "trail_huge_duration", [_trail_span(ids[0], "None", duration="9" * 40)]),
    ]
    return paths


def _deep_trail(depth: int) -> str:
    """Spans nested ``depth`` deep, as JSON text (deeper than Python's own encoder goes)."""
    head = json.dumps(_trail_span("{id}", "None"))[:-3]  # cut the closing '[]}' of child_spans
    opening = "".join("[" + head.replace("{id}", f"{level + 1:016x}") for level in range(depth))
    return opening + "[]" + "}]" * depth


def probe_files(folder: Path, limit: int | None = None) -> Row:
    """Each malformed file imported beside a good one (and shown, when it is JSONL). Right: exit 1 with a line that
    names the file, or exit 0 when the file's own traces were written whole (a value replaced or clamped, with a
    warning on the trace); either way the good file's trace is written."""
    row = Row("malformed files (import, show)")
    good = folder / "good.json"
    good.write_text(json.dumps(json_trace(9)))
    for path in _malformed_files(folder)[:limit]:
        out = path.with_name(path.name + ".out.jsonl")
        commands = [[*CLI, "import", str(good), str(path), "-o", str(out)]]
        if path.suffix == ".jsonl":
            commands.append([*CLI, "show", str(path)])
        for command in commands:
            row.tried += 1
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                row.hangs += 1
                row.saw(f"{command[3]} {path}: no answer in {TIMEOUT_S:.0f} s")
                continue
            written = out.read_text().splitlines() if command[3] == "import" and out.exists() else []
            if "Traceback" in done.stderr or done.returncode not in (0, 1, 2):
                row.crashes += 1
            elif done.returncode == 1 and str(path) in done.stderr:
                pass  # named, and refused or partly kept
            elif done.returncode == 0 and (command[3] == "show" or len(written) >= 2):
                pass  # read whole: sanitized where it had to be
            else:
                row.wrong_status += 1
            if row.crashes + row.wrong_status > len(row.seen):
                row.saw(f"{command[3]} {path.name}: exit {done.returncode}, {done.stderr.strip()[-300:]}")
            if command[3] == "import" and not any(trace_id(9) in line for line in written):
                row.lost += 1
                row.saw(f"import {path.name}: the good file's trace is missing")
    row.note = "tried = commands run; lost = the good file's trace missing from the output"
    return row


# -- 5. sql -------------------------------------------------------------------------------------------------------
def _sql_statements(folder: Path, secret: Path) -> list[str]:
    target = folder / "written"
    return [
        f"COPY traces TO '{target}.csv'",
        f"COPY (SELECT 'x') TO '{target}.sh' (FORMAT csv, HEADER false)",
        f"EXPORT DATABASE '{target}_dump'",
        f"SELECT * FROM read_text('{secret}')",
        f"SELECT * FROM read_blob('{secret}')",
        f"SELECT * FROM read_csv('{secret}')",
        "SELECT * FROM read_csv_auto('/etc/passwd')",
        f"SELECT * FROM read_json('{secret}')",
        f"SELECT * FROM read_parquet('{secret}')",
        "SELECT * FROM glob('/root/*')",
        "SELECT * FROM read_text('/proc/self/environ')",
        f"SELECT * FROM sniff_csv('{secret}')",
        f"ATTACH '{target}.duckdb' AS other",
        f"ATTACH '{target}.duckdb' AS other (READ_WRITE)",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET enable_external_access",
        "SET autoinstall_known_extensions = true",
        "INSTALL httpfs",
        "LOAD httpfs",
        "FORCE INSTALL json",
        "SELECT * FROM 'https://example.com/x.csv'",
        "CREATE TABLE pwned AS SELECT 1",
        "DROP TABLE traces",
        "DELETE FROM traces",
        "UPDATE traces SET question = 'x'",
        "INSERT INTO traces (trace_id) VALUES ('x')",
        f"SET temp_directory = '{target}_tmp'",
        "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
        f"SELECT * FROM '{secret}'",
    ]


def probe_sql(folder: Path, limit: int | None = None) -> Row:
    """30 statements that read or write outside the store, or change it: each refused, the store unchanged, no file
    appears; a store query still answers afterwards."""
    row = Row("sql statements outside the store")
    store = folder / "sql.duckdb"
    subprocess.run([*CLI, "import", "--example", "-o", str(folder / "examples.jsonl")], capture_output=True, check=True)
    subprocess.run(
        [*CLI, "collect", "--reingest", str(folder / "examples.jsonl"), "--store", str(store)],
        capture_output=True,
        check=True,
    )
    secret = folder / "secret.txt"
    secret.write_text("OPENAI_API_KEY=sk-test-0123456789abcdef")
    before = sorted(p.name for p in folder.iterdir())
    for statement in _sql_statements(folder, secret)[:limit]:
        row.tried += 1
        try:
            done = subprocess.run(
                [*CLI, "sql", statement, "--store", str(store)], capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            row.hangs += 1
            continue
        if "Traceback" in done.stderr:
            row.crashes += 1
            row.saw(f"{statement}: {done.stderr.strip()[-300:]}")
        elif done.returncode != 2:
            row.wrong_status += 1
            row.saw(f"{statement}: exit {done.returncode}, {done.stdout.strip()[:200]}")
        if "sk-test" in done.stdout or "root:" in done.stdout:
            row.other += 1
            row.saw(f"{statement}: printed {done.stdout.strip()[:200]}")
    created = set(p.name for p in folder.iterdir()) - set(before)
    row.other += len(created)
    if created:
        row.saw(f"files created: {sorted(created)}")
    check = subprocess.run(
        [*CLI, "sql", "SELECT count(*) AS n FROM traces", "--store", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if check.returncode != 0 or json.loads(check.stdout)[0]["n"] < 1:
        row.lost += 1
    row.note = "other = secrets printed or files created; lost = the store no longer answers its own query"
    return row


# -- 6. contention --------------------------------------------------------------------------------------------------
def probe_contention(folder: Path, rounds: int) -> Row:
    row = Row("200 concurrent posts; a second collect on taken ports")
    answered: dict[int, int] = {}
    with collecting(folder) as running:
        payloads = [json.dumps(json_trace(7_000_000 + n)).encode() for n in range(200 * rounds)]
        with httpx.Client(timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=200)) as client:
            acknowledged: list[str] = []
            lock = threading.Lock()

            def post(n: int) -> None:
                response = _post(client, running.url, payloads[n], JSON, row)
                if response is None:
                    return
                with lock:
                    answered[response.status_code] = answered.get(response.status_code, 0) + 1
                    if response.status_code == 200:
                        acknowledged.append(trace_id(7_000_000 + n))
                    elif response.status_code != 503 or response.headers.get("retry-after") is None:
                        row.wrong_status += 1

            for group in range(rounds):
                with ThreadPoolExecutor(max_workers=200) as pool:
                    list(pool.map(post, range(group * 200, group * 200 + 200)))
        for taken in (["--http", f"127.0.0.1:{running.http_port}"], ["--grpc", f"127.0.0.1:{running.grpc_port}"]):
            row.tried += 1
            command = [*CLI, "collect", *taken, "--out", str(folder / "second.jsonl"), "--no-store", "--duration", "3"]
            if taken[0] == "--grpc":
                command += ["--http", "off"]
            second = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
            if "Traceback" in second.stderr:
                row.crashes += 1
            elif second.returncode == 0:  # started on a port another collector holds
                row.wrong_status += 1
        running.stop()
        _ended_badly(row, running)
        written, stored = running.written(), running.stored()
    row.lost = _missing(acknowledged, written, stored)
    row.note = "answers " + ", ".join(f"{k}: {v}" for k, v in sorted(answered.items()))
    return row


# -- 7. secrets -----------------------------------------------------------------------------------------------------
SECRETS = (  # (text as written, the part that must never be stored)
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"),
    ("key sk-proj-AbCdEf0123456789xyzAbCdEf01 here", "sk-proj-AbCdEf0123456789xyzAbCdEf01"),
    ("key sk-ant-api03-0123456789abcdefABCDEF here", "sk-ant-api03-0123456789abcdefABCDEF"),
    ("id AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("id ASIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("postgres://admin:hunter2secret@db.internal/app", "hunter2secret"),
    ("https://user:p4ssw0rd-value@example.com/path", "p4ssw0rd-value"),
)


def probe_secrets(folder: Path) -> Row:
    """Each secret in the question, a tool's arguments and a tool's result, over HTTP: none may reach the file or
    the store verbatim."""
    row = Row("secrets in questions, tool arguments and results")
    acknowledged: list[str] = []
    with collecting(folder) as running, httpx.Client(timeout=TIMEOUT_S) as client:
        for n, (secret, _) in enumerate(SECRETS):
            request = json_trace(8_000_000 + n, text=f"result holds {secret}")
            spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]  # type: ignore[index]
            spans[0]["attributes"][1]["value"]["stringValue"] = f"question with {secret}"
            spans[1]["attributes"].append({"key": "tool.parameters", "value": {"stringValue": secret}})
            text = json.dumps(request)
            response = _post(client, running.url, text.encode(), JSON, row)
            if response is not None and response.status_code == 200:
                acknowledged.append(trace_id(8_000_000 + n))
            elif response is not None:
                row.wrong_status += 1
        running.stop()
        _ended_badly(row, running)
        written, stored = running.written(), running.stored()
        file_text = running.out.read_text() if running.out.exists() else ""
        with duckdb.connect(str(running.store), read_only=True) as db:
            store_text = " ".join(str(r) for r in db.execute("SELECT trace_json FROM traces").fetchall())
    row.lost = _missing(acknowledged, written, stored)
    row.other = sum(1 for _, value in SECRETS for text in (file_text, store_text) if value in text)
    row.note = f"other = secrets found verbatim ({len(SECRETS)} secrets x file and store)"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tenth of the fuzzed bodies, fewer runs")
    parser.add_argument("--only", default="", help="run only the probes whose function name contains this")
    add_smoke_option(parser)
    args = parser.parse_args(argv)
    # (share of the fuzzed bodies, shutdown runs, kill runs, flood requests, contention rounds, files and statements)
    scale, shutdowns, kills, flood, contention, cases = (
        (0.01, 1, 1, 2, 1, 3) if args.smoke else (0.1, 2, 1, 8, 1, None) if args.quick else (1.0, 4, 3, 40, 3, None)
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="reflect-hardening-") as tmp:
        folder = Path(tmp)
        probes: dict[str, Callable[[], list[Row]]] = {
            "fuzz": lambda: probe_fuzz(folder, scale),
            "bad_values": lambda: [probe_bad_values(folder)],
            "framing": lambda: [probe_framing(folder)],
            "shutdown": lambda: [probe_shutdown(folder, shutdowns)],
            "kill": lambda: [probe_kill(folder, kills)],
            "memory": lambda: [probe_memory(flood)],
            "files": lambda: [probe_files(folder / "files", cases)],
            "sql": lambda: [probe_sql(folder / "sql", cases)],
            "contention": lambda: [probe_contention(folder, contention)],
            "secrets": lambda: [probe_secrets(folder)],
        }
        (folder / "files").mkdir()
        (folder / "sql").mkdir()
        for name, probe in probes.items():
            if args.only not in name:
                continue
            started = time.monotonic()
            for row in probe():
                rows.append(row)
                print(f"{row.probe}: {row.failures} failure(s) ({time.monotonic() - started:.0f} s)", file=sys.stderr)
                for what in row.seen[:10]:
                    print(f"  {what}", file=sys.stderr, flush=True)
    print("| probe | tried | crashes | hangs | lost | wrong status | other | note |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.probe} | {row.tried} | {row.crashes} | {row.hangs} | {row.lost} | {row.wrong_status} | "
            f"{row.other} | {row.note.lstrip('; ')} |"
        )
    print(f"hardening_failures={sum(row.failures for row in rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
