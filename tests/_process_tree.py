"""The processes below a command: which ones there are, which still run, and a command signalled while its env hangs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def descendants(pid: int) -> dict[int, str]:
    """``{pid: start time}`` of every process below ``pid``, read from /proc."""
    parents, started = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it exited meanwhile
            parents[int(entry)], started[int(entry)] = int(fields[1]), fields[19]
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = started[child]
                frontier.append(child)
    return found


def still_running(processes: dict[int, str]) -> list[int]:
    """The processes of ``processes`` (``descendants``'s) still running: same pid and start time, not a zombie."""
    running = []
    for pid, start in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            running.append(pid)
    return running


def signal_once_hanging(command: list[str], marker: Path, signum: int) -> tuple[int, str, dict[int, str]]:
    """Run ``command`` until its env hangs, send it ``signum``, and wait for its exit.

    The hanging env writes its process id to ``marker`` as it starts its hang.

    Returns:
        Its exit status, its output, and the processes that were below it when it was signalled.
    """
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), f"the env never reached its hang:\n{process.communicate(timeout=60)[0][-3000:]}"
        time.sleep(0.5)  # the worker is in its sleep() now
        below = descendants(process.pid)
        assert int(marker.read_text()) in below  # the hung worker is found
        process.send_signal(signum)
        output, _ = process.communicate(timeout=60)  # the hangs last far longer
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    deadline = time.monotonic() + 30  # the fork server and its workers exit with it
    while still_running(below) and time.monotonic() < deadline:
        time.sleep(0.2)
    return process.returncode, output, below
