"""``EpisodeDataModule``: environment sampling as a Lightning data module.

Each train item is one rollout sampled with the Learner's *current* weights, in the
Learner's own process: ``{"episodes": [...], "timesteps": {...}, "env_runners": {...}}``.
The Learner's ``training_step`` turns the episodes into a train batch and updates on it, so
the next item is sampled by the updated weights (on-policy data, never one update behind).

That needs care with Lightning's fit loop, which fetches the next item *before* running the
current training step unless the train iterable has a length. The rollout iterable here
always has one (``rollouts_per_epoch``), so Lightning never prefetches.

Off-policy (``replay_buffer_capacity`` set), each train item adds ``train_freq`` new env
steps to a replay buffer and hands the buffer to the Learner, which samples its minibatches
from it: ``{"replay": buffer, "timesteps": {...}, "env_runners": {...}}`` (``"replay"`` is
``None`` until ``learning_starts`` env steps are in the buffer). Sampling, evaluation,
counters and checkpoints work as on-policy.

Under a data-parallel strategy (``Trainer(strategy="ddp", devices=N)``, ``torchrun``, SLURM)
every rank samples envs of its own, seeded apart from the other ranks', and trains on its own
rollouts (the gradients are averaged by the strategy). After each rollout the ranks exchange
one small vector of counters and episode sums (one ``all_gather``), so every rank reports the
same global numbers: lifetime env steps and episodes are sums over the ranks, the return
statistics are taken over the union of the ranks' windows, and ``max_env_steps`` stops every
rank on the same rollout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule

from lightning_rl.core.columns import DEFAULT_MODULE_ID, NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.rl_module import RLModule
from lightning_rl.core.schedules import Schedule, ScheduleSetting
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode

# Evaluation envs are seeded apart from the training envs, so evaluation never replays the
# exact episodes the policy trained on.
_EVALUATION_SEED_OFFSET = 1_000_003
# Rank r adds r * this to its training and evaluation seeds. A runner's later resets move on
# by num_envs seeds each, so ranks would meet only after ~10M / num_envs resets.
_RANK_SEED_STRIDE = 10_000_000
# The replay buffer's and the warm-up actions' random generators, apart from the envs' seeds.
_REPLAY_SEED_OFFSET = 2_000_003
_NUM_EPISODES_LIFETIME = "num_episodes_lifetime"
# What each rank contributes to the per-rollout all_gather, in this order.
_STATS = (
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    _NUM_EPISODES_LIFETIME,
    "num_env_steps_sampled",
    "num_episodes",
    "sample_seconds",
    "window_count",
    "window_return_sum",
    "window_return_min",
    "window_return_max",
    "window_len_sum",
)


class EpisodeDataModule(LightningDataModule):
    """Samples a gymnasium environment with the Learner's module, for ``Trainer.fit`` and ``validate``.

    On several ranks (any data-parallel strategy) each rank samples its own envs and every
    size below is per rank, except ``max_env_steps`` and ``evaluation_num_episodes``, which
    count over all ranks. Rank ``r`` of a run seeds its envs with its own seeds (see ``seed``),
    so no two ranks play the same episodes.

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
        num_envs: Environments stepped together (one vector env) per rollout, per rank.
        rollout_fragment_length: Steps per environment per rollout; a train item holds
            ``num_envs * rollout_fragment_length`` env steps (per rank: N ranks sample N times
            that per rollout, together).
        vectorize_mode: ``"sync"`` (envs stepped in this process) or ``"async"`` (one
            subprocess per env, worth it for slow environments).
        seed: Base seed of the envs. Rank ``r``'s training env ``i`` first resets with
            ``seed + r * 10_000_000 + i`` and its evaluation env ``i`` with ``seed + 1_000_003
            + r * 10_000_000 + i``; later resets move on by ``num_envs`` seeds each. So rank 0
            (and a single-process run) uses ``seed`` itself, and a run is reproducible for a
            given seed and number of ranks. ``None`` draws the base seed from numpy's global
            generator: ``seed_everything`` seeds that alike on every rank, and the rank offset
            still keeps the ranks apart.
        rollouts_per_epoch: Train items (rollouts) per Lightning epoch. Validation,
            checkpoints and epoch-level logging happen at epoch ends.
        max_env_steps: Stop training once this many env steps were sampled, summed over all
            ranks and over the whole run (resumed runs included); every rank stops after the
            same rollout. ``None`` for no limit (use the Trainer's).
        evaluation_num_episodes: Complete episodes per evaluation (``val_dataloader``), over
            all ranks: each of N ranks plays ``ceil(evaluation_num_episodes / N)`` of them (an
            equal share, so a plain mean over ranks is the mean over all episodes).
        evaluation_num_envs: Environments stepped together during evaluation; defaults to
            ``min(num_envs, episodes this rank plays)``.
        evaluation_explore: Whether evaluation samples actions (``forward_exploration``)
            instead of acting greedily (``forward_inference``).
        episode_stats_window: Completed episodes per rank averaged into
            ``episode_return_mean`` (on N ranks the statistics cover the union of the N
            windows, each episode weighing the same).
        module_id: The Learner's module that acts in the env.
        replay_buffer_capacity: Off-policy mode: the replay buffer's size in env steps (per
            rank). ``None`` (the default) samples on-policy rollouts instead.
        prioritized_replay: Off-policy: sample rows in proportion to their TD errors
            (proportional prioritized replay) instead of uniformly.
        prioritized_replay_alpha: How strongly priorities shape sampling (0 is uniform).
        prioritized_replay_beta: The importance-weight exponent: a number or a schedule over
            env steps (usually annealed to 1).
        prioritized_replay_eps: Added to each ``|td_error|`` so no row's priority is zero.
        train_freq: Off-policy: env steps added to the buffer per train item (per rank; a
            multiple of ``num_envs``). Replaces ``rollout_fragment_length``.
        learning_starts: Off-policy: env steps (over all ranks) in the buffer before the
            Learner gets replay; until then items carry ``"replay": None``.
        random_actions_before_learning_starts: Off-policy: act uniformly at random until
            learning starts (as Stable-Baselines3 does) instead of with the module.
        checkpoint_replay_buffer: Off-policy: save the buffer's contents in checkpoints, so a
            resumed run replays what it had (checkpoints grow by the buffer's size). Without
            it a resumed run refills the buffer up to ``learning_starts`` before learning on.

    Raises:
        ValueError: Naming the argument, for an unknown env id, invalid sizes or a negative seed.
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
        replay_buffer_capacity: int | None = None,
        prioritized_replay: bool = False,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: ScheduleSetting = 0.4,
        prioritized_replay_eps: float = 1e-6,
        train_freq: int = 1,
        learning_starts: int = 1000,
        random_actions_before_learning_starts: bool = True,
        checkpoint_replay_buffer: bool = False,
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
        if replay_buffer_capacity is not None:
            _check_positive_int("replay_buffer_capacity", replay_buffer_capacity)
            _check_positive_int("train_freq", train_freq)
            if train_freq % num_envs:
                raise ValueError(
                    f"train_freq ({train_freq}) must be a multiple of num_envs ({num_envs}): every env steps "
                    "the same number of times per train item"
                )
            if isinstance(learning_starts, bool) or not isinstance(learning_starts, int) or learning_starts < 0:
                raise ValueError(f"learning_starts must be an int >= 0, got {learning_starts!r}")
            Schedule(prioritized_replay_beta, name="prioritized_replay_beta")
            # The buffer checks alpha and eps; build one now so bad values fail at construction.
            if prioritized_replay:
                PrioritizedReplayBuffer(1, alpha=prioritized_replay_alpha, epsilon=prioritized_replay_eps)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        # Callables (env factories, wrapper functions) are not plain data: keep them out of
        # the hyperparameters that go into checkpoints.
        callables = (("env", env), ("wrappers", wrappers), ("evaluation_wrappers", evaluation_wrappers))
        self.save_hyperparameters(ignore=[name for name, value in callables if _has_callable(value)])
        self.env = env
        self.wrappers = list(wrappers or [])
        self.evaluation_wrappers = self.wrappers if evaluation_wrappers is None else list(evaluation_wrappers)
        self._train_runner: EnvRunner | None = None
        self._eval_runner: EnvRunner | None = None
        # The (rank, world size) each runner was built for: seeds and the evaluation share
        # depend on them, and a runner built before the Trainer attached may need rebuilding.
        self._runner_placement: dict[str, tuple[int, int]] = {}
        self._pending_state: dict[str, Any] | None = None
        self._base_seed: int | None = seed
        # Counters summed over all ranks, as of the last rollout (or the restored state).
        self._global_env_steps = 0
        self._global_episodes = 0
        self._replay_buffer: ReplayBuffer | None = None
        self._random_module: _UniformRandomModule | None = None
        self._beta_schedule = Schedule(prioritized_replay_beta, name="prioritized_replay_beta")

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
    def is_off_policy(self) -> bool:
        """Whether train items hand the Learner a replay buffer (``replay_buffer_capacity`` is set)."""
        return self.hparams.replay_buffer_capacity is not None

    @property
    def train_batch_size(self) -> int:
        """Env steps per train item on one rank: ``num_envs * rollout_fragment_length``, or ``train_freq`` off-policy."""
        if self.is_off_policy:
            return self.hparams.train_freq
        return self.hparams.num_envs * self.hparams.rollout_fragment_length

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """This rank's replay buffer (off-policy mode only; built on first use).

        Raises:
            ValueError: In on-policy mode.
        """
        if not self.is_off_policy:
            raise ValueError("this EpisodeDataModule samples on-policy and has no replay buffer; set replay_buffer_capacity")
        if self._replay_buffer is None:
            hparams = self.hparams
            seed = self._seed() + _REPLAY_SEED_OFFSET + self._placement()[0] * _RANK_SEED_STRIDE
            if hparams.prioritized_replay:
                self._replay_buffer = PrioritizedReplayBuffer(
                    hparams.replay_buffer_capacity,
                    alpha=hparams.prioritized_replay_alpha,
                    beta=self._beta_schedule.value(self._global_env_steps),
                    epsilon=hparams.prioritized_replay_eps,
                    seed=seed,
                )
            else:
                self._replay_buffer = ReplayBuffer(hparams.replay_buffer_capacity, seed=seed)
            if self._pending_state is not None and "replay_buffer" in self._pending_state:
                self._replay_buffer.load_state_dict(_to_numpy(self._pending_state["replay_buffer"]))
        return self._replay_buffer

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled for training so far, summed over all ranks, resumed runs included.

        Every rank holds the same number: the sum as of the last rollout.
        """
        return self._global_env_steps

    @property
    def evaluation_episodes_per_rank(self) -> int:
        """Evaluation episodes this rank plays: ``ceil(evaluation_num_episodes / world_size)``."""
        return -(-self.hparams.evaluation_num_episodes // self._placement()[1])

    @property
    def train_runner(self) -> EnvRunner:
        """This rank's training ``EnvRunner`` (built on first use)."""
        if self._train_runner is None:
            rank, world_size = self._placement()
            seed = self._seed() + rank * _RANK_SEED_STRIDE
            self._train_runner = self._make_runner(self.hparams.num_envs, seed, self.wrappers)
            self._runner_placement["train"] = (rank, world_size)
            if self._pending_state is not None and "train_runner" in self._pending_state:
                self._train_runner.set_state(self._runner_state_for_this_rank(self._pending_state))
        return self._train_runner

    @property
    def eval_runner(self) -> EnvRunner:
        """This rank's evaluation ``EnvRunner`` (built on first use; its own envs and seeds)."""
        if self._eval_runner is None:
            rank, world_size = self._placement()
            num_envs = self.hparams.evaluation_num_envs or min(self.hparams.num_envs, self.evaluation_episodes_per_rank)
            seed = self._seed() + _EVALUATION_SEED_OFFSET + rank * _RANK_SEED_STRIDE
            self._eval_runner = self._make_runner(num_envs, seed, self.evaluation_wrappers)
            self._runner_placement["eval"] = (rank, world_size)
        return self._eval_runner

    def _placement(self) -> tuple[int, int]:
        """(global rank, world size) of the attached Trainer; (0, 1) without one."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _seed(self) -> int:
        if self._base_seed is None:
            self._base_seed = int(np.random.randint(0, 2**31 - 1 - _EVALUATION_SEED_OFFSET))
        return self._base_seed

    def _vector_steps_per_item(self) -> int:
        if self.is_off_policy:
            return self.hparams.train_freq // self.hparams.num_envs
        return self.hparams.rollout_fragment_length

    def _make_runner(self, num_envs: int, seed: int, wrappers: list[Any]) -> EnvRunner:
        return EnvRunner(
            self.env,
            env_kwargs=self.hparams.env_kwargs,
            wrappers=wrappers,
            num_envs=num_envs,
            vectorize_mode=self.hparams.vectorize_mode,
            rollout_fragment_length=self._vector_steps_per_item(),
            seed=seed,
            episode_stats_window=self.hparams.episode_stats_window,
        )

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        """Rebuild runners made before the Trainer said which rank this is (they would share rank 0's seeds).

        That happens when a script reads ``observation_space`` before ``fit`` on every rank.
        The counters and statistics carry over; the envs had not been stepped for training
        under their old seeds in a way worth keeping.
        """
        placement = self._placement()
        stale = [kind for kind, built_for in self._runner_placement.items() if built_for != placement]
        if stale:
            self._close_runners()

    def train_dataloader(self) -> _Rollouts:
        """One epoch of train items, each a rollout sampled when it is asked for."""
        return _Rollouts(self)

    def val_dataloader(self) -> _Evaluation:
        """One evaluation item: this rank's share of ``evaluation_num_episodes`` complete episodes."""
        return _Evaluation(self)

    def teardown(self, stage: str) -> None:
        """Close the environments (they are rebuilt if the data module is used again)."""
        self._close_runners()

    def _close_runners(self) -> None:
        for runner in (self._train_runner, self._eval_runner):
            if runner is not None:
                runner.close()
        if self._train_runner is not None:
            # Keep the counters, so a later fit on this data module continues them.
            self._pending_state = self.state_dict()
        self._train_runner = self._eval_runner = None
        self._runner_placement.clear()

    def state_dict(self) -> dict[str, Any]:
        """The sampling counters and episode statistics, saved in Lightning checkpoints.

        Returns:
            ``{"train_runner": this rank's EnvRunner state, "rank": this rank,
            "num_env_steps_sampled_lifetime": sum over ranks, "num_episodes_lifetime": sum
            over ranks}``, plus ``"replay_buffer"`` (this rank's buffer, as tensors) with
            ``checkpoint_replay_buffer``. Lightning writes rank 0's into a checkpoint; the
            sums are the same on every rank.
        """
        if self._train_runner is None:
            return dict(self._pending_state or {})
        state = {
            "train_runner": self._train_runner.get_state(),
            "rank": self._runner_placement["train"][0],
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self._global_env_steps,
            _NUM_EPISODES_LIFETIME: self._global_episodes,
        }
        if self._replay_buffer is not None and self.hparams.checkpoint_replay_buffer:
            # Tensors, not numpy arrays: checkpoints stay loadable with torch.load(weights_only=True).
            state["replay_buffer"] = _to_tensors(self._replay_buffer.state_dict())
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: a resumed run continues the counters and statistics.

        Works on any number of ranks, whatever number wrote the state: the global counters
        continue from the saved sums (rank 0 carries them, the other ranks count from 0, so
        the sum over ranks is right); the rank that saved the state (in a checkpoint, rank
        0) restores its episode-statistics window, the others start theirs empty; every rank
        restores the reset count, so no rank replays the episodes it started with. A saved
        replay buffer is restored on every rank (each then adds its own new steps), so all
        ranks start learning again together.
        """
        self._pending_state = dict(state_dict)
        self._global_env_steps, self._global_episodes = _global_counts(self._pending_state)
        if self._train_runner is not None and "train_runner" in state_dict:
            self._train_runner.set_state(self._runner_state_for_this_rank(self._pending_state))
        # Rebuilt on first use, from the saved contents if there are any.
        self._replay_buffer = None

    def _runner_state_for_this_rank(self, state: dict[str, Any]) -> dict[str, Any]:
        rank = self._placement()[0]
        runner_state = dict(state["train_runner"])
        env_steps, episodes = _global_counts(state)
        runner_state[NUM_ENV_STEPS_SAMPLED_LIFETIME] = env_steps if rank == 0 else 0
        runner_state[_NUM_EPISODES_LIFETIME] = episodes if rank == 0 else 0
        if int(state.get("rank", 0)) != rank:
            runner_state["episode_returns"], runner_state["episode_lens"] = [], []
        return runner_state

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

    def sample_train_item(self) -> TrainItem:
        """Sample one rollout with the current weights on this rank; return the train item.

        On several ranks this is a collective call (one ``all_gather`` of a small vector):
        every rank must call it the same number of times.

        Returns:
            A ``TrainItem``: this rank's episodes, ``{"num_env_steps_sampled_lifetime": sum over
            ranks}`` as timesteps, and statistics over all ranks (the keys of
            ``EnvRunner.get_metrics``) as ``env_runners``. Off-policy, the data is the replay
            buffer the episodes were added to, or nothing before learning starts.

        Raises:
            RuntimeError: If the Trainer runs several processes without ``torch.distributed``.
        """
        runner = self.train_runner
        if self.is_off_policy:
            acting = self.acting_module()  # checked even while random actions stand in for it
            if self.hparams.random_actions_before_learning_starts and not self._learning_started():
                acting = self._uniform_random_module()
            episodes = runner.sample(acting, explore=True)
            self.replay_buffer.add_episodes(episodes)
        else:
            episodes = runner.sample(self.acting_module(), explore=True)
        metrics = combine_rank_stats(self._gather(local_rank_stats(runner, runner.get_metrics())))
        self._global_env_steps = int(metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        self._global_episodes = int(metrics[_NUM_EPISODES_LIFETIME])
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME]}
        if not self.is_off_policy:
            return TrainItem(TrainingData(episodes=episodes), timesteps=timesteps, env_runners=metrics)
        buffer = self.replay_buffer
        if isinstance(buffer, PrioritizedReplayBuffer):
            buffer.beta = self._beta_schedule.value(self._global_env_steps)
        replay = buffer if self._learning_started() else None
        return TrainItem(TrainingData(replay=replay), timesteps=timesteps, env_runners=metrics)

    def _learning_started(self) -> bool:
        """Whether this rank's buffer holds its share of ``learning_starts`` (or is full).

        Every rank adds the same number of steps per item, so all ranks agree. A run resumed
        without the buffer's contents refills its share first.
        """
        world_size = self._placement()[1]
        share = min(-(-self.hparams.learning_starts // world_size), self.hparams.replay_buffer_capacity)
        return len(self.replay_buffer) >= max(share, 1)

    def _uniform_random_module(self) -> _UniformRandomModule:
        if self._random_module is None:
            seed = self._seed() + _REPLAY_SEED_OFFSET + 1 + self._placement()[0] * _RANK_SEED_STRIDE
            self._random_module = _UniformRandomModule(self.observation_space, self.action_space, seed=seed)
        return self._random_module

    def _gather(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` vector, ``[world_size, len(local)]``, in rank order."""
        world_size = self._placement()[1]
        if world_size == 1:
            return local[None]
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"the Trainer runs {world_size} processes but torch.distributed is not initialized; "
                "EpisodeDataModule needs a torch.distributed strategy (ddp, fsdp, deepspeed) on several ranks"
            )
        # On the strategy's device: NCCL gathers only device tensors, gloo only CPU ones.
        # float64 keeps counts exact up to 2**53.
        tensor = torch.from_numpy(local).to(self.trainer.strategy.root_device)
        gathered = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(gathered, tensor)
        return torch.stack(gathered).cpu().numpy()

    def sample_eval_item(self) -> TrainItem:
        """Play this rank's share of the evaluation episodes with the current weights."""
        episodes = self.eval_runner.sample_episodes(
            self.acting_module(), self.evaluation_episodes_per_rank, explore=self.hparams.evaluation_explore
        )
        return TrainItem(TrainingData(episodes=episodes))

    def _rollouts_left(self) -> int:
        """Rollouts in the next epoch: ``rollouts_per_epoch``, fewer when ``max_env_steps`` nears.

        The same on every rank: the budget and the counter are global, and each rollout
        samples ``world_size * train_batch_size`` env steps over all ranks.
        """
        if self.hparams.max_env_steps is None:
            return self.hparams.rollouts_per_epoch
        remaining = self.hparams.max_env_steps - self.num_env_steps_sampled_lifetime
        per_rollout = self.train_batch_size * self._placement()[1]
        return max(0, min(self.hparams.rollouts_per_epoch, math.ceil(remaining / per_rollout)))


class _Rollouts:
    """A sized iterable of train items (sized, so Lightning does not prefetch one)."""

    def __init__(self, datamodule: EpisodeDataModule) -> None:
        self.datamodule = datamodule
        self.length = datamodule._rollouts_left()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[TrainItem]:
        datamodule = self.datamodule
        for _ in range(self.length):
            item = datamodule.sample_train_item()
            budget = datamodule.hparams.max_env_steps
            # The counter is the global one, equal on every rank: all ranks stop together.
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


def local_rank_stats(runner: EnvRunner, metrics: dict[str, float]) -> np.ndarray:
    """This rank's contribution to the cross-rank statistics: counts and sums, never means.

    Args:
        runner: The rank's training runner (its statistics window and lifetime counters).
        metrics: What ``runner.get_metrics()`` returned for the rollout just sampled.

    Returns:
        A float64 vector in the order of ``_STATS``. A rank with no completed episode yet
        contributes count 0 and +inf / -inf as min / max, so it does not turn the global
        statistics into NaN.
    """
    returns, lens = runner.episode_stats_window_values
    steps = metrics["num_env_steps_sampled"]
    rate = metrics["env_steps_per_sec"]
    seconds = steps / rate if steps > 0 and math.isfinite(rate) and rate > 0 else 0.0
    return np.array(
        [
            metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME],
            metrics[_NUM_EPISODES_LIFETIME],
            steps,
            metrics["num_episodes"],
            seconds,
            len(returns),
            returns.sum(),
            returns.min() if len(returns) else math.inf,
            returns.max() if len(returns) else -math.inf,
            lens.sum(),
        ],
        dtype=np.float64,
    )


def combine_rank_stats(gathered: np.ndarray) -> dict[str, float]:
    """Fold every rank's ``local_rank_stats`` into the statistics of ``EnvRunner.get_metrics``.

    Counters are summed. Return and length statistics are over the union of the ranks'
    windows (a rank with more completed episodes weighs more; NaN only while no rank has
    one). ``env_steps_per_sec`` is the env steps of all ranks over the longest sampling
    time of a rank (ranks sample at the same time).

    Args:
        gathered: ``[world_size, len(_STATS)]``, one row per rank.

    Returns:
        The keys of ``EnvRunner.get_metrics``, as floats.
    """
    column = {name: gathered[:, index] for index, name in enumerate(_STATS)}
    count = float(column["window_count"].sum())
    nan = float("nan")
    steps = float(column["num_env_steps_sampled"].sum())
    seconds = float(column["sample_seconds"].max())
    return {
        "episode_return_mean": float(column["window_return_sum"].sum()) / count if count else nan,
        "episode_return_min": float(column["window_return_min"].min()) if count else nan,
        "episode_return_max": float(column["window_return_max"].max()) if count else nan,
        "episode_len_mean": float(column["window_len_sum"].sum()) / count if count else nan,
        "num_episodes": float(column["num_episodes"].sum()),
        _NUM_EPISODES_LIFETIME: float(column[_NUM_EPISODES_LIFETIME].sum()),
        "num_env_steps_sampled": steps,
        NUM_ENV_STEPS_SAMPLED_LIFETIME: float(column[NUM_ENV_STEPS_SAMPLED_LIFETIME].sum()),
        "env_steps_per_sec": steps / seconds if seconds > 0 else nan,
    }


def _global_counts(state: dict[str, Any]) -> tuple[int, int]:
    """(env steps, episodes) summed over ranks in a saved state; older states held one rank's."""
    runner_state = state.get("train_runner", {})
    env_steps = state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, runner_state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
    episodes = state.get(_NUM_EPISODES_LIFETIME, runner_state.get(_NUM_EPISODES_LIFETIME, 0))
    return int(env_steps), int(episodes)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _has_callable(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_callable(item) for item in value)
    return callable(value) and not isinstance(value, str)


class _UniformRandomModule(RLModule):
    """Acts uniformly at random in the action space: off-policy warm-up before learning starts."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, *, seed: int) -> None:
        super().__init__(observation_space, action_space)
        self._rng = np.random.default_rng(seed)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        num_rows = len(batch[Columns.OBS])
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            actions = space.start + self._rng.integers(0, space.n, size=num_rows)
        elif isinstance(space, gym.spaces.Box) and space.is_bounded():
            actions = self._rng.uniform(space.low, space.high, size=(num_rows, *space.shape)).astype(space.dtype)
        else:  # unbounded boxes and the other spaces: the space's own sampler, seeded alike
            space.seed(int(self._rng.integers(2**31)))
            actions = np.stack([space.sample() for _ in range(num_rows)])
        return {Columns.ACTIONS: torch.from_numpy(np.asarray(actions))}


def _to_tensors(value: Any) -> Any:
    """numpy arrays in a nested state become tensors (plain data for ``weights_only`` loading)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {key: _to_tensors(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tensors(item) for item in value)
    return value


def _to_numpy(value: Any) -> Any:
    """The inverse of ``_to_tensors``."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(item) for item in value)
    return value
