"""Export: ONNX (run with onnxruntime) and ``torch.export`` act as ``Policy.act`` does, for every algorithm.

The exported graph holds the observation normalization, the greedy action and Box clipping;
its batch dimension is dynamic. A file is written only after that check, and atomically.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from _algorithms import ROWS, AlgorithmRow
from _policy_common import observations, run_export

from lightning_rl import Policy
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.core.checkpoint import TEMPORARY_PREFIX
from lightning_rl.core.normalization import ObservationNormalization
from lightning_rl.policy import export as export_module
from lightning_rl.policy.export import ExportCheckError, export_policy

ROW_IDS = [row.name for row in ROWS]
TOLERANCE = 1e-5
NUM_OBSERVATIONS = 1_000
SUFFIX = {"onnx": ".onnx", "torch": ".pt2"}


def normalized_policy(module: torch.nn.Module) -> Policy:
    shape = module.observation_space.shape
    normalization = ObservationNormalization(np.full(shape, 0.5), np.full(shape, 0.25), clip=5.0, epsilon=1e-8)
    return Policy(module, observation_normalization=normalization)


def assert_same_actions(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("export_format", ["onnx", "torch"])
@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_the_exported_graph_acts_as_policy_act_on_1000_observations_and_any_batch_size(
    row: AlgorithmRow, export_format: str, tmp_path: Path
):
    torch.manual_seed(0)
    policy = normalized_policy(row.module_spec().build())
    path = export_policy(policy, tmp_path / f"policy{SUFFIX[export_format]}", export_format)

    obs = observations(policy.observation_space, NUM_OBSERVATIONS, seed=7)
    assert_same_actions(run_export(path, obs), policy.act(obs))
    for batch in (1, 3):
        assert_same_actions(run_export(path, obs[:batch]), policy.act(obs[:batch]))


@pytest.mark.parametrize("export_format", ["onnx", "torch"])
def test_the_exported_graph_includes_the_normalization_and_the_clipping(export_format: str, tmp_path: Path):
    env = gym.make("Pendulum-v1")
    torch.manual_seed(0)
    module = PPOModule(env.observation_space, env.action_space, {"fcnet_hiddens": [8]})
    policy = normalized_policy(module)
    obs = observations(policy.observation_space, NUM_OBSERVATIONS, seed=7)
    path = export_policy(policy, tmp_path / f"normalized{SUFFIX[export_format]}", export_format)
    exported = run_export(path, obs)
    assert_same_actions(exported, policy.act(obs))
    assert not np.allclose(exported, Policy(module).act(obs), atol=1e-3)  # normalization changes the actions

    with torch.no_grad():
        module.pi[-1].bias[0] = 100.0  # the greedy action, unclipped, lies far above the bound 2
    path = export_policy(Policy(module), tmp_path / f"clipped{SUFFIX[export_format]}", export_format)
    np.testing.assert_array_equal(run_export(path, obs), np.full((NUM_OBSERVATIONS, 1), 2.0, dtype=np.float32))


def test_an_export_that_fails_its_check_leaves_the_existing_file_untouched(tmp_path: Path, monkeypatch):
    row = next(row for row in ROWS if row.name == "SAC")
    policy = Policy(row.module_spec().build())
    output = tmp_path / "policy.pt2"
    export_policy(policy, output, "torch")
    before = output.read_bytes()

    def wrong_runner(content: bytes):
        return lambda observations: np.zeros((len(observations), 1), dtype=np.float32) + 3.0

    monkeypatch.setattr(export_module, "_torch_export_runner", wrong_runner)
    with pytest.raises(ExportCheckError, match="the torch export's actions differ from Policy.act's by up to"):
        export_policy(policy, output, "torch")
    assert output.read_bytes() == before
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(TEMPORARY_PREFIX)]


def test_an_existing_output_file_is_replaced_by_the_new_export(tmp_path: Path):
    row = next(row for row in ROWS if row.name == "DQN")
    output = tmp_path / "policy.onnx"
    output.write_bytes(b"an older file")
    policy = Policy(row.module_spec().build())
    export_policy(policy, output, "onnx")
    obs = observations(policy.observation_space, 10)
    assert_same_actions(run_export(output, obs), policy.act(obs))


def test_bad_arguments_are_refused_before_anything_is_exported(tmp_path: Path):
    policy = Policy(ROWS[0].module_spec().build())
    with pytest.raises(ValueError, match=r"unknown export format 'tflite'; expected one of \['onnx', 'torch'\]"):
        export_policy(policy, tmp_path / "policy.tflite", "tflite")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the directory .*missing does not exist"):
        export_policy(policy, tmp_path / "missing" / "policy.onnx", "onnx")
    with pytest.raises(ValueError, match="it is a directory"):
        export_policy(policy, tmp_path, "onnx")
