"""Every checkpoint writer x every algorithm loads: ``Learner.from_checkpoint``, ``load_from_checkpoint``, ``Policy``.

Writers (``tests/_policy_common.py``): ``lightning-rl fit``, a Python ``Trainer.fit`` with
``ModelCheckpoint``, ``Learner.save_to_path`` and ``LearnerGroup.save_to_path``. Each row
trains briefly (two train items) per writer, once per module.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from _algorithms import ROWS, AlgorithmRow
from _policy_common import WRITERS, WrittenCheckpoint, greedy_actions, module_weights, observations, write_checkpoints
from _helpers import assert_same_tensors

from lightning_rl import DEFAULT_MODULE_ID, Learner, Policy

ROW_IDS = [row.name for row in ROWS]
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoints_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[AlgorithmRow], dict[str, WrittenCheckpoint]]:
    """The row's checkpoints of every writer, written on first use and shared by this module's tests."""
    written: dict[str, dict[str, WrittenCheckpoint]] = {}

    def of(row: AlgorithmRow) -> dict[str, WrittenCheckpoint]:
        if row.name not in written:
            written[row.name] = write_checkpoints(row, tmp_path_factory.mktemp(row.name))
        return written[row.name]

    return of


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_from_checkpoint_and_load_from_checkpoint_load_every_writers_checkpoint(row, writer, checkpoints_of):
    written = checkpoints_of(row)[writer]
    loaded = [
        Learner.from_checkpoint(str(written.path)),
        row.learner_class.from_checkpoint(str(written.path)),
        Learner.load_from_checkpoint(written.path),
        row.learner_class.load_from_checkpoint(written.path),
    ]
    for learner in loaded:
        assert type(learner) is row.learner_class
        assert_same_tensors(module_weights(learner), written.weights)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_policy_from_checkpoint_acts_as_the_learners_greedy_action(row, writer, checkpoints_of):
    written = checkpoints_of(row)[writer]
    policy = Policy.from_checkpoint(written.path)
    assert_same_tensors(dict(policy.module.state_dict()), written.weights)

    learner_module = Learner.from_checkpoint(str(written.path)).module[DEFAULT_MODULE_ID]
    obs = observations(policy.observation_space, 256)
    expected = greedy_actions(learner_module, torch.from_numpy(obs)).numpy()
    actions = policy.act(obs)
    assert isinstance(actions, np.ndarray) and actions.shape == expected.shape
    np.testing.assert_array_equal(actions, expected)


def test_a_fresh_process_loads_a_command_line_checkpoint_after_importing_only_lightning_rl(checkpoints_of):
    # In this process the algorithms are imported already; a user's script imports lightning_rl alone.
    row = next(row for row in ROWS if row.name == "PPO")
    path = checkpoints_of(row)["cli"].path
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        torch.set_num_threads(1)
        from lightning_rl import Learner, Policy
        learner = Learner.from_checkpoint({str(path)!r})
        policy = Policy.from_checkpoint({str(path)!r})
        print(type(learner).__name__, type(policy.module).__name__, policy.act([0.0, 0.0, 0.0, 0.0]).shape)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["PPOLearner", "PPOModule", "()"]
