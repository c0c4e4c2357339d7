"""pytest's hooks and fixtures for the whole suite; the helpers test files import are in ``tests/_helpers.py``.

Nothing heavy is imported at the top of this file: pytest-xdist's controller loads it too and runs
no test, and importing torch and Lightning there would delay the workers' start by ~10 s.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Set one intra-op thread and start the fork server, in every process that runs tests.

    Not in pytest-xdist's controller (``-n``), which runs none. One thread: tests may run beside
    other processes on 2 cores (see docs/tutorials/scaling.md, "Threads"). The fork server is the
    one ranks, learners, samplers and env workers fork from, torch and Lightning imported.
    """
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch
    from ranks import start_fork_server

    torch.set_num_threads(1)
    start_fork_server()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the GPU lane's tests (marked ``gpu``) without CUDA, unless ``LIGHTNING_RL_GPU_LANE=cpu``."""
    import torch
    from _helpers import GPU_LANE_ON_CPU

    if torch.cuda.is_available() or GPU_LANE_ON_CPU:
        return
    skip = pytest.mark.skip(reason="runs on CUDA; no CUDA device here (LIGHTNING_RL_GPU_LANE=cpu runs it on the CPU)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(0)


@pytest.fixture
def import_benchmark(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import a script of ``benchmarks/`` by its name (``import_benchmark("suite")``).

    The scripts import their siblings by name, so ``benchmarks/`` is on ``sys.path`` for the test.
    """
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module
