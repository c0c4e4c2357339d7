"""Target networks, the TargetNetworkUpdate callback and OffPolicyLearner's replay updates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import make_trainer
from lightning.pytorch import Callback, Trainer, seed_everything
from torch import nn

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.off_policy import BATCH_INDEXES, N_STEP, WEIGHTS, OffPolicyLearner, bootstrap_discounts
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.callbacks import TargetNetworkUpdate
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.target_network import (
    TargetNetworkAPI,
    make_target_network,
    update_target_network,
    update_target_networks,
)
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data import EpisodeDataModule, OffPolicyDataModule
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


class TinyQModule(RLModule, TargetNetworkAPI):
    """A linear Q function with a target copy: enough to exercise the off-policy machinery."""

    def setup(self) -> None:
        obs_dim, num_actions = self.observation_space.shape[0], self.action_space.n
        self.q = nn.Sequential(nn.Linear(obs_dim, 4), nn.BatchNorm1d(4), nn.Linear(4, num_actions))
        self.make_target_networks()

    def make_target_networks(self) -> None:
        self.target_q = make_target_network(self.q)

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.q, self.target_q)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"q_values": self.target_q(batch[Columns.NEXT_OBS])}

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.acted = True
        self.q.eval()  # one-row acting batches: BatchNorm in eval mode
        return {"actions": self.q(batch[Columns.OBS]).argmax(-1)}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.q.train()
        return {"q_values": self.q(batch[Columns.OBS])}


class TinyQLearner(OffPolicyLearner):
    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, torch.Tensor], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        q_taken = fwd_out["q_values"].gather(1, batch[Columns.ACTIONS].long()[:, None]).squeeze(1)
        with torch.no_grad():
            self.module[module_id].target_q.eval()
            next_q = self.module[module_id].forward_target(batch)["q_values"].max(-1).values
            target = batch[Columns.REWARDS] + bootstrap_discounts(batch, config.gamma) * next_q
        td_errors = q_taken - target
        self.record_td_errors(module_id, td_errors)
        return (batch[WEIGHTS] * td_errors.pow(2)).mean()


def tiny_spec(
    observation_space: gym.Space | None = OBS_SPACE, action_space: gym.Space | None = ACT_SPACE
) -> RLModuleSpec:
    return RLModuleSpec(module_class=TinyQModule, observation_space=observation_space, action_space=action_space)


class FakeReplay:
    """Returns a fixed random minibatch per call; records what the Learner asks and reports."""

    def __init__(self, rows: int = 8, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.sample_calls: list[dict[str, Any]] = []
        self.priority_updates: list[tuple[np.ndarray, np.ndarray]] = []
        self.rows = rows
        self.next_index = 0

    def sample(self, batch_size: int, *, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        self.sample_calls.append({"batch_size": batch_size, "n_step": n_step, "gamma": gamma})
        rows = batch_size
        indexes = np.arange(self.next_index, self.next_index + rows, dtype=np.int64)
        self.next_index += rows
        return {
            Columns.OBS: self.rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            Columns.ACTIONS: self.rng.integers(0, 2, rows),
            Columns.REWARDS: self.rng.normal(size=rows).astype(np.float32),
            Columns.NEXT_OBS: self.rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            Columns.TERMINATEDS: self.rng.random(rows) < 0.2,
            Columns.TRUNCATEDS: np.zeros(rows, dtype=bool),
            N_STEP: np.ones(rows, dtype=np.int64),
            WEIGHTS: np.ones(rows, dtype=np.float32),
            BATCH_INDEXES: indexes,
        }

    def update_priorities(self, batch_indexes: np.ndarray, td_errors: np.ndarray) -> None:
        self.priority_updates.append((batch_indexes, td_errors))


def built_learner(**kwargs: Any) -> TinyQLearner:
    torch.manual_seed(0)
    learner = TinyQLearner(tiny_spec(), lr=1e-2, minibatch_size=8, **kwargs)
    learner.build()
    return learner


def online_and_target(learner: TinyQLearner) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    module = learner.module["default_policy"]
    return (
        {name: t.detach().clone() for name, t in module.q.state_dict().items()},
        {name: t.detach().clone() for name, t in module.target_q.state_dict().items()},
    )


# ----------------------------------------------------------------------------------------
# update_target_network
# ----------------------------------------------------------------------------------------


def test_target_network_starts_equal_frozen_and_outside_the_optimizer():
    learner = built_learner()
    module = learner.module["default_policy"]
    online, target = online_and_target(learner)
    assert all(torch.equal(online[name], target[name]) for name in online)
    assert not any(p.requires_grad for p in module.target_q.parameters())
    optimized = {id(p) for group in learner.get_optimizer().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.q.parameters()}


def test_hard_update_copies_the_online_weights_exactly():
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    update_target_network(online, target, tau=1.0)
    assert torch.equal(online.weight, target.weight) and torch.equal(online.bias, target.bias)


def test_polyak_update_moves_the_target_by_exactly_tau():
    torch.manual_seed(0)
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = target.weight.detach().clone()
    update_target_network(online, target, tau=0.005)
    expected = 0.005 * online.weight.detach() + 0.995 * before
    torch.testing.assert_close(target.weight.detach(), expected, rtol=0, atol=1e-7)


def test_target_update_copies_buffers_and_rejects_bad_tau_or_structure():
    online = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = make_target_network(online)
    online[1].running_mean.fill_(3.0)
    update_target_network(online, target, tau=0.1)
    assert torch.equal(target[1].running_mean, online[1].running_mean)
    with pytest.raises(ValueError, match="tau"):
        update_target_network(online, target, tau=0.0)
    with pytest.raises(ValueError, match="differ"):
        update_target_network(online, nn.Linear(3, 4), tau=1.0)


# ----------------------------------------------------------------------------------------
# TargetNetworkUpdate through the Learner's updates
# ----------------------------------------------------------------------------------------


def test_hard_sync_happens_exactly_every_update_interval_gradient_steps():
    learner = built_learner(target_network_update_freq=3, tau=1.0)
    replay = FakeReplay()
    synced_at = []
    for step in range(1, 8):
        learner.update_from_replay(replay, timesteps={"num_env_steps_sampled_lifetime": step})
        online, target = online_and_target(learner)
        if all(torch.equal(online[name], target[name]) for name in online):
            synced_at.append(learner.weights_seq_no)
    assert synced_at == [3, 6]


def test_polyak_update_after_every_step_with_tau():
    learner = built_learner(target_network_update_freq=1, tau=0.25)
    _, target_before = online_and_target(learner)
    learner.update_from_replay(FakeReplay(), timesteps={})
    online_after, target_after = online_and_target(learner)
    for name in ("0.weight", "2.bias"):
        expected = 0.25 * online_after[name] + 0.75 * target_before[name]
        torch.testing.assert_close(target_after[name], expected, rtol=0, atol=1e-7)
    # Buffers (BatchNorm statistics) are copied, not averaged.
    assert torch.equal(target_after["1.running_mean"], online_after["1.running_mean"])


def test_target_update_callback_validates_its_arguments():
    with pytest.raises(ValueError, match="update_interval"):
        TargetNetworkUpdate(update_interval=0)
    with pytest.raises(ValueError, match="tau"):
        TargetNetworkUpdate(tau=1.5)


def test_update_target_networks_skips_nothing_of_a_module():
    module = TinyQModule(OBS_SPACE, ACT_SPACE)
    with torch.no_grad():
        module.q[0].weight.add_(1.0)
    update_target_networks(module, tau=1.0)
    assert torch.equal(module.q[0].weight, module.target_q[0].weight)


# ----------------------------------------------------------------------------------------
# OffPolicyLearner.update_from_replay
# ----------------------------------------------------------------------------------------


def test_update_from_replay_takes_gradient_steps_each_on_a_fresh_sample():
    learner = built_learner(gradient_steps=4, n_step=3, gamma=0.9)
    replay = FakeReplay()
    results = learner.update_from_replay(replay, timesteps={"num_env_steps_sampled_lifetime": 100})
    assert replay.sample_calls == [{"batch_size": 8, "n_step": 3, "gamma": 0.9}] * 4
    assert learner.weights_seq_no == 4
    assert results["__all_modules__"]["num_env_steps_trained"] == 32
    assert results["__all_modules__"]["num_env_steps_sampled_lifetime"] == 100


def test_td_errors_of_each_step_become_the_sampled_rows_priorities():
    learner = built_learner(gradient_steps=2)
    replay = FakeReplay()
    learner.update_from_replay(replay, timesteps={})
    assert [indexes.tolist() for indexes, _ in replay.priority_updates] == [list(range(8)), list(range(8, 16))]
    assert all(errors.shape == (8,) and np.isfinite(errors).all() for _, errors in replay.priority_updates)


def test_no_replay_before_learning_starts_is_an_update_without_steps():
    learner = built_learner()
    online_before, _ = online_and_target(learner)
    results = learner.update_from_replay(None, timesteps={"num_env_steps_sampled_lifetime": 50})
    online_after, _ = online_and_target(learner)
    assert learner.weights_seq_no == 0
    assert all(torch.equal(online_before[name], online_after[name]) for name in online_before)
    assert results["__all_modules__"]["num_env_steps_sampled_lifetime"] == 50


def test_terminated_rows_do_not_bootstrap_and_n_step_rows_discount_by_gamma_to_the_n():
    batch = {Columns.TERMINATEDS: torch.tensor([False, True, False]), N_STEP: torch.tensor([1, 2, 3])}
    torch.testing.assert_close(bootstrap_discounts(batch, 0.9), torch.tensor([0.9, 0.0, 0.729]))


def test_update_from_replay_refuses_two_modules_reporting_priorities_for_the_same_rows():
    # Several modules train on the same sampled rows (tests/test_rllib_parity.py); a
    # prioritized replay keeps one priority per row, so only one of them may report TD errors.
    spec = MultiRLModuleSpec(rl_module_specs={"a": tiny_spec(), "b": tiny_spec()})
    learner = TinyQLearner(spec, minibatch_size=8)
    learner.build()
    with pytest.raises(ValueError, match=r"modules \['a', 'b'\] each recorded TD errors"):
        learner.update_from_replay(FakeReplay())


def test_an_on_policy_learner_refuses_replay_items_with_a_clear_error():
    learner = PPOLearner(RLModuleSpec(module_class=PPOModule, observation_space=OBS_SPACE, action_space=ACT_SPACE))
    learner.build()
    with pytest.raises(NotImplementedError, match="on-policy"):
        learner.training_step(TrainItem(TrainingData(replay=FakeReplay())))


@pytest.mark.parametrize(
    ("name", "value"),
    [("gamma", 1.5), ("n_step", 0), ("gradient_steps", 0), ("minibatch_size", 0), ("tau", 0.0),
     ("target_network_update_freq", 0)],
)  # fmt: skip
def test_off_policy_settings_are_validated(name: str, value: Any):
    with pytest.raises(ValueError, match=name):
        TinyQLearner(tiny_spec(), **{name: value})


# ----------------------------------------------------------------------------------------
# OffPolicyDataModule
# ----------------------------------------------------------------------------------------


def off_policy_datamodule(**kwargs: Any) -> OffPolicyDataModule:
    settings = dict(
        env="CartPole-v1",
        seed=0,
        replay_buffer_capacity=1000,
        train_freq=4,
        learning_starts=20,
        rollouts_per_epoch=10,
        evaluation_num_episodes=1,
    )
    settings.update(kwargs)
    return OffPolicyDataModule(**settings)


def fit(
    learner: OffPolicyLearner,
    datamodule: OffPolicyDataModule,
    tmp_path: Path,
    ckpt_path: str | None = None,
    **trainer_kwargs: Any,
) -> Trainer:
    trainer = make_trainer(tmp_path, **{"num_sanity_val_steps": 0, "limit_val_batches": 0, **trainer_kwargs})
    trainer.fit(learner, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


class RecordItems(Callback):
    def __init__(self) -> None:
        self.items: list[TrainItem] = []
        self.buffer_sizes: list[int] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.items.append(batch)
        self.buffer_sizes.append(len(trainer.datamodule.replay_buffer))


def test_off_policy_items_add_train_freq_steps_and_hand_over_replay_once_learning_starts(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule(num_envs=2)
    record = RecordItems()
    fit(learner, datamodule, tmp_path, callbacks=[record])

    assert record.buffer_sizes == [4 * i for i in range(1, 11)]
    assert [item.data.replay is not None for item in record.items] == [False] * 4 + [True] * 6
    assert all(item.data.episodes is None for item in record.items)
    assert [item.timesteps["num_env_steps_sampled_lifetime"] for item in record.items] == [4 * i for i in range(1, 11)]
    assert learner.weights_seq_no == 6  # one gradient step per item once learning started


def test_random_actions_stand_in_for_the_module_until_learning_starts(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule(learning_starts=40, rollouts_per_epoch=10)
    fit(learner, datamodule, tmp_path)
    assert not getattr(learner.module["default_policy"], "acted", False)
    actions = datamodule.replay_buffer.sample(200)[Columns.ACTIONS]
    assert set(np.unique(actions)) == {0, 1}  # uniform random, not one greedy action

    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule(learning_starts=40, random_actions_before_learning_starts=False)
    fit(learner, datamodule, tmp_path)
    assert learner.module["default_policy"].acted


def test_prioritized_replay_follows_the_beta_schedule_and_gets_td_errors(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule(prioritized_replay=True, prioritized_replay_beta=[[0, 0.4], [40, 1.0]])
    fit(learner, datamodule, tmp_path)
    buffer = datamodule.replay_buffer
    assert isinstance(buffer, PrioritizedReplayBuffer)
    assert buffer.beta == pytest.approx(1.0)  # 40 env steps sampled: the end of the schedule
    sample = buffer.sample(64)
    assert not np.allclose(sample[WEIGHTS], 1.0)  # TD errors gave the rows different priorities


def test_the_replay_buffer_is_checkpointed_only_when_asked_and_then_restored_exactly(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule()
    fit(learner, datamodule, tmp_path)
    assert "replay_buffer" not in datamodule.state_dict()

    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    datamodule = off_policy_datamodule(checkpoint_replay_buffer=True)
    trainer = fit(learner, datamodule, tmp_path)
    path = tmp_path / "with_buffer.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)  # tensors and plain data only
    expected = datamodule.replay_buffer.sample(32)

    restored = off_policy_datamodule(checkpoint_replay_buffer=True)
    restored.load_state_dict(checkpoint["OffPolicyDataModule"])
    assert len(restored.replay_buffer) == 40
    for column, values in restored.replay_buffer.sample(32).items():
        np.testing.assert_array_equal(values, expected[column])


def test_resumed_run_without_the_buffer_refills_it_before_learning_again(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    trainer = fit(learner, off_policy_datamodule(), tmp_path)
    path = tmp_path / "no_buffer.ckpt"
    trainer.save_checkpoint(path)

    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    record = RecordItems()
    fit(learner, off_policy_datamodule(), tmp_path, callbacks=[record], max_epochs=2, ckpt_path=str(path))
    assert [item.data.replay is not None for item in record.items] == [False] * 4 + [True] * 6
    assert record.items[0].timesteps["num_env_steps_sampled_lifetime"] == 44
    assert learner.weights_seq_no == 6 + 6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"train_freq": 3, "num_envs": 2}, "multiple of num_envs"),
        ({"learning_starts": -1}, "learning_starts"),
        ({"replay_buffer_capacity": 0}, "replay_buffer_capacity"),
        ({"prioritized_replay": True, "prioritized_replay_alpha": -1.0}, "alpha"),
        ({"prioritized_replay_beta": [[0, -1.0]]}, "prioritized_replay_beta"),
        ({"cycles_per_item": 0}, "cycles_per_item"),
        ({"cycles_per_item": 1.5}, "cycles_per_item"),
    ],
)
def test_off_policy_settings_of_the_datamodule_are_validated(kwargs: dict[str, Any], match: str):
    with pytest.raises(ValueError, match=match):
        off_policy_datamodule(**kwargs)


def _dqn_fit(tmp_path: Path, cycles_per_item: int, **data_kwargs: Any) -> tuple[DQNLearner, Trainer, RecordItems]:
    """A seeded DQN fit whose schedules, target syncs and learning start fall inside items of several cycles."""
    seed_everything(0)
    learner = DQNLearner(
        model_config={"fcnet_hiddens": [16]}, minibatch_size=8, gradient_steps=2, epsilon=[[0, 1.0], [60, 0.1]],
        target_network_update_freq=3,
    )  # fmt: skip
    settings = {"learning_starts": 10, "max_env_steps": 90, "rollouts_per_epoch": 5, "cycles_per_item": cycles_per_item}
    datamodule = off_policy_datamodule(**{**settings, **data_kwargs})
    record = RecordItems()
    trainer = fit(learner, datamodule, tmp_path / str(cycles_per_item), callbacks=[record], max_epochs=-1)
    return learner, trainer, record


@pytest.mark.parametrize("random_warm_up", [True, False])
def test_items_of_several_cycles_train_the_same_weights_as_one_cycle_per_item(tmp_path: Path, random_warm_up: bool):
    """cycles_per_item=3: each cycle acts with the weights after the previous cycle's gradient steps.

    90 env steps in cycles of 4: 23 cycles; items of 3 cycles end early at the budget (8 items).
    Learning starts in the middle of the first item, epsilon anneals and the target syncs every
    3 gradient steps, so a cycle sampled with stale weights or timesteps would change the weights.
    """
    options = {"random_actions_before_learning_starts": random_warm_up}
    one, one_trainer, one_record = _dqn_fit(tmp_path, 1, **options)
    three, three_trainer, three_record = _dqn_fit(tmp_path, 3, **options)
    assert len(one_record.items) == 23 and len(three_record.items) == 8
    assert [item.timesteps["num_env_steps_sampled_lifetime"] for item in three_record.items] == list(range(4, 93, 12))
    assert (
        three_trainer.datamodule.num_env_steps_sampled_lifetime == one_trainer.datamodule.num_env_steps_sampled_lifetime
    )
    assert three.weights_seq_no == one.weights_seq_no == 2 * 21  # learning starts at the third cycle
    assert three_trainer.global_step == one_trainer.global_step
    for name, value in one.state_dict().items():
        assert torch.equal(value, three.state_dict()[name]), name
    assert len(three_trainer.datamodule.replay_buffer) == len(one_trainer.datamodule.replay_buffer) == 92


def test_an_item_of_several_cycles_logs_its_last_cycle(tmp_path: Path):
    _, trainer, record = _dqn_fit(tmp_path, 3, max_env_steps=48)
    assert [item.next_cycle is not None for item in record.items] == [True] * 4
    assert trainer.callback_metrics["env_runners/num_env_steps_sampled_lifetime"].item() == 48
    assert trainer.callback_metrics["step"].item() == 48


def test_an_on_policy_datamodule_has_no_replay_buffer():
    with pytest.raises(ValueError, match="on-policy"):
        EpisodeDataModule("CartPole-v1").replay_buffer
