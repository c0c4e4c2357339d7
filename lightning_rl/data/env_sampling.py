"""``EnvSampling``: one rank's env runners, counters and their checkpoint state.

Both environment data modules (``OnPolicyDataModule``, ``OffPolicyDataModule``) hold one, and
the offline data module one for evaluation. It builds this rank's training and evaluation
``EnvRunner`` on first use from the ``EnvSettings`` it is given, with the data module's seeds
for this rank (``RankedDataModule.rank_seed``), apart from the other ranks'. It samples
rollouts and evaluation episodes with the module it is given, keeps the lifetime counters summed over all ranks (one ``all_gather`` per rollout, see
``rank_stats``; the same exchange carries each rank's new normalization statistics, which
every rank then merges in rank order, so they stay equal on all ranks) and saves and
restores them. It knows nothing of replay buffers or train items: what a rollout becomes is
the data module's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from lightning_rl.data.ranked_datamodule import EVALUATION_SEED_OFFSET, RankedDataModule
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.normalization import REWARD_NORMALIZATION_KEY, EnvNormalization, check_saved_statistics_fit

# The keys of ``EnvSampling.state_dict``; a data module adds its own beside them.
STATE_KEYS = (
    "train_runner", "rank", NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_EPISODES_LIFETIME,
    OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY,
)  # fmt: skip
NORMALIZATION_KEYS = (OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY)

Gather = Callable[[np.ndarray], np.ndarray]
EpisodeListener = Callable[[list[SingleAgentEpisode]], None]


class EnvSampling:
    """This rank's environment sampling: runners built on first use, global counters, state.

    Args:
        settings: The training runner's settings; its ``seed`` is replaced by this rank's.
        evaluation: The evaluation runner's settings (its own wrappers; ``record_video`` for
            ``evaluate(..., record_video=True)``, kept on rank 0 only); its ``num_envs`` and
            ``seed`` are replaced by this rank's. It takes the training normalization statistics
            before each evaluation (``training_statistics``) and never updates them.
        evaluation_num_envs: Evaluation envs, at most this rank's episodes; ``None`` for ``min(num_envs, this rank's episodes)``.
        evaluation_explore: Whether evaluation samples actions instead of acting greedily.
        ranks: The data module: its placement (asked whenever a runner is built, since the
            Trainer may attach late), this rank's seeds and its share of the evaluation episodes.
    """

    def __init__(
        self,
        settings: EnvSettings,
        evaluation: EnvSettings,
        *,
        evaluation_num_envs: int | None,
        evaluation_explore: bool,
        ranks: RankedDataModule,
    ) -> None:
        self.settings = settings
        self.evaluation = evaluation
        self.evaluation_num_envs = evaluation_num_envs
        self.evaluation_explore = evaluation_explore
        self.ranks = ranks
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
        #: Where evaluation takes its normalization statistics from when the training envs run
        #: elsewhere (``AsyncSamplingDataModule``: its own, merged from its samplers' reports);
        #: ``None``: the training runner's.
        self.training_statistics: Callable[[], EnvNormalization | None] | None = None
        #: Called with this rank's episodes after every training rollout that every rank completed
        #: (what ``sample`` returns: the ended episodes, then each env's running chunk, whose later
        #: chunks share its ``id_``). They may read the episodes and copy what they keep, never
        #: change them: the data module trains on them next. ``RecordEpisodes`` records through it.
        self.episode_listeners: list[EpisodeListener] = []

    # ------------------------------------------------------------------------------------
    # Runners
    # ------------------------------------------------------------------------------------

    @property
    def train_runner(self) -> EnvRunner:
        """This rank's training ``EnvRunner`` (built on first use)."""
        if self._train_runner is None:
            placement = self.ranks.placement()
            runner = EnvRunner.from_settings(self.settings.replace(seed=self.ranks.rank_seed(0)))
            self._train_runner = runner
            self._runner_placement["train"] = placement
            if self._pending_state is not None:
                self._restore_runner(runner, self._pending_state)
        return self._train_runner

    @property
    def eval_runner(self) -> EnvRunner:
        """This rank's evaluation ``EnvRunner`` (built on first use; its own envs and seeds)."""
        if self._eval_runner is None:
            placement = self.ranks.placement()
            # No more envs than the episodes this rank plays: the others would only be stepped.
            num_envs = min(self.evaluation_num_envs or self.settings.num_envs, self.ranks.evaluation_episodes_per_rank)
            settings = self.evaluation.replace(
                num_envs=num_envs,
                seed=self.ranks.rank_seed(EVALUATION_SEED_OFFSET),
                record_video=self.evaluation.record_video and placement[0] == 0,
            )
            self._eval_runner = EnvRunner.from_settings(settings)
            self._runner_placement["eval"] = placement
        return self._eval_runner

    def close_runners_built_elsewhere(self) -> None:
        """Close runners built for another (rank, world size) than the current one.

        That happens when a script reads the spaces before ``fit`` on every rank: they were
        built as rank 0 and would share rank 0's seeds. The counters and statistics carry
        over to the runners built next.
        """
        placement = self.ranks.placement()
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

        Observations are normalized with the training statistics as they stand (the training
        runner's, or ``training_statistics``'s).

        Args:
            module: Acts in the envs.
            record_video: Record the first episode's frames (rank 0, built with
                ``record_evaluation_video``); ``take_evaluation_video`` returns them.
        """
        # Without normalization there is nothing to copy, and no training envs need building
        # (an offline data module evaluates without ever sampling training envs).
        if self.settings.normalizes:
            if self.training_statistics is not None:
                statistics = self.training_statistics()
            else:
                statistics = self.train_runner.normalization
            if statistics is not None:
                self.eval_runner.normalization.load_state_dict(statistics.state_dict())
        num_episodes = self.ranks.evaluation_episodes_per_rank
        return self.eval_runner.sample_episodes(
            module, num_episodes, explore=self.evaluation_explore, record_first_episode=record_video
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
        check_saved_statistics_fit(state_dict, self.settings.normalize_observations)
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
        rank = self.ranks.placement()[0]
        runner_state = dict(state["train_runner"])
        env_steps, episodes = saved_global_counts(state)
        runner_state[NUM_ENV_STEPS_SAMPLED_LIFETIME] = env_steps if rank == 0 else 0
        runner_state[NUM_EPISODES_LIFETIME] = episodes if rank == 0 else 0
        if int(state.get("rank", 0)) != rank:
            runner_state["episode_returns"], runner_state["episode_lens"] = [], []
        return runner_state
