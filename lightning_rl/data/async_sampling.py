"""``AsyncSamplingDataModule``: rollouts sampled apart from the Learner, with lagged weights (IMPALA, APPO).

``OnPolicyDataModule`` samples in the Learner's process with the current weights, so the
Learner waits for the envs and the envs for the Learner. Here each rank runs
``num_env_runners`` samplers of its own (processes, or Ray actors) that sample all the time
with the weights last sent to them, into a bounded queue (``lightning_rl.env.sampler_pool``):

1. **Weights.** Before each train item the data module sends the Learner's weights when
   ``broadcast_interval`` updates passed since the last sending (processes: one write into
   shared memory; Ray: one ``ray.put``). A rollout records the ``weights_seq_no`` it was
   sampled with; ``env_runners/weights_seq_no_lag`` is the Learner's ``weights_seq_no`` when
   the item is handed out minus that (in gradient steps: ``weights_seq_no`` counts them).
2. **Reuse.** A ``CircularBuffer`` keeps the last ``circular_buffer_num_batches`` rollouts and
   hands each out up to ``circular_buffer_iterations_per_batch`` times. Each train item takes
   at most one new rollout from the queue (none is dropped unused); when the queue is empty it
   reuses a rollout with uses left; when none has, it waits. The Learner sets these through
   ``DataRequirements.sample_reuse`` (``None``: 1, 1, 1, i.e. every rollout once, weights after
   every update).
3. **Counters.** ``num_env_steps_sampled_lifetime`` counts the env steps of the rollouts taken
   from the queue (a reused rollout is counted once), summed over the ranks with the episode
   statistics as ``EnvSampling`` does (``rank_stats``, one ``all_gather`` per item). Rollouts
   still queued or in flight when the fit ends, or when a checkpoint is resumed, are dropped.

Normalization (``normalize_observations``, ``normalize_rewards``): each sampler normalizes with
its runner's statistics and sends what it saw since its last rollout with each rollout. The
data module merges every rank's new rollouts' reports into its own statistics (in the same
exchange as the counters, so they are equal on every rank), evaluates and checkpoints with
them, and sends them to the samplers with the weights; a sampler then normalizes with them
plus what it saw since its last report (RLlib's ``MeanStdFilter`` sync). A sampler's statistics
lag the data module's by the rollouts in flight, as its weights lag the Learner's.

Seeds: sampler ``i`` of rank ``r`` seeds its envs with ``seed + r * 10_000_000 + i * 100_003``
(``rank_seed(0) + i * SAMPLER_SEED_STRIDE``): sampler 0 is seeded as ``OnPolicyDataModule``'s
training envs. Env ``j`` of that sampler first resets with that seed ``+ j``; each (re)start of
a sampler moves its seeds on by ``num_envs`` (``Sampler``), so a restarted sampler and a resumed
run sample new episodes. Evaluation stays in this process, seeded as ``EnvDataModule``'s.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import cloudpickle
import gymnasium as gym
import numpy as np

from lightning_rl.core.arguments import check_int
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import ENV_STEPS, DataOffer, DataRequirements, SampleReuse, SpacePair
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.circular_buffer import CircularBuffer
from lightning_rl.data.env_datamodule import (
    EVALUATION_VIDEO_KEY,
    OFF_POLICY_ARGUMENTS,
    EnvDataModule,
    refuse_arguments_of,
)
from lightning_rl.data.rank_stats import (
    NUM_EPISODES_LIFETIME,
    NUM_RANK_STATS,
    combine_rank_stats,
    failed_rank_stats,
    raise_if_a_rank_failed,
    rank_stats_of,
    saved_global_counts,
)
from lightning_rl.data.env_sampling import NORMALIZATION_KEYS
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.normalization import EnvNormalization, check_saved_statistics_fit
from lightning_rl.env.sampler import MAX_SAMPLERS, SAMPLER_SEED_STRIDE, Rollout
from lightning_rl.env.sampler_pool import ProcessSamplerPool, SamplerPool

#: ``env_runners/...`` keys this data module logs beside ``EnvRunner.get_metrics``'s.
WEIGHTS_SEQ_NO_LAG = "weights_seq_no_lag"  # Learner's weights_seq_no minus the rollout's (mean over ranks)
NUM_ENV_RUNNER_RESTARTS = "num_env_runner_restarts"  # samplers restarted after a fault (sum over ranks, whole run)
NUM_QUEUED_ROLLOUTS = "num_queued_rollouts"  # rollouts received and waiting (sum over ranks)
ROLLOUT_USES = "rollout_uses"  # the times this rank's item's rollout was handed out, this one included
# Where the state holds each sampler's start count (its seeds move on with it).
SAMPLER_STARTS_KEY = "sampler_starts"
# The exchange appends these to ``rank_stats``'s vector: lag, restarts, queued.
_NUM_EXTRA_STATS = 3

SamplerBackend = Literal["process", "ray"]


class AsyncSamplingDataModule(EnvDataModule):
    """Samples rollouts in ``num_env_runners`` samplers per rank, apart from the Learner (IMPALA, APPO).

    Args:
        env: A registered gymnasium id, the import path of an env factory
            (``"my_package.envs.make_env"``), or a callable that returns a ``gym.Env``; it is
            sent to the samplers with cloudpickle, so it must pickle.
        rollout_fragment_length: Steps per environment per rollout; a train item holds
            ``num_envs * rollout_fragment_length`` env steps (``num_envs`` envs per sampler).
        num_env_runners: Samplers per rank (RLlib's name), each with ``num_envs`` envs, its own
            copy of the acting module and one torch thread. At most 99.
        max_queued_rollouts: The most rollouts a rank's samplers may have been asked for and
            not yet handed to the Learner; when it is reached they wait (back-pressure).
            ``None`` for ``2 * num_env_runners``.
        sampler_backend: ``"process"`` (processes on this machine) or ``"ray"`` (Ray actors,
            ``pip install "lightning-rl[ray]"``; on a Ray cluster, see ``ray_address``).
        max_num_env_runner_restarts: The most sampler restarts (after deaths, errors, hangs)
            per rank over a fit before it stops (RLlib's name). Besides, a sampler that fails
            3 times in a row without a rollout stops the fit, naming the cause.
        ray_address: ``ray.init``'s ``address`` when Ray is not initialized yet (``"auto"``
            joins the cluster of this machine, started with ``ray start --head``); ``None``:
            ``RAY_ADDRESS``, else a Ray instance of this machine. Ignored by the process backend.
        **kwargs: ``EnvDataModule``'s arguments (``num_envs``, ``seed``, ``rollouts_per_epoch``,
            ``max_env_steps``, ``evaluation_num_episodes``, ``sample_timeout_s``, ...).
            ``sample_timeout_s`` also bounds how long a sampler may take over a rollout
            before it is killed and restarted.

    Raises:
        ValueError: Naming the argument, for invalid values; for ``vectorize_mode="async"``
            (the samplers are processes already), an env or wrapper that does not pickle, and
            the arguments of ``OffPolicyDataModule``.
        ImportError: For ``sampler_backend="ray"`` without Ray installed.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env] = "CartPole-v1",
        *,
        rollout_fragment_length: int = 50,
        num_env_runners: int = 2,
        max_queued_rollouts: int | None = None,
        sampler_backend: SamplerBackend = "process",
        max_num_env_runner_restarts: int = 100,
        ray_address: str | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_arguments_of("OffPolicyDataModule", OFF_POLICY_ARGUMENTS, kwargs)
        check_int("rollout_fragment_length", rollout_fragment_length)
        check_int("num_env_runners", num_env_runners)
        if num_env_runners > MAX_SAMPLERS:
            raise ValueError(
                f"num_env_runners must be at most {MAX_SAMPLERS} (samplers per rank), got {num_env_runners}"
            )
        check_int("max_queued_rollouts", max_queued_rollouts, optional=True)
        check_int("max_num_env_runner_restarts", max_num_env_runner_restarts, minimum=0)
        if sampler_backend not in ("process", "ray"):
            raise ValueError(f"sampler_backend must be 'process' or 'ray', got {sampler_backend!r}")
        _refuse_unsupported(kwargs)
        super().__init__(env, **kwargs)
        _check_sendable(self.env_settings)
        if sampler_backend == "ray":
            from lightning_rl.env.ray_sampler_pool import import_ray

            import_ray()  # fail now, in one line, without Ray
        self._reuse = SampleReuse()
        self._pool: SamplerPool | None = None
        self._buffer: CircularBuffer | None = None  # of Rollouts
        self._items_since_broadcast = 0
        # This rank's counters (rank 0 continues the restored sums) and the sums over the ranks.
        self._local_env_steps = self._local_episodes = 0
        self._global_env_steps = self._global_episodes = 0
        window = self.hparams.episode_stats_window
        self._returns: deque[float] = deque(maxlen=window)
        self._lens: deque[int] = deque(maxlen=window)
        # Restarts of the pools closed before this one (and of a restored run), and each sampler's next start.
        self._restarts_before = 0
        self._sampler_starts = [0] * num_env_runners
        # The normalization statistics over every sampler of every rank (built on first use), and
        # restored ones waiting for it.
        self._normalization: EnvNormalization | None = None
        self._restored_statistics: dict[str, Any] | None = None
        self.sampling.training_statistics = self._statistics

    # ------------------------------------------------------------------------------------
    # Sizes, spaces and the data contract
    # ------------------------------------------------------------------------------------

    @property
    def train_batch_size(self) -> int:
        """Env steps per train item on one rank: ``num_envs * rollout_fragment_length``."""
        return self.hparams.num_envs * self.hparams.rollout_fragment_length

    @property
    def max_queued_rollouts(self) -> int:
        """The bound on a rank's rollouts asked for and not yet handed out (``2 * num_env_runners`` by default)."""
        return self.hparams.max_queued_rollouts or 2 * self.hparams.num_env_runners

    @functools.cached_property
    def _spaces(self) -> SpacePair:
        """The env's spaces, from one env built here and closed (the samplers' envs live elsewhere)."""
        runner = EnvRunner.from_settings(self.env_settings.replace(num_envs=1, seed=None, rollout_fragment_length=1))
        try:
            return runner.observation_space, runner.action_space
        finally:
            runner.close()

    @property
    def observation_space(self) -> gym.Space:
        """The single-env observation space."""
        return self._spaces[0]

    @property
    def action_space(self) -> gym.Space:
        """The single-env action space."""
        return self._spaces[1]

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps of the rollouts taken from the samplers, summed over all ranks, resumed runs included."""
        return self._global_env_steps

    @property
    def pool(self) -> SamplerPool | None:
        """This rank's samplers while a fit runs (started by the first train item); ``None`` otherwise."""
        return self._pool

    def _statistics(self) -> EnvNormalization | None:
        """The normalization statistics merged from every sampler's reports (built on first use); ``None`` when off."""
        if self._normalization is None and self.env_settings.normalizes:
            settings = self.env_settings
            self._normalization = EnvNormalization(
                self.observation_space, 1, normalize_observations=settings.normalize_observations,
                normalize_rewards=settings.normalize_rewards, clip=settings.normalization_clip,
                gamma=settings.normalization_gamma,
            )  # fmt: skip
            if self._restored_statistics is not None:
                self._normalization.load_state_dict(self._restored_statistics)
        return self._normalization

    def data_offer(self) -> DataOffer:
        """Episodes of ``train_batch_size`` env steps per item, and the env's spaces; it counts env steps."""
        return DataOffer(
            frozenset({"episodes"}), train_batch_size=self.train_batch_size, spaces=self._offered_spaces,
            step_name=ENV_STEPS,
        )  # fmt: skip

    def accept_requirements(self, requirements: DataRequirements) -> None:
        """Take the Learner's ``sample_reuse`` (RLlib's circular buffer and broadcast settings); ``None``: 1, 1, 1."""
        self._reuse = requirements.sample_reuse or SampleReuse()
        self._buffer = None

    @property
    def replay_buffer(self) -> Any:
        """There is none (rollouts are reused through the circular buffer only).

        Raises:
            ValueError: Always, naming the data module that replays.
        """
        raise ValueError(
            f"{type(self).__name__} has no replay buffer; use lightning_rl.data.OffPolicyDataModule for replay"
        )

    # ------------------------------------------------------------------------------------
    # Train items
    # ------------------------------------------------------------------------------------

    def sample_train_item(self) -> TrainItem:
        """One rollout for the next update: a new one from the samplers if one is queued, else a reused one, else wait.

        On several ranks this is a collective call (one ``all_gather`` of a small vector):
        every rank must call it the same number of times.

        Returns:
            ``TrainItem(TrainingData(episodes=...), timesteps={"num_env_steps_sampled_lifetime":
            sum over ranks}, env_runners=...)``: ``EnvRunner.get_metrics``'s keys over all ranks,
            plus ``weights_seq_no_lag``, ``num_env_runner_restarts``, ``num_queued_rollouts``
            and ``rollout_uses``.

        Raises:
            SamplerFailedError: If a sampler keeps failing (its cause named), or restarts exceed
                ``max_num_env_runner_restarts``.
            SamplingFailedOnAnotherRank: If that happened on another rank.
        """
        normalization = self._statistics()
        statistics_size = 0 if normalization is None else normalization.exchange_size
        try:
            pool = self._pool if self._pool is not None else self._start_pool()
            if self._items_since_broadcast >= self._reuse.broadcast_interval:
                statistics = None if normalization is None else normalization.statistics_vector()
                with self.acting_module() as module:
                    pool.broadcast(module.state_dict(), self.trainer.lightning_module.weights_seq_no, statistics)
                self._items_since_broadcast = 0
            rollout, uses = self._next_rollout(pool)
        except Exception:
            # Tell the other ranks before raising: they are about to wait for this rank in the gather.
            self._gather(np.concatenate([failed_rank_stats(), np.zeros(_NUM_EXTRA_STATS + statistics_size)]))
            raise
        self._items_since_broadcast += 1
        lag = self.trainer.lightning_module.weights_seq_no - rollout.weights_seq_no
        new = uses == 1
        if new:
            self._local_env_steps += rollout.env_steps
            self._local_episodes += len(rollout.new_returns)
            self._returns.extend(float(value) for value in rollout.new_returns)
            self._lens.extend(int(value) for value in rollout.new_lens)
        local = rank_stats_of(
            np.asarray(self._returns, dtype=np.float64),
            np.asarray(self._lens, dtype=np.int64),
            {
                NUM_ENV_STEPS_SAMPLED_LIFETIME: self._local_env_steps,
                NUM_EPISODES_LIFETIME: self._local_episodes,
                "num_env_steps_sampled": rollout.env_steps if new else 0,
                "num_episodes": len(rollout.new_returns) if new else 0,
                "env_steps_per_sec": rollout.metrics["env_steps_per_sec"] if new else math.nan,
                **pool.env_fault_counts,
            },
        )
        restarts = self._restarts_before + pool.num_restarts
        # A reused rollout's statistics were merged when it was new: it reports nothing (a count of 0).
        report = rollout.new_statistics if new and rollout.new_statistics is not None else np.zeros(statistics_size)
        gathered = self._gather(np.concatenate([local, [lag, restarts, pool.num_queued], report]))
        raise_if_a_rank_failed(gathered)
        metrics = combine_rank_stats(gathered[:, :NUM_RANK_STATS])
        extra = gathered[:, NUM_RANK_STATS : NUM_RANK_STATS + _NUM_EXTRA_STATS]
        if normalization is not None:
            normalization.merge_ranks(gathered[:, NUM_RANK_STATS + _NUM_EXTRA_STATS :])
        self._global_env_steps = int(metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        self._global_episodes = int(metrics[NUM_EPISODES_LIFETIME])
        metrics.update({
            WEIGHTS_SEQ_NO_LAG: float(extra[:, 0].mean()),
            NUM_ENV_RUNNER_RESTARTS: float(extra[:, 1].sum()),
            NUM_QUEUED_ROLLOUTS: float(extra[:, 2].sum()),
            ROLLOUT_USES: float(uses),
        })  # fmt: skip
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME]}
        return TrainItem(TrainingData(episodes=rollout.episodes), timesteps=timesteps, env_runners=metrics)

    def _next_rollout(self, pool: SamplerPool) -> tuple[Rollout, int]:
        """(rollout, times handed out): a queued one if any, else one with uses left, else the next to arrive."""
        if self._buffer is None:
            self._buffer = CircularBuffer(
                self._reuse.circular_buffer_num_batches, self._reuse.circular_buffer_iterations_per_batch
            )
        fresh = pool.take(block=False)
        if fresh is None:
            reused = self._buffer.next()
            if reused is not None:
                return reused
            fresh = pool.take(block=True)
        self._buffer.add(fresh)
        return self._buffer.next()

    def _start_pool(self) -> SamplerPool:
        """Start this rank's samplers with copies of the Learner's module and its current weights."""
        rank_seed = self.rank_seed(0)
        fragment = self.hparams.rollout_fragment_length
        settings = [
            self.env_settings.replace(rollout_fragment_length=fragment, seed=rank_seed + index * SAMPLER_SEED_STRIDE)
            for index in range(self.hparams.num_env_runners)
        ]
        with self.acting_module() as module:
            copied = copy.deepcopy(module).to("cpu")
        normalization = self._statistics()
        options = dict(
            statistics=None if normalization is None else normalization.statistics_vector(),
            weights_seq_no=self.trainer.lightning_module.weights_seq_no,
            max_queued=self.max_queued_rollouts,
            sample_timeout_s=self.hparams.sample_timeout_s,
            max_restarts=self.hparams.max_num_env_runner_restarts,
            starts=self._sampler_starts,
            check_interrupt=self.stop_if_sigterm_received,  # a scheduler's stop ends a wait for rollouts at once
        )
        if self.hparams.sampler_backend == "ray":
            from lightning_rl.env.ray_sampler_pool import RaySamplerPool

            pool: SamplerPool = RaySamplerPool(settings, copied, address=self.hparams.ray_address, **options)
        else:
            pool = ProcessSamplerPool(settings, copied, **options)
        self._pool = pool
        self._items_since_broadcast = 0
        pool.start()
        return pool

    def _close_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        pool.close()
        self._restarts_before += pool.num_restarts
        # The next pool's samplers start with new seeds (rollouts not taken are dropped).
        self._sampler_starts = [start + 1 for start in pool.starts]
        self._buffer = None

    # ------------------------------------------------------------------------------------
    # Lightning hooks and state
    # ------------------------------------------------------------------------------------

    def teardown(self, stage: str) -> None:
        """Stop the samplers (no process or actor outlives the fit) and close the evaluation envs."""
        self._close_pool()
        super().teardown(stage)

    def on_exception(self, exception: BaseException) -> None:
        """Stop the samplers when the fit raises or is interrupted (Ctrl-C): Lightning calls no ``teardown`` then."""
        self._close_pool()

    def state_dict(self) -> dict[str, Any]:
        """The counters and episode statistics, as ``EnvDataModule``'s, plus each sampler's start count.

        Returns:
            ``{"train_runner": {"num_env_steps_sampled_lifetime", "num_episodes_lifetime" (this
            rank's), "num_resets": 0, "episode_returns", "episode_lens"}, "rank",
            "num_env_steps_sampled_lifetime", "num_episodes_lifetime" (sums over ranks),
            "sampler_starts", "num_env_runner_restarts", "observation_normalization",
            "reward_normalization"}`` (and the evaluation-video count); the normalization
            statistics are the merged ones, equal on every rank (``None`` when off; see
            ``EnvNormalization.state_dict``). The rollouts queued or in flight are not saved: a
            resumed run starts new samplers.
        """
        starts = self._pool.starts if self._pool is not None else self._sampler_starts
        normalization = self._statistics()
        state: dict[str, Any] = {
            "train_runner": {
                NUM_ENV_STEPS_SAMPLED_LIFETIME: self._local_env_steps, NUM_EPISODES_LIFETIME: self._local_episodes,
                "num_resets": 0, "episode_returns": list(self._returns), "episode_lens": list(self._lens),
            },
            "rank": self.placement()[0],
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self._global_env_steps,
            NUM_EPISODES_LIFETIME: self._global_episodes,
            SAMPLER_STARTS_KEY: list(starts),
            NUM_ENV_RUNNER_RESTARTS: self._restarts_before + (self._pool.num_restarts if self._pool else 0),
            **(dict.fromkeys(NORMALIZATION_KEYS) if normalization is None else normalization.state_dict()),
        }  # fmt: skip
        if self._evaluation_video is not None:
            state[EVALUATION_VIDEO_KEY] = self._evaluation_video.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()`` on any number of ranks, as ``EnvSampling.load_state_dict`` does.

        Rank 0 continues the saved sums (the other ranks count from 0, so the sum over ranks is
        right); the rank that saved the state restores the episode-statistics window; every
        sampler starts one start further on (new seeds); every rank restores the normalization
        statistics, and its samplers start from them.

        Raises:
            ValueError: As ``check_saved_statistics_fit`` (observation statistics saved, normalization off).
        """
        check_saved_statistics_fit(state_dict, self.env_settings.normalize_observations)
        self._restored_statistics = {key: state_dict.get(key) for key in NORMALIZATION_KEYS}
        if self._normalization is not None:
            self._normalization.load_state_dict(self._restored_statistics)
        rank = self.placement()[0]
        self._global_env_steps, self._global_episodes = saved_global_counts(state_dict)
        self._local_env_steps = self._global_env_steps if rank == 0 else 0
        self._local_episodes = self._global_episodes if rank == 0 else 0
        self._returns.clear()
        self._lens.clear()
        runner_state = state_dict.get("train_runner", {})
        if int(state_dict.get("rank", 0)) == rank:
            self._returns.extend(float(value) for value in runner_state.get("episode_returns", []))
            self._lens.extend(int(value) for value in runner_state.get("episode_lens", []))
        saved_starts = list(state_dict.get(SAMPLER_STARTS_KEY, []))
        self._sampler_starts = [
            int(saved_starts[index]) + 1 if index < len(saved_starts) else 0
            for index in range(self.hparams.num_env_runners)
        ]
        self._restarts_before = int(state_dict.get(NUM_ENV_RUNNER_RESTARTS, 0))
        if self._evaluation_video is not None:
            self._evaluation_video.load_state_dict(state_dict.get(EVALUATION_VIDEO_KEY, {}))
        self._restored_from = getattr(self.trainer, "ckpt_path", None)


def _refuse_unsupported(kwargs: dict[str, Any]) -> None:
    """Raise for the ``EnvDataModule`` settings the samplers do not support, naming each and what to do."""
    if kwargs.get("vectorize_mode") == "async":
        raise ValueError(
            'AsyncSamplingDataModule does not support vectorize_mode="async" (its samplers are processes already): '
            "raise num_env_runners instead"
        )


def _check_sendable(settings: Any) -> None:
    """Raise unless the env settings (env, factory, wrappers) can be sent to a sampler with cloudpickle."""
    try:
        cloudpickle.dumps(settings)
    except Exception as error:  # noqa: BLE001 (pickling raises many kinds): named in the message
        raise ValueError(
            "AsyncSamplingDataModule sends the env to its samplers by pickling it (cloudpickle), but "
            f"env={settings.env!r} or its wrappers cannot be pickled ({type(error).__name__}: {error}); pass a "
            "registered env id or the import path of a module-level env factory ('my_package.envs.make_env')"
        ) from None


