"""``Learner(cuda_graphs=True)``: minibatch steps replayed from CUDA graphs equal eager steps.

The GPU tests (marked ``gpu``, skipped without CUDA) train two Learners from the same seed
on the same batches, one eager and one replaying graphs, and compare weights, optimizer
moments and results; each covers one rule of ``lightning_rl/learner/cuda_graphs.py``. The
CPU tests cover what is decided before any graph: refusals, optimizers made capturable with
plain checkpoints, and the metrics' recording.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, loader_of, random_batch
from lightning.pytorch import Callback, Trainer
from test_dqn import dqn_spec
from test_ppo import ppo_batch, ppo_spec
from test_sac import sac_spec

from lightning_rl import ALL_MODULES, Columns
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.data import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.learner.cuda_graphs import WARMUP_STEPS, make_capturable

MODULE_ID = "default_policy"


def _pair(make: Any) -> tuple[Any, Any]:
    """An eager Learner and a graphed one with the same initial weights, on the GPU."""
    learners = []
    for cuda_graphs in (False, True):
        torch.manual_seed(0)
        learner = make(cuda_graphs).to("cuda")
        learner.build()
        learners.append(learner)
    return learners[0], learners[1]


def _updates(learner: Any, batches: list[dict[str, np.ndarray]], timesteps: list[float], **kwargs: Any) -> list:
    results = []
    for update, (batch, timestep) in enumerate(zip(batches, timesteps)):
        torch.manual_seed(100 + update)  # the same shuffles for both Learners
        results.append(
            learner.update_from_batch(batch, timesteps={"num_env_steps_sampled_lifetime": timestep}, **kwargs)
        )
    return results


def _assert_same_training(eager: Any, graphed: Any, eager_results: list, graphed_results: list) -> None:
    for name, value in eager.module.state_dict().items():
        torch.testing.assert_close(graphed.module.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for (name, opt_e), (_, opt_g) in zip(
        eager.optimizer_registry.named.items(), graphed.optimizer_registry.named.items()
    ):
        for p_e, p_g in zip(opt_e.param_groups[0]["params"], opt_g.param_groups[0]["params"]):
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt_g.state[p_g][key], opt_e.state[p_e][key], rtol=1e-4, atol=1e-6)
    for result_e, result_g in zip(eager_results, graphed_results):
        for key in ("total_loss", "num_non_finite_updates_skipped", "weights_seq_no"):
            expected = pytest.approx(result_e[MODULE_ID][key], rel=1e-4, abs=1e-6, nan_ok=True)  # a NaN loss too
            assert result_g[MODULE_ID][key] == expected, key
        assert result_g[ALL_MODULES]["num_env_steps_trained"] == result_e[ALL_MODULES]["num_env_steps_trained"]


# ---- On a GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bc_steps_replayed_from_graphs_equal_eager_steps_with_a_smaller_last_minibatch():
    # 100 rows in minibatches of 32: three of 32 and one of 4 per epoch, two shapes, two graphs.
    eager, graphed = _pair(lambda graphs: BCLearner(module_spec=bc_spec((64, 64)), grad_clip=0.5, cuda_graphs=graphs))
    batches = [random_batch(100, seed) for seed in range(4)]
    kwargs = dict(num_epochs=4, minibatch_size=32, shuffle_batch_per_epoch=True)
    results = [_updates(learner, batches, [0.0] * 4, **kwargs) for learner in (eager, graphed)]
    _assert_same_training(eager, graphed, *results)
    assert graphed.step_runner.cuda_graphs.num_captured == 2
    assert eager.step_runner.cuda_graphs is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_lr_schedule_and_a_moving_entropy_coefficient_reach_the_replays():
    # PPO's entropy coefficient is a Python number the loss reads: its graphs are captured again
    # when it moves (cuda_graph_key); the lr is a device tensor that the schedule fills in place.
    def make(graphs: bool) -> PPOLearner:
        return PPOLearner(
            ppo_spec(fcnet_hiddens=[32]),
            lr=[[0, 1e-2], [300, 1e-4]],
            entropy_coeff=[[0, 0.5], [300, 0.0]],
            grad_clip=0.5,
            cuda_graphs=graphs,
        )

    eager, graphed = _pair(make)
    batches = [ppo_batch(64, seed) for seed in range(4)]
    timesteps = [0.0, 100.0, 200.0, 300.0]
    kwargs = dict(num_epochs=4, minibatch_size=16, shuffle_batch_per_epoch=True)
    results = [_updates(learner, batches, timesteps, **kwargs) for learner in (eager, graphed)]
    _assert_same_training(eager, graphed, *results)
    lrs = [result[MODULE_ID]["default_optimizer_learning_rate"] for result in results[1]]
    assert lrs[0] > lrs[-1]
    assert graphed.step_runner.cuda_graphs.num_captured == 1  # captured again for each coefficient


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_minibatch_with_a_nan_skips_its_step_in_a_replay_as_in_an_eager_step():
    eager, graphed = _pair(lambda graphs: BCLearner(module_spec=bc_spec((32,)), cuda_graphs=graphs))
    clean = [random_batch(64, seed) for seed in range(WARMUP_STEPS + 1)]
    poisoned = random_batch(64, seed=9)
    poisoned[Columns.OBS][40, 0] = np.nan  # the second minibatch of 32 rows
    batches = [*clean, poisoned]
    kwargs = dict(num_epochs=1, minibatch_size=32)
    results = [_updates(learner, batches, [0.0] * len(batches), **kwargs) for learner in (eager, graphed)]
    _assert_same_training(eager, graphed, *results)
    assert results[1][-1][MODULE_ID]["num_non_finite_updates_skipped"] == 1
    assert all(torch.isfinite(p).all() for p in graphed.module.parameters())


class _CountSteps(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_before_backward(self, trainer: Trainer, pl_module: Any, loss: torch.Tensor) -> None:
        self.steps += 1


def _fit(learner: BCLearner, tmp_path: Any, *callbacks: Callback) -> Trainer:
    items = [
        TrainItem(
            TrainingData(batch=random_batch(96, seed)), timesteps={"num_env_steps_sampled_lifetime": 96 * (i + 1)}
        )
        for i, seed in enumerate(range(6))
    ]
    trainer = Trainer(
        accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=list(callbacks),
    )  # fmt: skip
    torch.manual_seed(0)  # the module's initial weights are drawn in the fit's setup
    trainer.fit(learner, train_dataloaders=loader_of(items))
    return trainer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_under_trainer_fit_replayed_steps_count_in_global_step_and_checkpoints_load_on_the_cpu(tmp_path):
    def make(graphs: bool) -> BCLearner:
        return BCLearner(module_spec=bc_spec((32,)), num_epochs=2, minibatch_size=32, cuda_graphs=graphs)

    eager, graphed = make(False), make(True)
    eager_trainer, graphed_trainer = _fit(eager, tmp_path / "eager"), _fit(graphed, tmp_path / "graphed")
    assert graphed_trainer.global_step == eager_trainer.global_step == 6 * 2 * 3
    assert graphed.step_runner.cuda_graphs.num_captured == 1
    for name, value in eager.module.state_dict().items():
        torch.testing.assert_close(graphed.module.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)

    path = tmp_path / "graphed.ckpt"
    graphed_trainer.save_checkpoint(path)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    group = saved["optimizer_states"][0]["param_groups"][0]
    assert group["capturable"] is False and isinstance(group["lr"], float)
    on_cpu = BCLearner.load_from_checkpoint(path, map_location="cpu", cuda_graphs=False)
    on_cpu.update_from_batch(random_batch(64, seed=7), minibatch_size=32)  # trains on, on the CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_listener_to_the_per_step_hooks_keeps_the_steps_eager_and_says_why(tmp_path):
    learner = BCLearner(module_spec=bc_spec((32,)), num_epochs=1, minibatch_size=32, cuda_graphs=True)
    counter = _CountSteps()
    with pytest.warns(UserWarning, match="run eagerly, since something listens"):
        trainer = _fit(learner, tmp_path, counter)
    assert counter.steps == trainer.global_step == 6 * 3
    assert learner.step_runner.cuda_graphs.num_captured == 0


def _replay_updates(learner: Any, buffer: Any, num_updates: int) -> None:
    for update in range(num_updates):
        learner.update_from_replay(buffer, timesteps={"num_env_steps_sampled_lifetime": 1000 + update})


def _episodes(env_id: str, module: Any) -> list:
    return EnvRunner(env_id, num_envs=2, rollout_fragment_length=150, seed=0).sample(module)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dqn_steps_from_graphs_hand_their_td_errors_to_a_prioritized_replay_as_eager_steps_do():
    probe = EnvRunner("CartPole-v1", num_envs=1, seed=0)
    spaces = (probe.observation_space, probe.action_space)
    episodes = _episodes("CartPole-v1", DQNModule(*spaces, {"fcnet_hiddens": [8]}))
    eager, graphed = _pair(
        lambda graphs: DQNLearner(
            dqn_spec(*spaces, fcnet_hiddens=[32]),
            lr=1e-3,
            minibatch_size=32,
            gradient_steps=2,
            target_network_update_freq=3,
            cuda_graphs=graphs,
        )
    )
    buffers = []
    for learner in (eager, graphed):
        buffer = PrioritizedReplayBuffer(1000, seed=0)
        buffer.add_episodes(episodes)
        _replay_updates(learner, buffer, num_updates=8)
        buffers.append(buffer)
    for name, value in eager.module.state_dict().items():  # the target network too
        torch.testing.assert_close(graphed.module.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    np.testing.assert_allclose(buffers[1]._priorities, buffers[0]._priorities, rtol=1e-4, atol=1e-6)
    assert graphed.step_runner.cuda_graphs.num_captured == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sac_steps_from_graphs_with_three_optimizers_and_sampled_actions_equal_eager_steps():
    probe = EnvRunner("Pendulum-v1", num_envs=1, seed=0)
    spaces = (probe.observation_space, probe.action_space)
    episodes = _episodes("Pendulum-v1", SACModule(*spaces, {"fcnet_hiddens": [8]}))
    eager, graphed = _pair(
        lambda graphs: SACLearner(
            sac_spec(spaces[1], fcnet_hiddens=[32]),
            minibatch_size=32,
            gradient_steps=2,
            tau=0.05,
            cuda_graphs=graphs,
        )
    )
    for learner in (eager, graphed):
        buffer = ReplayBuffer(1000, seed=0)
        buffer.add_episodes(episodes)
        torch.manual_seed(7)  # the actions SAC samples in its loss: the same draws for both
        _replay_updates(learner, buffer, num_updates=6)
    for name, value in eager.module.state_dict().items():
        torch.testing.assert_close(graphed.module.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert graphed.step_runner.cuda_graphs.num_captured == 1


class _SyncingBCLearner(BCLearner):
    """A loss that reads a tensor on the host, which no CUDA graph can hold."""

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: Any, fwd_out: Any) -> torch.Tensor:
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        self.metrics.log_value((module_id, "loss_on_the_host"), float(loss), window=1)
        return loss


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_loss_that_syncs_with_the_host_cannot_be_captured_and_trains_eagerly_with_a_warning():
    eager, graphed = _pair(lambda graphs: _SyncingBCLearner(module_spec=bc_spec((32,)), cuda_graphs=graphs))
    batches = [random_batch(64, seed) for seed in range(3)]
    kwargs = {"num_epochs": 2, "minibatch_size": 32}
    eager_results = _updates(eager, batches, [0.0] * 3, **kwargs)
    with pytest.warns(UserWarning, match="could not be captured in a CUDA graph"):
        graphed_results = _updates(graphed, batches, [0.0] * 3, **kwargs)
    _assert_same_training(eager, graphed, eager_results, graphed_results)
    assert graphed.step_runner.cuda_graphs.num_captured == 0


# ---- Decided before any graph (CPU) --------------------------------------------------------


def test_cuda_graphs_on_the_cpu_is_refused_naming_the_device():
    learner = BCLearner(module_spec=bc_spec(), cuda_graphs=True)
    learner.build()
    with pytest.raises(ValueError, match=r"the Learner is on cpu: train on a GPU .* or set cuda_graphs=False"):
        learner.update_from_batch(random_batch(32), minibatch_size=16)


def test_torch_compile_and_cuda_graphs_together_or_a_non_bool_are_refused_at_construction():
    with pytest.raises(ValueError, match="torch_compile and cuda_graphs together are not supported"):
        BCLearner(module_spec=bc_spec(), cuda_graphs=True, torch_compile=True)
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        BCLearner(module_spec=bc_spec(), cuda_graphs="yes")


def test_a_capturable_adam_reads_a_tensor_lr_and_still_writes_an_eager_state_dict():
    param = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([param], lr=1e-3)
    make_capturable(adam, has_schedule=True, name="default_optimizer")
    make_capturable(adam, has_schedule=True, name="default_optimizer")  # idempotent
    group = adam.param_groups[0]
    assert group["capturable"] is True and isinstance(group["lr"], torch.Tensor)
    assert float(group["lr"]) == pytest.approx(1e-3)
    saved = adam.state_dict()["param_groups"][0]
    assert saved["capturable"] is False and saved["lr"] == pytest.approx(1e-3) and isinstance(saved["lr"], float)
    assert adam.param_groups[0]["capturable"] is True  # the live optimizer keeps its settings


def test_optimizers_a_graph_cannot_step_right_are_refused_by_name():
    param = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"'critic' \(SGD\) has a learning-rate schedule"):
        make_capturable(torch.optim.SGD([param], lr=0.1), has_schedule=True, name="critic")
    make_capturable(torch.optim.SGD([param], lr=0.1), has_schedule=False, name="critic")  # a constant lr is fine
    with pytest.raises(ValueError, match=r"'lbfgs' \(LBFGS\) cannot be captured"):
        make_capturable(torch.optim.LBFGS([param]), has_schedule=False, name="lbfgs")


def test_values_logged_while_recording_are_logged_again_from_each_replays_values():
    metrics = MetricsLogger()
    metrics.log_value("before", 1.0, window=math.inf, clear_on_reduce=True)
    loss = torch.tensor(2.0)
    with metrics.recording() as record:
        metrics.log_value("loss", loss * 1, window=math.inf, clear_on_reduce=True)
        metrics.log_value("norms", torch.tensor([1.0, 5.0]), reduce="max", window=math.inf, clear_on_reduce=True)
        metrics.log_value("count", 1, reduce="sum", clear_on_reduce=True)
    assert metrics.reduce() == {"before": 1.0}  # the placeholders of the capture are not logged
    for value in (3.0, 5.0):
        record.values[0] = value  # what a replay writes into the captured output
        metrics.log_recorded(record)
    record.values[0] = 99.0  # a later replay does not change what was logged
    assert metrics.reduce() == {"loss": 4.0, "norms": 5.0, "count": 2}
