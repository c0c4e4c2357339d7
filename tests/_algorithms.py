"""One row per algorithm for the suites that run every algorithm (``tests/test_save_load.py``).

A row says how to build a tiny Learner of the algorithm, its data module, and a few fixed
train items (data sampled once from the env, handed to the Learner as they are, so that two
runs can be fed exactly the same data). A new algorithm joins every such suite by adding a
row to ``ROWS``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import torch
from lightning.pytorch import LightningDataModule

from lightning_rl import Learner, RLModule, RLModuleSpec
from lightning_rl.algorithms.appo import APPOLearner, APPOModule
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.cql import CQLLearner, CQLModule
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.impala import IMPALALearner
from lightning_rl.algorithms.iql import IQLLearner, IQLModule
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.env import EnvRunner

# The data module classes every row uses: the one place to change when they are renamed or split.
ON_POLICY_DATA: type[LightningDataModule] = OnPolicyDataModule
OFF_POLICY_DATA: type[LightningDataModule] = OffPolicyDataModule

MODEL_CONFIG = {"fcnet_hiddens": [8]}
NUM_ENVS = 2
# On-policy: rows per rollout (one train item). Off-policy: env steps added per train item.
ITEM_ENV_STEPS = 32
# Off-policy fixed items: env steps in the replay buffer they all share.
FIXED_REPLAY_ENV_STEPS = 64


@dataclasses.dataclass(frozen=True)
class AlgorithmRow:
    """How to build and feed one algorithm, small enough for a test that takes a second.

    Args:
        name: The test id.
        learner_class: The algorithm's Learner.
        module_class: The RLModule class its default spec builds.
        env: The gymnasium id it trains on.
        learner_kwargs: Hyperparameters other than the module's (tiny minibatches, few steps).
        off_policy: Whether its train items hand over a replay buffer instead of episodes.
        steps_per_item: Gradient steps one train item takes once learning has started (for
            counting ``weights_seq_no``).
        takes_model_config: Whether the Learner builds its default module from a
            ``model_config`` argument; if not, a config names the whole ``module_spec``.
    """

    name: str
    learner_class: type[Learner]
    module_class: type[RLModule]
    env: str
    learner_kwargs: dict[str, Any]
    off_policy: bool
    steps_per_item: int
    takes_model_config: bool = True

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """The env's observation and action spaces."""
        env = gym.make(self.env)
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def module_spec(self) -> RLModuleSpec:
        """The tiny module, with the env's spaces (so the Learner builds without a data module)."""
        observation_space, action_space = self.spaces()
        return RLModuleSpec(
            module_class=self.module_class,
            observation_space=observation_space,
            action_space=action_space,
            model_config=dict(MODEL_CONFIG),
        )

    def make_learner(self, **overrides: Any) -> Learner:
        """An unbuilt Learner of this row; ``overrides`` replace hyperparameters."""
        return self.learner_class(self.module_spec(), **{**self.learner_kwargs, **overrides})

    def cli_model(self) -> dict[str, Any]:
        """The ``model:`` section of a ``lightning-rl fit`` config (spaces come from the data)."""
        if self.takes_model_config:
            module: dict[str, Any] = {"model_config": dict(MODEL_CONFIG)}
        else:
            spec_args = {"module_class": _class_path(self.module_class), "model_config": dict(MODEL_CONFIG)}
            module = {"module_spec": {"class_path": _class_path(RLModuleSpec), "init_args": spec_args}}
        init_args = {**module, **self.learner_kwargs}
        return {"class_path": _class_path(self.learner_class), "init_args": init_args}

    @property
    def data_class(self) -> type[LightningDataModule]:
        return OFF_POLICY_DATA if self.off_policy else ON_POLICY_DATA

    def data_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Arguments of a tiny data module: ``ITEM_ENV_STEPS`` env steps per train item, no evaluation."""
        kwargs: dict[str, Any] = dict(env=self.env, num_envs=NUM_ENVS, seed=0, evaluation_num_episodes=1)
        if self.off_policy:
            kwargs.update(replay_buffer_capacity=1000, train_freq=ITEM_ENV_STEPS, learning_starts=ITEM_ENV_STEPS)
        else:
            kwargs.update(rollout_fragment_length=ITEM_ENV_STEPS // NUM_ENVS)
        kwargs.update(overrides)
        return kwargs

    def make_data(self, **overrides: Any) -> LightningDataModule:
        """The row's data module, built from ``data_kwargs(**overrides)``."""
        return self.data_class(**self.data_kwargs(**overrides))

    def cli_data(self, **overrides: Any) -> dict[str, Any]:
        """The ``data:`` section of a ``lightning-rl fit`` config."""
        return {"class_path": _class_path(self.data_class), "init_args": self.data_kwargs(**overrides)}

    def make_items(self, count: int, seed: int = 0) -> list[TrainItem]:
        """``count`` train items sampled once from the env, the same for the same ``seed``.

        On-policy items hold one rollout of episodes each; off-policy items all hand over one
        replay buffer (seeded, so the minibatches drawn from it repeat too). The item's
        ``num_env_steps_sampled_lifetime`` counts on as a data module's would.
        """
        torch.manual_seed(seed)
        runner = EnvRunner(self.env, num_envs=NUM_ENVS, rollout_fragment_length=ITEM_ENV_STEPS // NUM_ENVS, seed=seed)
        try:
            module = self.module_spec().build()
            if self.off_policy:
                replay = ReplayBuffer(1000, seed=seed)
                for _ in range(FIXED_REPLAY_ENV_STEPS // ITEM_ENV_STEPS):
                    replay.add_episodes(runner.sample(module))
                data = [TrainingData(replay=replay) for _ in range(count)]
                first = FIXED_REPLAY_ENV_STEPS
            else:
                data = [TrainingData(episodes=runner.sample(module)) for _ in range(count)]
                first = ITEM_ENV_STEPS
        finally:
            runner.close()
        return [
            TrainItem(data=item_data, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: first + index * ITEM_ENV_STEPS})
            for index, item_data in enumerate(data)
        ]


def item_seed(item: TrainItem) -> int:
    """The torch seed set before a fixed item's update, in and out of a Trainer alike."""
    return int(item.timesteps[NUM_ENV_STEPS_SAMPLED_LIFETIME])


def update_standalone(learner: Learner, item: TrainItem) -> dict[str, dict[str, float]]:
    """Train ``learner`` on ``item`` without a Trainer, with the settings ``training_step`` uses."""
    torch.manual_seed(item_seed(item))
    data, timesteps = item.data, dict(item.timesteps)
    if data.source == "replay":
        return learner.update_from_replay(data.replay, timesteps=timesteps)
    hparams = learner.hparams
    settings = dict(
        timesteps=timesteps,
        num_epochs=hparams.num_epochs,
        minibatch_size=hparams.minibatch_size,
        shuffle_batch_per_epoch=hparams.shuffle_batch_per_epoch,
    )
    if data.source == "episodes":
        return learner.update_from_episodes(data.episodes, **settings)
    raise ValueError(f"update_standalone takes episodes or replay items, got TrainingData.{data.source}")


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


ROWS = [
    AlgorithmRow(
        name="BC",
        learner_class=BCLearner,
        module_class=BCModule,
        env="CartPole-v1",
        learner_kwargs=dict(lr=1e-2, num_epochs=2, minibatch_size=16),
        off_policy=False,
        steps_per_item=2 * ITEM_ENV_STEPS // 16,
        takes_model_config=False,
    ),
    AlgorithmRow(
        name="PPO",
        learner_class=PPOLearner,
        module_class=PPOModule,
        env="CartPole-v1",
        # Shuffled minibatches: the per-item seed must make them repeat.
        learner_kwargs=dict(lr=1e-2, num_epochs=2, minibatch_size=16, shuffle_batch_per_epoch=True),
        off_policy=False,
        steps_per_item=2 * ITEM_ENV_STEPS // 16,
    ),
    AlgorithmRow(
        name="IMPALA",
        learner_class=IMPALALearner,
        module_class=PPOModule,
        env="CartPole-v1",
        # Minibatches that end inside episode chunks (bootstrapped there); rows in order, as V-trace needs.
        learner_kwargs=dict(lr=1e-2, num_epochs=2, minibatch_size=16),
        off_policy=False,
        steps_per_item=2 * ITEM_ENV_STEPS // 16,
    ),
    AlgorithmRow(
        name="APPO",
        learner_class=APPOLearner,
        module_class=APPOModule,
        env="CartPole-v1",
        # The old policy follows every 3 steps: 4 steps per item, so a resume lands between updates of it.
        learner_kwargs=dict(lr=1e-2, num_epochs=2, minibatch_size=16, target_network_update_freq=3, use_kl_loss=True),
        off_policy=False,
        steps_per_item=2 * ITEM_ENV_STEPS // 16,
    ),
    AlgorithmRow(
        name="DQN",
        learner_class=DQNLearner,
        module_class=DQNModule,
        env="CartPole-v1",
        # A hard target sync every 3 steps: 2 steps per item, so a resume lands between syncs.
        learner_kwargs=dict(
            lr=1e-2, minibatch_size=16, gradient_steps=2, target_network_update_freq=3, epsilon=[[0, 1.0], [1000, 0.1]]
        ),
        off_policy=True,
        steps_per_item=2,
    ),
    AlgorithmRow(
        name="SAC",
        learner_class=SACLearner,
        module_class=SACModule,
        env="Pendulum-v1",
        # Polyak targets after every step; the actor and critic losses draw noise from torch's generator.
        learner_kwargs=dict(lr=1e-2, minibatch_size=16, gradient_steps=2, tau=0.1),
        off_policy=True,
        steps_per_item=2,
    ),
    # The offline algorithms train from replay as well (one-step rows, as a dataset's).
    AlgorithmRow(
        name="CQL",
        learner_class=CQLLearner,
        module_class=CQLModule,
        env="Pendulum-v1",
        learner_kwargs=dict(
            lr=1e-2,
            actor_lr=None,
            critic_lr=None,
            alpha_lr=None,
            minibatch_size=16,
            gradient_steps=2,
            tau=0.1,
            num_cql_actions=3,
            lagrangian=True,
        ),
        off_policy=True,
        steps_per_item=2,
    ),
    AlgorithmRow(
        name="IQL",
        learner_class=IQLLearner,
        module_class=IQLModule,
        env="Pendulum-v1",
        learner_kwargs=dict(lr=1e-2, minibatch_size=16, gradient_steps=2, tau=0.1),
        off_policy=True,
        steps_per_item=2,
    ),
]
