"""``OnPolicyDataModule``: rollouts sampled with the current weights, trained on once.

Each train item is one rollout of this rank's envs (``num_envs * rollout_fragment_length``
env steps), sampled with the Learner's *current* weights when Lightning asks for it:
``TrainItem(TrainingData(episodes=[...]), timesteps={...}, env_runners={...})``. The
Learner's ``training_step`` turns the episodes into a train batch and updates on it, so the
next item is sampled by the updated weights (never one update behind: the train iterable is
sized, so Lightning does not prefetch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from lightning_rl.core.arguments import check_int
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import ENV_STEPS, DataOffer
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.env_datamodule import (
    ASYNC_SAMPLING_ARGUMENTS,
    OFF_POLICY_ARGUMENTS,
    EnvDataModule,
    refuse_arguments_of,
)


class OnPolicyDataModule(EnvDataModule):
    """Samples on-policy rollouts of a gymnasium environment for PPO-like Learners.

    Args:
        env: A registered gymnasium id (``"CartPole-v1"``; ``"ale_py:ALE/Pong-v5"`` imports
            ``ale_py`` first), the import path of an env factory (``"my_package.envs.make_env"``),
            or a zero-argument callable that returns a ``gym.Env``.
        rollout_fragment_length: Steps per environment per rollout; a train item holds
            ``num_envs * rollout_fragment_length`` env steps (per rank: N ranks sample N times
            that per rollout, together).
        **kwargs: The arguments every environment data module takes (``num_envs``, ``seed``,
            ``rollouts_per_epoch``, ``max_env_steps``, ``evaluation_num_episodes``, ...): see
            ``EnvDataModule``.

    Raises:
        ValueError: Naming the argument, for invalid values, and naming ``OffPolicyDataModule``
            for its arguments (``replay_buffer_capacity``, ``train_freq``, ...), and
            ``AsyncSamplingDataModule`` for its (``num_env_runners``, ...).
    """

    def __init__(
        self, env: str | Callable[[], gym.Env] = "CartPole-v1", *, rollout_fragment_length: int = 200, **kwargs: Any
    ) -> None:
        refuse_arguments_of("OffPolicyDataModule", OFF_POLICY_ARGUMENTS, kwargs)
        refuse_arguments_of("AsyncSamplingDataModule", ASYNC_SAMPLING_ARGUMENTS, kwargs)
        check_int("rollout_fragment_length", rollout_fragment_length)
        super().__init__(env, **kwargs)

    @property
    def train_batch_size(self) -> int:
        """Env steps per train item on one rank: ``num_envs * rollout_fragment_length``."""
        return self.hparams.num_envs * self.hparams.rollout_fragment_length

    @property
    def replay_buffer(self) -> Any:
        """There is none: on-policy Learners train on each rollout once.

        Raises:
            ValueError: Always, naming the data module that replays.
        """
        raise ValueError(
            f"{type(self).__name__} samples on-policy rollouts and has no replay buffer; "
            "use lightning_rl.data.OffPolicyDataModule for replay"
        )

    def sample_train_item(self) -> TrainItem:
        """Sample one rollout with the current weights on this rank; return the train item.

        On several ranks this is a collective call (one ``all_gather`` of a small vector):
        every rank must call it the same number of times.

        Returns:
            A ``TrainItem``: this rank's episodes, ``{"num_env_steps_sampled_lifetime": sum over
            ranks}`` as timesteps, and statistics over all ranks (the keys of
            ``EnvRunner.get_metrics``) as ``env_runners``.

        Raises:
            RuntimeError: If the Trainer runs several processes without ``torch.distributed``.
        """
        with self.acting_module() as module:
            episodes, metrics = self.sampling.sample(module, self._gather)
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME]}
        return TrainItem(TrainingData(episodes=episodes), timesteps=timesteps, env_runners=metrics)

    def data_offer(self) -> DataOffer:
        """Episodes of ``train_batch_size`` env steps per item, and the env's spaces (``DataSource``); it counts env steps."""
        return DataOffer(
            frozenset({"episodes"}),
            train_batch_size=self.train_batch_size,
            spaces=self._offered_spaces,
            step_name=ENV_STEPS,
        )
