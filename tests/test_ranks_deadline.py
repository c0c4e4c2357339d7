"""tests/ranks.py's deadline: ranks that are only slow (a loaded machine) finish, a hang still fails fast.

A fixed 40 s deadline failed two DDP tests on a busy 2-core machine (load average 9-12) whose
ranks were working, only slowly. The deadline now counts time without progress (CPU used by
the ranks), with a ceiling for work that never ends. That ceiling was 10 x the timeout of wall
time, which the busy ranks below overran when the test itself ran under ``nice -n 10`` at load
11 (their start, imports included, took most of it); it now leaves out the time a rank waited
for a CPU.
"""

from __future__ import annotations

import os
import time

import pytest
from ranks import run_on_ranks


def _busy_main(rank: int, world_size: int, seconds: float) -> int:
    # Busy for `seconds` of wall time: what a rank does on a machine slower than the test expected.
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
    return rank


def _spin_main(rank: int, world_size: int) -> None:
    while True:  # a loop that never ends: it uses CPU all along
        pass


def _hang_main(rank: int, world_size: int) -> None:
    time.sleep(3600)  # a collective no one joins, a lock: no CPU used


def _dies_main(rank: int, world_size: int) -> None:
    if rank == 1:
        os._exit(3)
    time.sleep(3600)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="progress is read from /proc (Linux)")
def test_ranks_that_work_past_the_timeout_finish():
    assert run_on_ranks(_busy_main, 6.0, timeout=3) == [0, 1]


def test_a_hang_fails_within_about_the_timeout_naming_it():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="made no progress|did not finish"):
        run_on_ranks(_hang_main, timeout=4)
    assert time.monotonic() - start < 60


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="progress is read from /proc (Linux)")
def test_a_loop_that_never_ends_fails_at_the_ceiling_naming_the_rank():
    with pytest.raises(AssertionError, match=r"rank 0 ran \d+ s .*more than 10 x 1 s: a loop that never ends"):
        run_on_ranks(_spin_main, world_size=1, timeout=1)


def test_a_rank_that_dies_fails_at_once_naming_it():
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"died without a result: \[1\]"):
        run_on_ranks(_dies_main, timeout=120)
    assert time.monotonic() - start < 60
