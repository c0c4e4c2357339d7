"""``EnvSampling``: one rank's env runners, seeds, counters and their checkpoint state.

Both environment data modules (``OnPolicyDataModule``, ``OffPolicyDataModule``) hold one.
It builds this rank's training and evaluation ``EnvRunner`` on first use, seeded apart from
the other ranks', samples rollouts and evaluation episodes with the module it is given,
keeps the lifetime counters summed over all ranks (one ``all_gather`` per rollout, see
``rank_stats``; the same exchange carries each rank's new normalization statistics, which
every rank then merges in rank order, so they stay equal on all ranks) and saves and
restores them. It knows nothing of replay buffers or train items: what a rollout becomes is
the data module's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.normalization import OBSERVATION_NORMALIZATION_KEY
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.data.rank_stats import (
    NUM_EPISODES_LIFETIME,
    NUM_RANK_STATS,
    combine_rank_stats,
    failed_rank_stats,
    local_rank_stats,
    raise_if_a_rank_failed,
    saved_global_counts,
)
from lightning_rl.env.env_factory import VectorizeMode
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.nonfinite import OnNonFinite
from lightning_rl.env.normalization import REWARD_NORMALIZATION_KEY, check_saved_statistics_fit

# Evaluation envs are seeded apart from the training envs, so evaluation never replays the
# exact episodes the policy trained on.
EVALUATION_SEED_OFFSET = 1_000_003
# Rank r adds r * this to its training and evaluation seeds. A runner's later resets move on
# by num_envs seeds each, so ranks would meet only after ~10M / num_envs resets.
RANK_SEED_STRIDE = 10_000_000
# The keys of ``EnvSampling.state_dict``; a data module adds its own beside them.
STATE_KEYS = (
    "train_runner", "rank", NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_EPISODES_LIFETIME,
    OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY,
)  # fmt: skip
NORMALIZATION_KEYS = (OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY)

Placement = Callable[[], tuple[int, int]]
Gather = Callable[[np.ndarray], np.ndarray]
EpisodeListener = Callable[[list[SingleAgentEpisode]], None]


class EnvSampling:
    """This rank's environment sampling: runners built on first use, global counters, state.

    Args:
        env: A registered gymnasium id, or a zero-argument callable that returns a ``gym.Env``.
        env_kwargs: Keyword arguments for ``gym.make`` or the env factory.
        wrappers: The training envs' wrappers (see ``EnvRunner``).
        evaluation_wrappers: The evaluation envs' wrappers.
        num_envs: Training envs stepped together.
        steps_per_env: Vector steps per rollout (``EnvRunner.rollout_fragment_length``).
        vectorize_mode: ``"sync"``, ``"async"`` or ``"envpool"``.
        seed: The base seed; ``None`` draws one from numpy's global generator on first use.
        evaluation_num_episodes: Evaluation episodes over all ranks.
        evaluation_num_envs: Evaluation envs; ``None`` for ``min(num_envs, this rank's episodes)``.
        evaluation_explore: Whether evaluation samples actions instead of acting greedily.
        episode_stats_window: Completed episodes in each runner's statistics window.
        placement: Returns ``(global rank, world size)`` of the attached Trainer, ``(0, 1)``
            without one; asked whenever a runner is built, since the Trainer may attach late.
        sample_timeout_s, restart_failed_sub_environments, on_nonfinite: How both runners
            handle env faults (see ``EnvRunner``).
        record_evaluation_video: Build rank 0's evaluation runner to record videos
            (``EnvRunner(record_video=True)``), for ``evaluate(..., record_video=True)``.
        normalization: ``EnvRunner``'s ``normalize_observations``, ``normalize_rewards``,
            ``normalization_clip`` and ``normalization_gamma``, for both runners (the
            evaluation runner takes the training runner's statistics before each evaluation
            and never updates them).
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env],
        *,
        env_kwargs: dict[str, Any] | None,
        wrappers: list[Any],
        evaluation_wrappers: list[Any],
        num_envs: int,
        steps_per_env: int,
        vectorize_mode: VectorizeMode,
        seed: int | None,
        evaluation_num_episodes: int,
        evaluation_num_envs: int | None,
        evaluation_explore: bool,
        episode_stats_window: int,
        placement: Placement,
        sample_timeout_s: float | None,
        restart_failed_sub_environments: bool,
        on_nonfinite: OnNonFinite,
        record_evaluation_video: bool = False,
        normalization: dict[str, Any] | None = None,
    ) -> None:
        self.env = env
        self.env_kwargs = env_kwargs
        self.wrappers = wrappers
        self.evaluation_wrappers = evaluation_wrappers
        self.num_envs = num_envs
        self.steps_per_env = steps_per_env
        self.vectorize_mode = vectorize_mode
        self.evaluation_num_episodes = evaluation_num_episodes
        self.evaluation_num_envs = evaluation_num_envs
        self.evaluation_explore = evaluation_explore
        self.episode_stats_window = episode_stats_window
        self.placement = placement
        self.sample_timeout_s = sample_timeout_s
        self.restart_failed_sub_environments = restart_failed_sub_environments
        self.on_nonfinite = on_nonfinite
        self.record_evaluation_video = record_evaluation_video
        self.normalization = dict(normalization or {})
        self._base_seed = seed
        self._train_runner: EnvRunner | None = None
        self._eval_runner: EnvRunner | None = None
        # The (rank, world size) each runner was built for: seeds and the evaluation share
        # depend on them, and a runner built before the Trainer attached may need rebuilding.
        self._runner_placement: dict[str, tuple[int, int]] = {}
        # A restored state not yet applied to a runner (the runner is built later).
        self._pending_state: dict[str, Any] | None = None
        # Counters summed over all ranks, as of the last rollout (or the restored state).
        self._global_env_steps = 0
        self._global_episodes = 0
        #: Called with this rank's episodes after every training rollout that every rank completed
        #: (what ``sample`` returns: the ended episodes, then each env's running chunk, whose later
        #: chunks share its ``id_``). They may read the episodes and copy what they keep, never
        #: change them: the data module trains on them next. ``RecordEpisodes`` records through it.
        self.episode_listeners: list[EpisodeListener] = []

    # ------------------------------------------------------------------------------------
    # Runners and seeds
    # ------------------------------------------------------------------------------------

    @property
    def train_runner(self) -> EnvRunner:
        """This rank's training ``EnvRunner`` (built on first use)."""
        if self._train_runner is None:
            rank, world_size = self.placement()
            runner = self._make_runner(self.num_envs, self.rank_seed(0), self.wrappers)
            self._train_runner = runner
            self._runner_placement["train"] = (rank, world_size)
            if self._pending_state is not None:
                self._restore_runner(runner, self._pending_state)
        return self._train_runner

    @property
    def eval_runner(self) -> EnvRunner:
        """This rank's evaluation ``EnvRunner`` (built on first use; its own envs and seeds)."""
        if self._eval_runner is None:
            rank, world_size = self.placement()
            num_envs = self.evaluation_num_envs or min(self.num_envs, self.evaluation_episodes_per_rank)
            seed = self.rank_seed(EVALUATION_SEED_OFFSET)
            record_video = self.record_evaluation_video and rank == 0
            self._eval_runner = self._make_runner(num_envs, seed, self.evaluation_wrappers, record_video=record_video)
            self._runner_placement["eval"] = (rank, world_size)
        return self._eval_runner

    @property
    def evaluation_episodes_per_rank(self) -> int:
        """Evaluation episodes this rank plays: ``ceil(evaluation_num_episodes / world_size)``."""
        return -(-self.evaluation_num_episodes // self.placement()[1])

    def rank_seed(self, offset: int) -> int:
        """``base seed + offset + rank * 10_000_000``: a seed of this rank's own for one purpose.

        Args:
            offset: Keeps purposes apart (0 for the training envs, ``EVALUATION_SEED_OFFSET``
                for the evaluation envs; data modules pick their own for what they seed).
        """
        if self._base_seed is None:
            self._base_seed = int(np.random.randint(0, 2**31 - 1 - EVALUATION_SEED_OFFSET))
        return self._base_seed + offset + self.placement()[0] * RANK_SEED_STRIDE

    def close_runners_built_elsewhere(self) -> None:
        """Close runners built for another (rank, world size) than the current one.

        That happens when a script reads the spaces before ``fit`` on every rank: they were
        built as rank 0 and would share rank 0's seeds. The counters and statistics carry
        over to the runners built next.
        """
        placement = self.placement()
        if any(built_for != placement for built_for in self._runner_placement.values()):
            self.close()

    def close(self) -> None:
        """Close both runners; they are rebuilt on next use, continuing the counters."""
        for runner in (self._train_runner, self._eval_runner):
            if runner is not None:
                runner.close()
        if self._train_runner is not None:
            self._pending_state = self.state_dict()
        self._train_runner = self._eval_runner = None
        self._runner_placement.clear()

    def _make_runner(self, num_envs: int, seed: int, wrappers: list[Any], *, record_video: bool = False) -> EnvRunner:
        return EnvRunner(
            self.env,
            env_kwargs=self.env_kwargs,
            wrappers=wrappers,
            num_envs=num_envs,
            vectorize_mode=self.vectorize_mode,
            rollout_fragment_length=self.steps_per_env,
            seed=seed,
            episode_stats_window=self.episode_stats_window,
            sample_timeout_s=self.sample_timeout_s,
            restart_failed_sub_environments=self.restart_failed_sub_environments,
            on_nonfinite=self.on_nonfinite,
            record_video=record_video,
            **self.normalization,
        )

    # ------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled for training, summed over all ranks as of the last rollout."""
        return self._global_env_steps

    def sample(self, module: RLModule, gather: Gather) -> tuple[list[SingleAgentEpisode], dict[str, float]]:
        """Sample one rollout on this rank and update the global counters.

        Args:
            module: Acts in the envs (``forward_exploration``).
            gather: Every rank's statistics vector from this rank's (see
                ``rank_stats.all_gather_rows``); a collective call on several ranks.

        Returns:
            This rank's episodes and the statistics over all ranks (the keys of
            ``EnvRunner.get_metrics``). The runner's normalization statistics are then those
            of every rank's observations and returns, the same on every rank. Each of
            ``episode_listeners`` was called with the episodes before they are returned.

        Raises:
            SamplingFailedOnAnotherRank: If another rank's rollout raised (that rank raises
                its own error), so that every rank stops at the same rollout.
        """
        runner = self.train_runner
        normalization = runner.normalization
        try:
            episodes = runner.sample(module, explore=True)
        except Exception:
            # Tell the other ranks before raising: they are about to wait for this rank in
            # the gather, and would otherwise wait until the process group's timeout.
            size = 0 if normalization is None else normalization.exchange_size
            gather(np.concatenate([failed_rank_stats(), np.zeros(size)]))
            raise
        local = local_rank_stats(runner, runner.get_metrics())
        if normalization is not None:
            local = np.concatenate([local, normalization.new_statistics()])
        gathered = gather(local)
        raise_if_a_rank_failed(gathered)
        metrics = combine_rank_stats(gathered[:, :NUM_RANK_STATS])
        if normalization is not None:
            normalization.merge_ranks(gathered[:, NUM_RANK_STATS:])
        self._global_env_steps = int(metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        self._global_episodes = int(metrics[NUM_EPISODES_LIFETIME])
        for listener in self.episode_listeners:
            listener(episodes)
        return episodes, metrics

    def evaluate(self, module: RLModule, *, record_video: bool = False) -> list[SingleAgentEpisode]:
        """Play this rank's share of the evaluation episodes, complete, with ``module``.

        Observations are normalized with the training runner's statistics as they stand.

        Args:
            module: Acts in the envs.
            record_video: Record the first episode's frames (rank 0, built with
                ``record_evaluation_video``); ``take_evaluation_video`` returns them.
        """
        # Without normalization there is nothing to copy, and no training envs need building
        # (an offline data module evaluates without ever sampling training envs).
        normalizes = self.normalization.get("normalize_observations") or self.normalization.get("normalize_rewards")
        if normalizes and self.train_runner.normalization is not None:
            self.eval_runner.normalization.load_state_dict(self.train_runner.normalization.state_dict())
        return self.eval_runner.sample_episodes(
            module, self.evaluation_episodes_per_rank, explore=self.evaluation_explore, record_first_episode=record_video
        )

    def take_evaluation_video(self) -> tuple[np.ndarray | None, int | None]:
        """``(frames, fps)`` of the episode the last ``evaluate(..., record_video=True)`` recorded, then forgotten.

        ``frames`` is ``[T, H, W, 3]`` uint8, ``None`` if nothing was recorded; ``fps`` the env's ``render_fps``.
        """
        runner = self.eval_runner
        return runner.take_recorded_frames(), runner.render_fps

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's runner state, its rank, the lifetime sums and the normalization statistics.

        ``{"train_runner": EnvRunner.get_state(), "rank": int, "num_env_steps_sampled_lifetime":
        int, "num_episodes_lifetime": int, "observation_normalization": ..., "reward_normalization": ...}``.

        The sums (``num_env_steps_sampled_lifetime``, ``num_episodes_lifetime``) are over all
        ranks, the same on every rank; so are the normalization statistics
        (``observation_normalization`` and ``reward_normalization``, ``None`` when off; see
        ``EnvNormalization.state_dict``). Before the runner is built: the restored state, if any.
        """
        if self._train_runner is None:
            return dict(self._pending_state or {})
        normalization = self._train_runner.normalization
        return {
            "train_runner": self._train_runner.get_state(),
            "rank": self._runner_placement["train"][0],
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self._global_env_steps,
            NUM_EPISODES_LIFETIME: self._global_episodes,
            **(dict.fromkeys(NORMALIZATION_KEYS) if normalization is None else normalization.state_dict()),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (its ``STATE_KEYS``; other keys are the data module's).

        Works on any number of ranks, whatever number wrote the state: the global counters
        continue from the saved sums (rank 0 carries them, the other ranks count from 0, so
        the sum over ranks is right); the rank that saved the state (in a checkpoint, rank
        0) restores its episode-statistics window, the others start theirs empty; every rank
        restores the reset count, so no rank replays the episodes it started with; every rank
        restores the normalization statistics (a state saved without them, by an older version
        or a run without normalization, leaves them fresh).
        """
        check_saved_statistics_fit(state_dict, self.normalization.get("normalize_observations", False))
        self._pending_state = {key: state_dict[key] for key in STATE_KEYS if key in state_dict}
        self._global_env_steps, self._global_episodes = saved_global_counts(self._pending_state)
        if self._train_runner is not None:
            self._restore_runner(self._train_runner, self._pending_state)

    def _restore_runner(self, runner: EnvRunner, state: dict[str, Any]) -> None:
        if "train_runner" in state:
            runner.set_state(self._runner_state_for_this_rank(state))
        if runner.normalization is not None:
            runner.normalization.load_state_dict({key: state.get(key) for key in NORMALIZATION_KEYS})

    def _runner_state_for_this_rank(self, state: dict[str, Any]) -> dict[str, Any]:
        rank = self.placement()[0]
        runner_state = dict(state["train_runner"])
        env_steps, episodes = saved_global_counts(state)
        runner_state[NUM_ENV_STEPS_SAMPLED_LIFETIME] = env_steps if rank == 0 else 0
        runner_state[NUM_EPISODES_LIFETIME] = episodes if rank == 0 else 0
        if int(state.get("rank", 0)) != rank:
            runner_state["episode_returns"], runner_state["episode_lens"] = [], []
        return runner_state
