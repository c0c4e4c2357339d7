"""``EpisodeDataModule``: environment sampling as a Lightning data module.

Each train item is one rollout sampled with the Learner's *current* weights, in the
Learner's own process: ``{"episodes": [...], "timesteps": {...}, "env_runners": {...}}``.
The Learner's ``training_step`` turns the episodes into a train batch and updates on it, so
the next item is sampled by the updated weights (on-policy data, never one update behind).

That needs care with Lightning's fit loop, which fetches the next item *before* running the
current training step unless the train iterable has a length. The rollout iterable here
always has one (``rollouts_per_epoch``), so Lightning never prefetches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from lightning.pytorch import LightningDataModule

from lightning_rl.core.columns import DEFAULT_MODULE_ID, NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.rl_module import RLModule
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode

# Evaluation envs are seeded apart from the training envs, so evaluation never replays the
# exact episodes the policy trained on.
_EVALUATION_SEED_OFFSET = 1_000_003


class EpisodeDataModule(LightningDataModule):
    """Samples a gymnasium environment with the Learner's module, for ``Trainer.fit`` and ``validate``.

    Args:
        env: A registered gymnasium id (``"CartPole-v1"``), or a zero-argument callable
            that returns a ``gym.Env``.
        env_kwargs: Keyword arguments for ``gym.make`` (ids only).
        wrappers: Wrappers applied to each env, in order: import paths of wrapper classes
            (``"gymnasium.wrappers.NormalizeObservation"``), ``{"class_path": ..., "init_args":
            {...}}`` for wrappers that take arguments, or callables ``env -> env``.
        evaluation_wrappers: The evaluation envs' wrappers; ``None`` uses ``wrappers``. Set it
            when a training wrapper changes rewards (``NormalizeReward``, ``ClipReward``),
            so that ``eval/episode_return_mean`` stays in the env's own units.
        num_envs: Environments stepped together (one vector env) per rollout.
        rollout_fragment_length: Steps per environment per rollout; a train item holds
            ``num_envs * rollout_fragment_length`` env steps.
        vectorize_mode: ``"sync"`` (envs stepped in this process) or ``"async"`` (one
            subprocess per env, worth it for slow environments).
        seed: Seed of the training envs (env ``i`` gets ``seed + i``); ``None`` draws one
            from numpy's global generator, which ``seed_everything`` seeds.
        rollouts_per_epoch: Train items per Lightning epoch. Validation, checkpoints and
            epoch-level logging happen at epoch ends.
        max_env_steps: Stop training once this many env steps were sampled (over the whole
            run, resumed runs included); ``None`` for no limit (use the Trainer's).
        evaluation_num_episodes: Complete episodes per evaluation (``val_dataloader``).
        evaluation_num_envs: Environments stepped together during evaluation; defaults to
            ``min(num_envs, evaluation_num_episodes)``.
        evaluation_explore: Whether evaluation samples actions (``forward_exploration``)
            instead of acting greedily (``forward_inference``).
        episode_stats_window: Completed episodes averaged into ``episode_return_mean``.
        module_id: The Learner's module that acts in the env.

    Raises:
        ValueError: Naming the argument, for an unknown env id or invalid sizes.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env] = "CartPole-v1",
        *,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[str | dict[str, Any] | Callable[[gym.Env], gym.Env]] | None = None,
        evaluation_wrappers: Sequence[str | dict[str, Any] | Callable[[gym.Env], gym.Env]] | None = None,
        num_envs: int = 1,
        rollout_fragment_length: int = 200,
        vectorize_mode: Literal["sync", "async"] = "sync",
        seed: int | None = None,
        rollouts_per_epoch: int = 10,
        max_env_steps: int | None = None,
        evaluation_num_episodes: int = 10,
        evaluation_num_envs: int | None = None,
        evaluation_explore: bool = False,
        episode_stats_window: int = 100,
        module_id: str = DEFAULT_MODULE_ID,
    ) -> None:
        super().__init__()
        if isinstance(env, str) and env not in gym.registry:
            raise ValueError(f"env={env!r} is not a registered gymnasium environment id")
        if not isinstance(env, str) and not callable(env):
            raise ValueError(f"env must be a gymnasium id or a callable that makes an env, got {env!r}")
        for name, value in (
            ("num_envs", num_envs),
            ("rollout_fragment_length", rollout_fragment_length),
            ("rollouts_per_epoch", rollouts_per_epoch),
            ("evaluation_num_episodes", evaluation_num_episodes),
            ("episode_stats_window", episode_stats_window),
        ):
            _check_positive_int(name, value)
        for name, value in (("max_env_steps", max_env_steps), ("evaluation_num_envs", evaluation_num_envs)):
            if value is not None:
                _check_positive_int(name, value)
        if vectorize_mode not in ("sync", "async"):
            raise ValueError(f"vectorize_mode must be 'sync' or 'async', got {vectorize_mode!r}")
        # Callables (env factories, wrapper functions) are not plain data: keep them out of
        # the hyperparameters that go into checkpoints.
        callables = (("env", env), ("wrappers", wrappers), ("evaluation_wrappers", evaluation_wrappers))
        self.save_hyperparameters(ignore=[name for name, value in callables if _has_callable(value)])
        self.env = env
        self.wrappers = list(wrappers or [])
        self.evaluation_wrappers = self.wrappers if evaluation_wrappers is None else list(evaluation_wrappers)
        self._train_runner: EnvRunner | None = None
        self._eval_runner: EnvRunner | None = None
        self._pending_state: dict[str, Any] | None = None
        self._base_seed: int | None = seed

    # ------------------------------------------------------------------------------------
    # Spaces and sizes (read by the Learner at setup)
    # ------------------------------------------------------------------------------------

    @property
    def observation_space(self) -> gym.Space:
        """The single-env observation space."""
        return self.train_runner.observation_space

    @property
    def action_space(self) -> gym.Space:
        """The single-env action space."""
        return self.train_runner.action_space

    @property
    def train_batch_size(self) -> int:
        """Env steps per train item: ``num_envs * rollout_fragment_length``."""
        return self.hparams.num_envs * self.hparams.rollout_fragment_length

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled for training so far, resumed runs included."""
        if self._train_runner is None:
            return int((self._pending_state or {}).get("train_runner", {}).get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
        return self._train_runner.num_env_steps_sampled_lifetime

    @property
    def train_runner(self) -> EnvRunner:
        """The training ``EnvRunner`` (built on first use)."""
        if self._train_runner is None:
            self._train_runner = self._make_runner(self.hparams.num_envs, self._seed(), self.wrappers)
            if self._pending_state is not None:
                self._train_runner.set_state(self._pending_state["train_runner"])
        return self._train_runner

    @property
    def eval_runner(self) -> EnvRunner:
        """The evaluation ``EnvRunner`` (built on first use; its own envs and seeds)."""
        if self._eval_runner is None:
            num_envs = self.hparams.evaluation_num_envs or min(self.hparams.num_envs, self.hparams.evaluation_num_episodes)
            seed = self._seed() + _EVALUATION_SEED_OFFSET
            self._eval_runner = self._make_runner(num_envs, seed, self.evaluation_wrappers)
        return self._eval_runner

    def _seed(self) -> int:
        if self._base_seed is None:
            self._base_seed = int(np.random.randint(0, 2**31 - 1 - _EVALUATION_SEED_OFFSET))
        return self._base_seed

    def _make_runner(self, num_envs: int, seed: int, wrappers: list[Any]) -> EnvRunner:
        return EnvRunner(
            self.env,
            env_kwargs=self.hparams.env_kwargs,
            wrappers=wrappers,
            num_envs=num_envs,
            vectorize_mode=self.hparams.vectorize_mode,
            rollout_fragment_length=self.hparams.rollout_fragment_length,
            seed=seed,
            episode_stats_window=self.hparams.episode_stats_window,
        )

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def train_dataloader(self) -> _Rollouts:
        """One epoch of train items, each a rollout sampled when it is asked for."""
        return _Rollouts(self)

    def val_dataloader(self) -> _Evaluation:
        """One evaluation item: ``evaluation_num_episodes`` complete episodes."""
        return _Evaluation(self)

    def teardown(self, stage: str) -> None:
        """Close the environments (they are rebuilt if the data module is used again)."""
        for runner in (self._train_runner, self._eval_runner):
            if runner is not None:
                runner.close()
        if self._train_runner is not None:
            # Keep the counters, so a later fit on this data module continues them.
            self._pending_state = self.state_dict()
        self._train_runner = self._eval_runner = None

    def state_dict(self) -> dict[str, Any]:
        """The sampling counters and episode statistics, saved in Lightning checkpoints."""
        if self._train_runner is None:
            return dict(self._pending_state or {})
        return {"train_runner": self._train_runner.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: a resumed run continues the counters and statistics."""
        self._pending_state = dict(state_dict)
        if self._train_runner is not None and "train_runner" in state_dict:
            self._train_runner.set_state(state_dict["train_runner"])

    # ------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------

    def acting_module(self) -> RLModule:
        """The Learner's module that acts in the environment."""
        learner = self.trainer.lightning_module
        if learner.module is None:
            raise ValueError(f"{type(learner).__name__} is not built; the data module needs its module to sample")
        if self.hparams.module_id not in learner.module:
            raise ValueError(
                f"the Learner has no module {self.hparams.module_id!r} to sample with (module_id of the data "
                f"module); it has {sorted(learner.module.keys())}"
            )
        return learner.module[self.hparams.module_id]

    def sample_train_item(self) -> dict[str, Any]:
        """Sample one rollout with the current weights; return the train item."""
        runner = self.train_runner
        episodes = runner.sample(self.acting_module(), explore=True)
        metrics = runner.get_metrics()
        return {
            "episodes": episodes,
            "timesteps": {NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME]},
            "env_runners": metrics,
        }

    def sample_eval_item(self) -> dict[str, list[SingleAgentEpisode]]:
        """Play ``evaluation_num_episodes`` complete episodes with the current weights."""
        episodes = self.eval_runner.sample_episodes(
            self.acting_module(), self.hparams.evaluation_num_episodes, explore=self.hparams.evaluation_explore
        )
        return {"episodes": episodes}

    def _rollouts_left(self) -> int:
        """Rollouts in the next epoch: ``rollouts_per_epoch``, fewer when ``max_env_steps`` nears."""
        if self.hparams.max_env_steps is None:
            return self.hparams.rollouts_per_epoch
        remaining = self.hparams.max_env_steps - self.num_env_steps_sampled_lifetime
        return max(0, min(self.hparams.rollouts_per_epoch, math.ceil(remaining / self.train_batch_size)))


class _Rollouts:
    """A sized iterable of train items (sized, so Lightning does not prefetch one)."""

    def __init__(self, datamodule: EpisodeDataModule) -> None:
        self.datamodule = datamodule
        self.length = datamodule._rollouts_left()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[dict[str, Any]]:
        datamodule = self.datamodule
        for _ in range(self.length):
            item = datamodule.sample_train_item()
            budget = datamodule.hparams.max_env_steps
            if budget is not None and datamodule.num_env_steps_sampled_lifetime >= budget:
                # The update on this last item still runs; then the fit ends.
                datamodule.trainer.should_stop = True
            yield item


class _Evaluation:
    """A one-item iterable: the evaluation episodes, played when it is iterated."""

    def __init__(self, datamodule: EpisodeDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield self.datamodule.sample_eval_item()


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _has_callable(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_callable(item) for item in value)
    return callable(value) and not isinstance(value, str)
