"""Helpers shared by the test files: small spaces, specs, batches and Trainers for Learner tests.

Test files import them (``from _helpers import bc_spec``); ``tests/conftest.py`` holds only pytest's
hooks and fixtures, so that pytest-xdist's controller, which loads it but runs no test, does not
import torch and Lightning.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCModule
from lightning_rl.core.train_item import TrainingData, TrainItem

# The GPU lane (tests marked ``gpu``, run by benchmarks/gpu_check.sh) skips without CUDA. With
# LIGHTNING_RL_GPU_LANE=cpu it runs on the CPU instead, so the lane itself can be checked without a GPU.
GPU_LANE_ON_CPU = os.environ.get("LIGHTNING_RL_GPU_LANE") == "cpu"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bc_spec(hiddens: tuple[int, ...] = (8,)) -> RLModuleSpec:
    return RLModuleSpec(
        module_class=BCModule,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        model_config={"fcnet_hiddens": list(hiddens)},
    )


def random_batch(rows: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, 4)).astype(np.float32)
    return {Columns.OBS: obs, Columns.ACTIONS: (obs[:, 0] > 0).astype(np.int64)}


def random_train_items(count: int, rows: int = 48) -> list[TrainItem]:
    """``count`` train items of ``random_batch(rows, seed=i)``, with the env steps sampled so far as timesteps."""
    return [
        TrainItem(
            TrainingData(batch=random_batch(rows, seed=i)), timesteps={"num_env_steps_sampled_lifetime": rows * (i + 1)}
        )
        for i in range(count)
    ]


def weights(learner: Any, module_id: str = "default_policy") -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in learner.module[module_id].state_dict().items()}


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Equal nested dicts/lists of tensors (bit for bit) and plain values; the error names the key."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{where}: keys differ"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), f"{where}: lengths differ"
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{index}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(actual, expected), f"{where}: tensors differ"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def make_trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return Trainer(**options)


def loader_of(items: list[Any]) -> DataLoader:
    """A DataLoader that yields each item as it is (one train item per step)."""
    return DataLoader(items, batch_size=None)


def resealed(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A Lightning checkpoint edited by a test, with its checksums computed again.

    A crafted file carries valid checksums (whoever crafts it computes them too); without
    them the checksum check, not the check a test is about, would refuse it.
    """
    from lightning_rl.core.checkpoint import (
        CHECKPOINT_KEY,
        CHECKSUM_KEY,
        LEARNER_CHECKSUM_KEY,
        add_learner_checksum,
        with_checksum,
    )

    if LEARNER_CHECKSUM_KEY in checkpoint[CHECKPOINT_KEY]:
        add_learner_checksum(checkpoint)
    return with_checksum(checkpoint) if CHECKSUM_KEY in checkpoint else checkpoint


def usage_error(main: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a command's ``main(args)`` prints for bad input (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


def fit_small_self_play(root: Path) -> Any:
    """``examples/ppo_connect_four_selfplay.yaml`` shrunk to 192 moves, fit in ``root``; the CLI object.

    Its ``root / "checkpoints" / "last.ckpt"`` holds ``main``, the league's fixed opponents and ``main_v0``.
    """
    from lightning_rl.cli import LightningRLCLI

    examples = Path(__file__).resolve().parent.parent / "examples"
    return LightningRLCLI(
        args=[
            "fit", "--config", str(examples / "ppo_connect_four_selfplay.yaml"),
            "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "16",
            "--data.init_args.rollouts_per_epoch", "6", "--data.init_args.evaluation_num_episodes", "2",
            "--data.init_args.max_env_steps", "192", "--model.init_args.minibatch_size", "32",
            "--model.init_args.num_epochs", "1", "--model.init_args.model_config", '{"fcnet_hiddens": [16]}',
        ]
    )  # fmt: skip


class CoinLengthEnv(gym.Env):
    """Episodes of 1 or 40 steps, a fair coin of the env's seeded RNG at each reset; reward 1 a step."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length = self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.length, self.t = (1, 40)[int(self.np_random.integers(2))], 0
        return np.array([self.length, 0], np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.length, self.t], np.float32), 1.0, self.t >= self.length, False, {}
