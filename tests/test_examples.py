"""The examples run and do what their docstrings promise."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_custom_learner_clones_the_cartpole_expert():
    results = _load_example("custom_learner").main(["--updates", "30", "--eval-episodes", "10"])
    assert results["final_loss"] < 0.25 * math.log(2)
    assert results["mean_return"] > 400
