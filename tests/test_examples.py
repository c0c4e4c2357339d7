"""The examples run and do what their docstrings promise."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_custom_learner_clones_the_cartpole_expert_and_logs_to_tensorboard(tmp_path: Path):
    results = _load_example("custom_learner").main(
        ["--updates", "30", "--eval-episodes", "10", "--log-dir", str(tmp_path)]
    )
    assert results["final_loss"] < 0.25 * math.log(2)
    assert results["mean_return"] > 400

    events = EventAccumulator(results["log_dir"])
    events.Reload()
    losses = [event.value for event in events.Scalars("default_policy/total_loss")]
    assert len(losses) == 30 and losses[-1] < losses[0]
    assert {"default_policy/default_optimizer_learning_rate", "__all_modules__/num_env_steps_trained_lifetime"} <= set(
        events.Tags()["scalars"]
    )
