"""The GPU lane: every example config, strategies, precision, compile and CUDA graphs, a GPU checkpoint on the CPU.

Every test here is marked ``gpu``: it skips without CUDA (tests/conftest.py), so CI stays green,
and ``bash benchmarks/gpu_check.sh`` runs them on a GPU machine with ``pytest -m gpu -n 8``.
``LIGHTNING_RL_GPU_LANE=cpu`` runs the same tests on the CPU (slow; to check the lane itself).

Each fit is ``python -m lightning_rl fit --config examples/<config> --trainer.accelerator gpu
--trainer.devices 1`` in a process of its own (2 threads), the example's own settings with only
the sizes shrunk (budget, rollouts, evaluation: the flags of tests/test_suite_examples.py,
test_multi_agent_fit.py and test_offline_examples.py), and ``tests/_gpu_probe.py``'s callback
added: it writes down where the weights were during fit, the strategy, the precision and the
final metrics, which the tests check with the checkpoint the run wrote.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import GPU_LANE_ON_CPU

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TESTS = Path(__file__).resolve().parent
# On the CPU (LIGHTNING_RL_GPU_LANE=cpu) the same runs check the lane's plumbing.
ACCELERATOR, DEVICE = ("cpu", "cpu") if GPU_LANE_ON_CPU and not torch.cuda.is_available() else ("gpu", "cuda")
FIT_TIMEOUT_S = 300

_EVALUATION = ["--data.init_args.evaluation_num_episodes", "1", "--data.init_args.evaluation_num_envs", "1"]
_PPO = ["--data.init_args.rollouts_per_epoch", "1", "--model.init_args.num_epochs", "1", *_EVALUATION]
_OFF_POLICY = [
    "--data.init_args.max_env_steps", "300", "--data.init_args.learning_starts", "100",
    "--data.init_args.replay_buffer_capacity", "1000", *_EVALUATION,
]  # fmt: skip
_MULTI_AGENT = ["--data.init_args.rollout_fragment_length", "25", "--data.init_args.evaluation_num_episodes", "2"]
_OFFLINE = [
    "--trainer.max_epochs=1", "--data.batch_size=16", "--data.updates_per_epoch=3",
    "--data.evaluation_num_episodes=1",
]  # fmt: skip

# config -> (the package its env needs, flags that shrink it to a few hundred env steps)
CONFIGS: dict[str, tuple[str | None, list[str]]] = {
    "ppo_cartpole.yaml": (None, [*_PPO, "--data.init_args.max_env_steps", "512"]),
    "ppo_cartpole_novel_lstm.yaml": (None, [*_PPO, "--data.init_args.max_env_steps", "512"]),
    "ppo_pendulum.yaml": (None, [
        *_PPO, "--data.init_args.rollout_fragment_length", "32", "--data.init_args.max_env_steps", "512",
    ]),
    "ppo_popgym_lstm.yaml": ("popgym", [
        *_PPO, "--data.init_args.num_envs", "4", "--data.init_args.max_env_steps", "512",
    ]),
    "ppo_hopper.yaml": ("mujoco", [
        *_PPO, "--data.init_args.rollout_fragment_length", "128", "--data.init_args.max_env_steps", "256",
    ]),
    "ppo_hopper_cleanrl.yaml": ("mujoco", [
        *_PPO, "--data.init_args.rollout_fragment_length", "128", "--data.init_args.max_env_steps", "256",
    ]),
    "ppo_halfcheetah.yaml": ("mujoco", [
        *_PPO, "--data.init_args.rollout_fragment_length", "128", "--data.init_args.max_env_steps", "256",
    ]),
    "ppo_lunarlander.yaml": ("Box2D", [
        *_PPO, "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "64",
        "--data.init_args.max_env_steps", "256",
    ]),
    "ppo_minatar_breakout.yaml": ("minatar", [
        *_PPO, "--data.init_args.num_envs", "8", "--data.init_args.rollout_fragment_length", "32",
        "--data.init_args.max_env_steps", "512", "--model.init_args.minibatch_size", "128",
    ]),
    "ppo_simple_spread.yaml": ("mpe2", [
        *_MULTI_AGENT, "--data.init_args.num_envs", "2", "--data.init_args.rollouts_per_epoch", "2",
        "--data.init_args.max_env_steps", "100",
    ]),
    "ppo_connect_four.yaml": ("pettingzoo", [
        *_PPO, "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "64",
        "--data.init_args.max_env_steps", "256", "--model.init_args.minibatch_size", "64",
    ]),
    "ppo_connect_four_selfplay.yaml": ("pettingzoo", [
        *_MULTI_AGENT, "--data.init_args.num_envs", "4", "--data.init_args.rollouts_per_epoch", "8",
        "--data.init_args.max_env_steps", "800", "--model.init_args.minibatch_size", "64",
    ]),
    "impala_cartpole.yaml": (None, [*_PPO, "--data.init_args.max_env_steps", "512"]),
    "appo_cartpole.yaml": (None, [*_PPO, "--data.init_args.max_env_steps", "512"]),
    "appo_minatar_breakout.yaml": ("minatar", [
        *_PPO, "--data.init_args.num_envs", "4", "--data.init_args.rollout_fragment_length", "32",
        "--data.init_args.max_env_steps", "512", "--model.init_args.minibatch_size", "64",
    ]),
    "dqn_cartpole.yaml": (None, [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "1"]),
    "dqn_lunarlander.yaml": ("Box2D", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "50"]),
    "dqn_connect_four.yaml": ("pettingzoo", [
        *_OFF_POLICY, "--data.init_args.train_freq", "16", "--data.init_args.rollouts_per_epoch", "4",
    ]),
    "sac_pendulum.yaml": (None, [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "300"]),
    "sac_hopper.yaml": ("mujoco", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "150"]),
    "sac_halfcheetah.yaml": ("mujoco", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "150"]),
    "bc_cartpole.yaml": ("minari", _OFFLINE),
    "marwil_cartpole.yaml": ("minari", _OFFLINE),
    "cql_pendulum.yaml": ("minari", _OFFLINE),
    "iql_pendulum.yaml": ("minari", _OFFLINE),
}  # fmt: skip
# The offline configs' datasets, recorded here with random actions (as tests/test_offline_examples.py does).
DATASETS = {
    "bc_cartpole.yaml": ("cartpole/ppo-expert-v0", "CartPole-v1"),
    "marwil_cartpole.yaml": ("cartpole/mixed-v0", "CartPole-v1"),
    "cql_pendulum.yaml": ("pendulum/sac-medium-v0", "Pendulum-v1"),
    "iql_pendulum.yaml": ("pendulum/sac-medium-v0", "Pendulum-v1"),
}


def fit(config: str, root: Path, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python -m lightning_rl fit`` of ``config`` on the lane's device in ``root``; the probe's record.

    ``record["checkpoint"]`` is the run's ``last.ckpt``. A failed run fails the test with its output's end.
    """
    root.mkdir(parents=True, exist_ok=True)
    probe = root / "probe.json"
    _, shrink = CONFIGS[config]
    command = [
        sys.executable, "-m", "lightning_rl", "fit", "--config", str(EXAMPLES / config),
        "--trainer.accelerator", ACCELERATOR, "--trainer.devices", "1",
        "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks+=_gpu_probe.DeviceProbe", *shrink, *flags,
    ]  # fmt: skip
    child_env = {
        **os.environ,
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        # torch.compile's kernels compiled in this process: no pool of compile workers per test (-n 8).
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "LIGHTNING_RL_GPU_PROBE": str(probe),
        **(env or {}),
    }
    # cwd: MuJoCo writes MUJOCO_LOG.TXT into the working directory.
    result = subprocess.run(
        command, check=False, cwd=root, env=child_env, capture_output=True, text=True, timeout=FIT_TIMEOUT_S
    )
    output = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"{' '.join(command)}\nexit {result.returncode}:\n{output}"
    assert probe.is_file(), f"the run wrote no probe record (no train batch?):\n{output}"
    record = json.loads(probe.read_text())
    record["checkpoint"] = root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    record["output"] = output
    return record


def assert_trained_on_the_device(record: dict[str, Any]) -> None:
    """Weights on the lane's device during fit, updates done, every logged loss finite, ``last.ckpt`` written."""
    assert record["param_devices"] == [DEVICE], record
    assert record["root_device"] == DEVICE
    if DEVICE == "cuda":
        assert record["cuda_memory_allocated"] > 0
    assert record["global_step"] > 0
    losses = {key: value for key, value in record["metrics"].items() if key.endswith("loss")}
    assert losses, f"no loss was logged: {sorted(record['metrics'])}"
    assert all(isinstance(value, float) and math.isfinite(value) for value in losses.values()), losses
    assert record["checkpoint"].exists(), record["output"]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_example_config_trains_on_the_gpu_from_the_command_line(config: str, tmp_path: Path):
    package, _ = CONFIGS[config]
    if package is not None:
        pytest.importorskip(package, reason=f"{config} needs {package}")
    env = None
    if config in DATASETS:
        from lightning_rl.cli import record_command

        datasets = tmp_path / "datasets"
        env = {"MINARI_DATASETS_PATH": str(datasets)}
        dataset_id, env_id = DATASETS[config]
        previous = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = str(datasets)
        try:
            record_command.main(
                ["--env", env_id, "--random_fraction", "1", "--num_episodes", "4", "--dataset_id", dataset_id,
                 "--seed", "0"]
            )  # fmt: skip
        finally:
            if previous is None:
                del os.environ["MINARI_DATASETS_PATH"]
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous
    record = fit(config, tmp_path / "run", env=env)
    assert_trained_on_the_device(record)
    assert torch.load(record["checkpoint"], weights_only=True, map_location="cpu")["global_step"] > 0
    if config == "ppo_connect_four_selfplay.yaml":
        assert "eval/win_rate_vs_heuristic" in record["metrics"]


# ---- Strategies, precision, torch.compile ----------------------------------------------

_STRATEGIES = {
    # fsdp2 on CUDA: FSDP2's root pre-forward indexes its inputs (issue 31), which the CPU path never does.
    "fsdp2": ["--trainer.strategy", "fsdp2"],
    "ddp": ["--trainer.strategy", "ddp"],
    "bf16-mixed": ["--trainer.precision", "bf16-mixed"],
    "torch_compile": ["--model.init_args.torch_compile", "true"],
    # Several minibatch steps per update, so that steps get past the warm-up and are captured.
    "cuda_graphs": ["--model.init_args.cuda_graphs", "true"],
}
_CUDA_GRAPHS_SIZES = {
    "ppo_cartpole.yaml": ["--model.init_args.num_epochs", "4", "--model.init_args.minibatch_size", "64"],
    "sac_pendulum.yaml": ["--model.init_args.gradient_steps", "8"],
    "dqn_cartpole.yaml": [],  # 128 gradient steps per train item
}
_CASES = [
    ("fsdp2", "ppo_cartpole.yaml"), ("fsdp2", "sac_pendulum.yaml"), ("fsdp2", "dqn_cartpole.yaml"),
    ("ddp", "ppo_cartpole.yaml"), ("ddp", "dqn_cartpole.yaml"),
    ("bf16-mixed", "ppo_cartpole.yaml"), ("bf16-mixed", "sac_pendulum.yaml"),
    ("torch_compile", "ppo_cartpole.yaml"), ("torch_compile", "dqn_cartpole.yaml"),
    ("cuda_graphs", "ppo_cartpole.yaml"), ("cuda_graphs", "sac_pendulum.yaml"), ("cuda_graphs", "dqn_cartpole.yaml"),
]  # fmt: skip


@pytest.mark.parametrize(("variant", "config"), _CASES, ids=[f"{v}-{c.removesuffix('.yaml')}" for v, c in _CASES])
def test_the_strategy_precision_or_compile_trains_on_one_gpu(variant: str, config: str, tmp_path: Path):
    if variant == "cuda_graphs" and DEVICE != "cuda":
        pytest.skip("cuda_graphs=True needs a CUDA device (it refuses the CPU)")
    flags = _STRATEGIES[variant] + (_CUDA_GRAPHS_SIZES[config] if variant == "cuda_graphs" else [])
    record = fit(config, tmp_path / "run", *flags)
    assert_trained_on_the_device(record)
    if variant == "fsdp2":
        assert record["strategy"] == "FSDP2Strategy"
    elif variant == "ddp":
        assert record["strategy"] == "DDPStrategy"
    elif variant == "bf16-mixed":
        assert record["precision"] == "bf16-mixed"
        assert record["param_dtypes"] == ["torch.float32"]  # autocast: the weights stay float32
    elif variant == "torch_compile":
        assert record["compiled_graphs"] > 0
    else:
        assert record["cuda_graphs_captured"] is not None and record["cuda_graphs_captured"] >= 1, record


# ---- A GPU checkpoint on the CPU: Policy, evaluate, export -----------------------------


@pytest.fixture(scope="module")
def gpu_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``last.ckpt`` of PPO on CartPole-v1 trained on the GPU (examples/ppo_cartpole.yaml, 512 env steps)."""
    record = fit("ppo_cartpole.yaml", tmp_path_factory.mktemp("gpu_fit") / "run")
    assert_trained_on_the_device(record)
    return record["checkpoint"]


def test_a_gpu_checkpoint_acts_on_the_cpu_as_on_the_gpu(gpu_checkpoint: Path):
    from _policy_common import greedy_actions, observations

    from lightning_rl import Policy

    policy = Policy.from_checkpoint(gpu_checkpoint)
    assert {parameter.device.type for parameter in policy.net.parameters()} == {"cpu"}
    obs = observations(policy.observation_space, 200)
    actions = policy.act(obs)
    assert actions.shape == (200,) and all(policy.action_space.contains(int(action)) for action in actions)
    np.testing.assert_array_equal(actions, greedy_actions(policy.module, torch.from_numpy(obs)).numpy())
    assert policy.act(obs[0]) == actions[0]  # one observation: one action
    on_device = Policy.from_checkpoint(gpu_checkpoint, device=DEVICE)
    assert {parameter.device.type for parameter in on_device.net.parameters()} == {DEVICE}
    # The same weights on either device: the same greedy actions but for float rounding at near ties.
    assert np.mean(on_device.act(obs) == actions) >= 0.99


def test_evaluate_plays_a_gpu_checkpoint(gpu_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    from lightning_rl.cli import evaluate_command

    stats_file = tmp_path / "stats.json"
    evaluate_command.main(["--ckpt_path", str(gpu_checkpoint), "--num_episodes", "3", "--json", str(stats_file)])
    assert "CartPole-v1 (env from the checkpoint): 3 greedy episodes" in capsys.readouterr().out
    stats = json.loads(stats_file.read_text())
    assert stats["num_episodes"] == 3 and 1 <= stats["episode_return_min"] <= stats["episode_return_max"] <= 500


@pytest.mark.parametrize("export_format, suffix", [("onnx", ".onnx"), ("torch", ".pt2")])
def test_export_of_a_gpu_checkpoint_acts_as_the_policy(gpu_checkpoint: Path, export_format, suffix, tmp_path: Path):
    from _policy_common import observations, run_export

    from lightning_rl import Policy
    from lightning_rl.cli import export_command

    if export_format == "onnx":
        pytest.importorskip("onnxruntime")
    output = tmp_path / f"policy{suffix}"
    export_command.main(["--ckpt_path", str(gpu_checkpoint), "--format", export_format, "--output", str(output)])
    policy = Policy.from_checkpoint(gpu_checkpoint)
    obs = observations(policy.observation_space, 100)
    np.testing.assert_array_equal(run_export(output, obs), policy.act(obs))


# ---- The per-rank sampling stream on CUDA ----------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA generator's stream needs a CUDA device")
def test_each_rank_samples_from_its_own_cuda_stream_also_after_a_resume():
    pytest.importorskip("pettingzoo")
    from types import SimpleNamespace

    from lightning_rl.data import MultiAgentDataModule

    cuda = torch.device("cuda", torch.cuda.current_device())

    def data_on_rank(rank: int) -> MultiAgentDataModule:
        data = MultiAgentDataModule("pettingzoo.classic.connect_four_v3", seed=0)
        data.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        return data

    def draws(data: MultiAgentDataModule) -> list[float]:
        with data._sampling_stream(cuda):
            return torch.rand(3, device=cuda).tolist() + torch.rand(1).tolist()

    rank_0, rank_1 = data_on_rank(0), data_on_rank(1)
    assert draws(rank_0) != draws(rank_1)
    saved = rank_0.state_dict()
    assert "cuda" in saved["sampling_rng_state"]  # the acting device's generator is saved too
    resumed_0, resumed_1 = data_on_rank(0), data_on_rank(1)
    resumed_0.load_state_dict(saved)
    resumed_1.load_state_dict(saved)
    next_0 = draws(resumed_0)
    assert next_0 == draws(rank_0)  # rank 0 goes on where it stopped, on the GPU's generator too
    assert draws(resumed_1) != next_0
    # The global CUDA generator (what the Learner draws from) is left where it was.
    torch.cuda.manual_seed(5)
    expected = torch.rand(2, device=cuda)
    torch.cuda.manual_seed(5)
    draws(resumed_1)
    assert torch.equal(torch.rand(2, device=cuda), expected)
