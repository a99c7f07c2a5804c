"""A server reflect-otel starts (the local llama.cpp server) ends with the process that started it, also when that
process is killed and never runs its cleanup: an orphaned model server keeps every core busy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from reflect_otel.testing import wait_until

STARTER = """
import subprocess, sys
from reflect_otel.llm.local import tied_to_this_process
# the server's own output goes elsewhere: on this pipe it could come before the pid (seen under load)
child = subprocess.Popen(
    tied_to_this_process("http.server", "0", "--bind", "127.0.0.1"),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
print(child.pid, flush=True)
child.wait()
"""


def _listening(pid: int) -> bool:
    """True once process ``pid`` holds a listening TCP socket (Linux /proc: its socket inodes in /proc/net/tcp)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    listening = {f"socket:[{row.split()[9]}]" for row in table if row.split()[3] == "0A"}
    return bool(inodes & listening)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; its new parent may not reap it at once


def test_a_tied_server_ends_when_its_starter_is_killed() -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    try:
        server = int(starter.stdout.readline())
        # the server runs while its starter does: it comes to listen on a loopback port
        wait_until(lambda: _listening(server), 30, "the tied server to listen")
        assert _running(server)
    finally:
        starter.kill()  # kill -9: no atexit, no stop(); also when the test fails above, so nothing is left running
        starter.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _running(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(server), "the server outlived the process that started it"


def test_the_tied_command_runs_the_module_with_its_arguments(tmp_path: Path) -> None:
    from reflect_otel.llm.local import tied_to_this_process

    source = tmp_path / "in.json"
    source.write_text('{"a": [1, 2]}')
    done = subprocess.run(
        tied_to_this_process("json.tool", "--compact", str(source)), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"a":[1,2]}'
