"""``EnvDataModule``: what the on- and off-policy data modules share, around one ``EnvSampling``.

A train item is sampled with the Learner's *current* weights, in the Learner's own process,
when Lightning asks for it. That needs care with Lightning's fit loop, which fetches the next
item *before* running the current training step unless the train iterable has a length: the
iterable here always has one (``rollouts_per_epoch``), so Lightning never prefetches, and
on-policy data is never one update behind.

Under a data-parallel strategy (``Trainer(strategy="ddp", devices=N)``, ``torchrun``, SLURM)
every rank samples envs of its own, seeded apart from the other ranks', and trains on its own
items (the gradients are averaged by the strategy). After each rollout the ranks exchange one
small vector of counters and episode sums (``rank_stats``), so every rank reports the same
global numbers and ``max_env_steps`` stops every rank on the same rollout.

The subclasses say what a rollout becomes (``sample_train_item``) and how many env steps it
holds (``train_batch_size``). Placement, seeds and the env-step budget are the base's
(``RankedDataModule``); the env settings are one ``EnvSettings``, checked here once; the
sampling itself is ``self.sampling``'s.
"""

from __future__ import annotations

import abc
import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym
from lightning.fabric.utilities.cloud_io import get_filesystem

from lightning_rl.core.arguments import check_int
from lightning_rl.core.columns import DEFAULT_MODULE_ID, NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import SpacePair
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data.acting_module import learner_acting_module
from lightning_rl.data.env_sampling import EnvSampling
from lightning_rl.data.evaluation_video import EvaluationVideo
from lightning_rl.data.ranked_datamodule import RankedDataModule
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.frame_recorder import check_records_frames

# Each class's own constructor arguments, so that one used on the other class gets an error
# naming the class it belongs to (tests check these against the signatures).
ON_POLICY_ARGUMENTS = ("rollout_fragment_length",)
# AsyncSamplingDataModule's own, beside rollout_fragment_length (which it shares with OnPolicyDataModule).
ASYNC_SAMPLING_ARGUMENTS = (
    "num_env_runners", "max_queued_rollouts", "sampler_backend", "max_num_env_runner_restarts", "ray_address",
)  # fmt: skip
OFF_POLICY_ARGUMENTS = (
    "replay_buffer_capacity",
    "prioritized_replay",
    "prioritized_replay_alpha",
    "prioritized_replay_beta",
    "prioritized_replay_eps",
    "train_freq",
    "cycles_per_item",
    "learning_starts",
    "random_actions_before_learning_starts",
    "checkpoint_replay_buffer",
)
# Both data modules were one, ``EpisodeDataModule``, which saved its state in checkpoints
# under this name (Lightning keys a data module's state by its class name).
FORMER_STATE_KEY = "EpisodeDataModule"
# Where the state holds the evaluation-video count (``EvaluationVideo.state_dict``).
EVALUATION_VIDEO_KEY = "evaluation_video"

WrapperSpec = str | dict[str, Any] | Callable[[gym.Env], gym.Env]


class EnvDataModule(RankedDataModule):
    """Samples a gymnasium environment with the Learner's module, for ``Trainer.fit`` and ``validate``.

    Use ``OnPolicyDataModule`` or ``OffPolicyDataModule``; these are the arguments both take.
    On several ranks (any data-parallel strategy) each rank samples its own envs and every
    size below is per rank, except ``max_env_steps`` and ``evaluation_num_episodes``, which
    count over all ranks.

    Args:
        env: A registered gymnasium id (``"CartPole-v1"``; ``"ale_py:ALE/Pong-v5"`` imports
            ``ale_py`` first), the import path of an env factory (``"my_package.envs.make_env"``),
            or a zero-argument callable that returns a ``gym.Env``.
        env_kwargs: Keyword arguments for ``gym.make`` or the env factory.
        wrappers: Wrappers applied to each env, in order: import paths of wrapper classes
            (``"gymnasium.wrappers.NormalizeObservation"``), ``{"class_path": ..., "init_args":
            {...}}`` for wrappers that take arguments, or callables ``env -> env``.
        evaluation_wrappers: The evaluation envs' wrappers; ``None`` uses ``wrappers``. Set it
            when a training wrapper changes rewards (``NormalizeReward``, ``ClipReward``),
            so that ``eval/episode_return_mean`` stays in the env's own units.
        num_envs: Environments stepped together (one vector env) per rollout, per rank.
        vectorize_mode: ``"sync"`` (envs stepped in this process), ``"async"`` (one
            subprocess per env, worth it for slow environments) or ``"envpool"`` (EnvPool's
            C++ threads, ``pip install "lightning-rl[envpool]"``: ``env`` must be an id EnvPool
            has, ``env_kwargs`` its EnvPool options; no wrappers, evaluation videos or
            ``restart_failed_sub_environments``; see ``lightning_rl.env.envpool_vector_env``).
        seed: Base seed of the envs. Rank ``r``'s training env ``i`` first resets with
            ``seed + r * 10_000_000 + i`` and its evaluation env ``i`` with ``seed + 1_000_003
            + r * 10_000_000 + i``; later resets move on by ``num_envs`` seeds each. So rank 0
            (and a single-process run) uses ``seed`` itself, and a run is reproducible for a
            given seed and number of ranks. ``None`` draws the base seed from numpy's global
            generator: ``seed_everything`` seeds that alike on every rank, and the rank offset
            still keeps the ranks apart.
        rollouts_per_epoch: Train items per Lightning epoch. Validation, checkpoints and
            epoch-level logging happen at epoch ends.
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
        sample_timeout_s: The most seconds one rollout may take on a rank (each evaluation
            chunk of ``rollout_fragment_length`` steps too); an env still stepping then is
            named in a ``SampleTimeoutError``. ``None`` waits forever. The default is RLlib's:
            a hung env stops the fit within a minute, while a rollout of any simulated env
            short of one that takes over 0.3 s per step (at 200 steps) fits in it.
        restart_failed_sub_environments: Rebuild an env that raises (or an async worker
            that exits), drop its unfinished episode and keep training; the restarts are
            logged as ``env_runners/num_env_restarts``. Without it the fit stops with a
            ``SubEnvError`` naming the env and the step.
        on_nonfinite: A NaN or infinite observation or reward: ``"raise"`` a
            ``NonFiniteEnvError`` naming the env, the step and the value, or
            ``"drop_episode"``: drop that episode, reset the env, and count it in
            ``env_runners/num_nonfinite_env_steps``.
        evaluation_video: Record the first episode of every ``evaluation_video``-th evaluation
            (rank 0's first evaluation env, ``render_mode="rgb_array"``) and write it to the
            Trainer's TensorBoard as ``eval/episode_video``, at the env-step count; ``None``
            records none. Needs a ``TensorBoardLogger`` and ``pip install 'lightning-rl[video]'``,
            checked at setup. Only the recorded episode renders frames.
        normalize_observations: Act on and train with observations normalized by their
            running mean and std over all envs and all ranks (merged after every rollout),
            clipped to ``[-normalization_clip, normalization_clip]``, as Stable-Baselines3's
            ``VecNormalize``. Evaluation uses the statistics as they stand and never updates
            them; checkpoints save them (``observation_normalization`` in this module's state),
            and ``Policy`` and export apply them. Box observations only.
        normalize_rewards: Train with rewards divided by the running std of the discounted
            return (``normalization_gamma``), clipped alike. Episode returns
            (``env_runners/episode_return_mean``, ``eval/...``) stay in the env's units.
        normalization_clip: The bound on normalized observations and rewards.
        normalization_gamma: The discount of the running return whose std scales the
            rewards; set it to the Learner's ``gamma``.

    Raises:
        ValueError: Naming the argument, for an unknown env id or factory path, invalid sizes,
            a negative seed, or invalid normalization settings; with ``vectorize_mode="envpool"``,
            for what EnvPool cannot build (named with what it supports).
        ImportError: For ``vectorize_mode="envpool"`` without envpool installed.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env] = "CartPole-v1",
        *,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[WrapperSpec] | None = None,
        evaluation_wrappers: Sequence[WrapperSpec] | None = None,
        num_envs: int = 1,
        vectorize_mode: Literal["sync", "async", "envpool"] = "sync",
        seed: int | None = None,
        rollouts_per_epoch: int = 10,
        max_env_steps: int | None = None,
        evaluation_num_episodes: int = 10,
        evaluation_num_envs: int | None = None,
        evaluation_explore: bool = False,
        episode_stats_window: int = 100,
        module_id: str = DEFAULT_MODULE_ID,
        sample_timeout_s: float | None = 60.0,
        restart_failed_sub_environments: bool = False,
        on_nonfinite: Literal["raise", "drop_episode"] = "raise",
        evaluation_video: int | None = None,
        normalize_observations: bool = False,
        normalize_rewards: bool = False,
        normalization_clip: float = 10.0,
        normalization_gamma: float = 0.99,
    ) -> None:
        super().__init__(
            seed=seed, evaluation_num_episodes=evaluation_num_episodes, evaluation_num_envs=evaluation_num_envs
        )
        # The settings of this rank's runners, checked here once. The training runner's
        # rollout length is the subclass's (``train_batch_size``, known after its checks);
        # the evaluation runner differs only in its wrappers and in recording videos.
        self.env_settings = EnvSettings(
            env=env,
            env_kwargs=env_kwargs,
            wrappers=list(wrappers or []),
            num_envs=num_envs,
            vectorize_mode=vectorize_mode,
            seed=seed,
            episode_stats_window=episode_stats_window,
            sample_timeout_s=sample_timeout_s,
            restart_failed_sub_environments=restart_failed_sub_environments,
            on_nonfinite=on_nonfinite,
            normalize_observations=normalize_observations,
            normalize_rewards=normalize_rewards,
            normalization_clip=normalization_clip,
            normalization_gamma=normalization_gamma,
        )
        self.evaluation_settings = self.env_settings.replace(
            wrappers=self.env_settings.wrappers if evaluation_wrappers is None else list(evaluation_wrappers),
            record_video=evaluation_video is not None,
        )
        for name, value in (("rollouts_per_epoch", rollouts_per_epoch), ("max_env_steps", max_env_steps)):
            check_int(name, value, optional=name == "max_env_steps")
        check_int("evaluation_video", evaluation_video, optional=True)
        # Callables (env factories, wrapper functions) are not plain data: keep them out of
        # the hyperparameters that go into checkpoints. The subclass's arguments are saved too.
        callables = (("env", env), ("wrappers", wrappers), ("evaluation_wrappers", evaluation_wrappers))
        self.save_hyperparameters(ignore=[name for name, value in callables if _has_callable(value)])
        # The checkpoint whose state this data module holds, so it is read once (see
        # ``_restore_state_saved_by_episode_datamodule``).
        self._restored_from: Any = None
        self._evaluation_video = EvaluationVideo(evaluation_video) if evaluation_video is not None else None

    @functools.cached_property
    def sampling(self) -> EnvSampling:
        """This rank's runners and counters (built on first use, after ``__init__`` checked every argument)."""
        return EnvSampling(
            self.env_settings.replace(rollout_fragment_length=self.env_steps_per_rollout // self.hparams.num_envs),
            self.evaluation_settings,
            evaluation_num_envs=self.hparams.evaluation_num_envs,
            evaluation_explore=self.hparams.evaluation_explore,
            ranks=self,
        )

    @property
    def env(self) -> str | Callable[[], gym.Env]:
        """The env the runners are built from, as given."""
        return self.env_settings.env

    # ------------------------------------------------------------------------------------
    # What a subclass defines
    # ------------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def train_batch_size(self) -> int:
        """Env steps per train item on one rank (a multiple of ``num_envs``)."""

    @abc.abstractmethod
    def sample_train_item(self) -> TrainItem:
        """Sample one rollout with the current weights on this rank; return the train item.

        Called by the train iterable each time Lightning asks for an item. On several ranks
        this is a collective call (``self.sampling.sample`` gathers the ranks' statistics):
        every rank must call it the same number of times.
        """

    # ------------------------------------------------------------------------------------
    # Spaces, sizes and runners (the Learner reads the spaces at setup, through ``data_offer``)
    # ------------------------------------------------------------------------------------

    @property
    def observation_space(self) -> gym.Space:
        """The single-env observation space (a Dict stays a Dict; its episodes hold the flat layout)."""
        return self.sampling.train_runner.observation_space

    @property
    def action_space(self) -> gym.Space:
        """The single-env action space."""
        return self.sampling.train_runner.action_space

    @property
    def env_steps_per_rollout(self) -> int:
        """Env steps per train item on one rank: ``train_batch_size``."""
        return self.train_batch_size

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled for training so far, summed over all ranks, resumed runs included.

        Every rank holds the same number: the sum as of the last rollout.
        """
        return self.sampling.num_env_steps_sampled_lifetime

    @property
    def train_runner(self) -> EnvRunner:
        """This rank's training ``EnvRunner`` (built on first use)."""
        return self.sampling.train_runner

    @property
    def eval_runner(self) -> EnvRunner:
        """This rank's evaluation ``EnvRunner`` (built on first use; its own envs and seeds)."""
        return self.sampling.eval_runner

    @contextlib.contextmanager
    def acting_module(self) -> Iterator[RLModule]:
        """The Learner's module that acts in the environment, for the length of the block.

        Through ``Learner.module_for_acting``: with sharded modules (FSDP2) their whole
        weights are gathered for the block, a collective call that every rank makes here at
        the same point (once per rollout and per evaluation).

        Raises:
            ValueError: If the Learner is not built or has no module ``module_id``.
        """
        with learner_acting_module(self.trainer, self.hparams.module_id) as module:
            yield module

    def sample_eval_item(self) -> TrainItem:
        """Play this rank's share of the evaluation episodes with the current weights.

        With ``evaluation_video``, every k-th evaluation also records its first episode and
        writes it to TensorBoard (rank 0).
        """
        video = self._evaluation_video
        record = video is not None and video.records_this_evaluation(self.trainer)
        with self.acting_module() as module:
            episodes = self.sampling.evaluate(module, record_video=record)
        # The env steps trained on so far: the step at which the evaluation is logged.
        env_steps = self.num_env_steps_sampled_lifetime
        if record:
            frames, fps = self.sampling.take_evaluation_video()
            if frames is not None:  # None only if env 0 was rebuilt before its first frame
                video.log(self.trainer, frames, fps=fps, env_steps=env_steps)
        return TrainItem(TrainingData(episodes=episodes), timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps})

    # ------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        """Rebuild runners made before the Trainer said which rank this is (they would share rank 0's seeds).

        That happens when a script reads ``observation_space`` before ``fit`` on every rank.
        The counters and statistics carry over. With ``evaluation_video``, check that a
        video can be recorded and written (``EvaluationVideo.check_setup``).
        """
        self.sampling.close_runners_built_elsewhere()
        if self._evaluation_video is not None and stage in ("fit", "validate"):
            settings = self.evaluation_settings
            self._evaluation_video.check_setup(
                self.trainer, lambda: check_records_frames(settings.env, settings.env_kwargs, settings.wrappers)
            )

    def train_dataloader(self) -> Iterable[TrainItem]:
        """One epoch of train items, each sampled when Lightning asks for it (a sized iterable: no prefetch)."""
        self._restore_state_saved_by_episode_datamodule()
        return super().train_dataloader()

    def teardown(self, stage: str) -> None:
        """Close the environments (they are rebuilt, with the counters kept, if the data module is used again)."""
        self.sampling.close()

    def state_dict(self) -> dict[str, Any]:
        """The sampling counters, episode statistics and normalization statistics, saved in Lightning checkpoints.

        Returns:
            ``{"train_runner": this rank's EnvRunner state, "rank": this rank,
            "num_env_steps_sampled_lifetime": sum over ranks, "num_episodes_lifetime": sum
            over ranks, "observation_normalization": {"count", "mean", "var", "clip",
            "epsilon"} or None, "reward_normalization": the same and "gamma", or None}``, and
            with ``evaluation_video`` the number of evaluations run. Lightning writes rank 0's
            into a checkpoint; all but the runner state are the same on every rank.
        """
        state = self.sampling.state_dict()
        if self._evaluation_video is not None:
            state[EVALUATION_VIDEO_KEY] = self._evaluation_video.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: a resumed run continues the counters and statistics, on any number of ranks.

        See ``EnvSampling.load_state_dict`` for what each rank restores.
        """
        self.sampling.load_state_dict(state_dict)
        if self._evaluation_video is not None:
            self._evaluation_video.load_state_dict(state_dict.get(EVALUATION_VIDEO_KEY, {}))
        self._restored_from = getattr(self.trainer, "ckpt_path", None)

    # ------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------

    def _restore_state_saved_by_episode_datamodule(self) -> None:
        """Resume from a checkpoint that ``EpisodeDataModule`` wrote before it became two classes.

        Lightning restores a data module's state from the checkpoint entry named after its
        class, so an ``OffPolicyDataModule`` (or ``OnPolicyDataModule``) fitting from such a
        checkpoint finds none. The state format is the same: read the old entry here, once
        per checkpoint, after Lightning's restore and before the first rollout is counted.
        Sharded checkpoints (a directory) are left to Lightning.
        """
        path = getattr(self.trainer, "ckpt_path", None)
        if path is None or path == self._restored_from:
            return
        self._restored_from = path
        if get_filesystem(path).isdir(str(path)):
            return
        checkpoint = self.trainer.strategy.checkpoint_io.load_checkpoint(path, map_location="cpu", weights_only=True)
        if FORMER_STATE_KEY in checkpoint:
            self.load_state_dict(checkpoint[FORMER_STATE_KEY])

    # ------------------------------------------------------------------------------------
    # The data contract (``lightning_rl.core.data_contract``: this class is a ``DataSource``)
    # ------------------------------------------------------------------------------------

    def _offered_spaces(self) -> SpacePair:
        """The env's ``(observation_space, action_space)``, for every module without spaces (builds the train envs)."""
        return self.observation_space, self.action_space


def refuse_arguments_of(other_class: str, own_arguments: Sequence[str], given: Mapping[str, Any]) -> None:
    """Raise if ``given`` holds arguments that belong to ``other_class``, naming it.

    Args:
        other_class: ``"OnPolicyDataModule"``, ``"OffPolicyDataModule"`` or ``"AsyncSamplingDataModule"``.
        own_arguments: That class's own constructor arguments.
        given: The keyword arguments a data module was called with.

    Raises:
        ValueError: ``"replay_buffer_capacity is an OffPolicyDataModule argument: use
            lightning_rl.data.OffPolicyDataModule"``.
    """
    misplaced = [name for name in given if name in own_arguments]
    if misplaced:
        names = ", ".join(misplaced)
        kind = f"is an {other_class} argument" if len(misplaced) == 1 else f"are {other_class} arguments"
        raise ValueError(f"{names} {kind}: use lightning_rl.data.{other_class}")


def _has_callable(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_callable(item) for item in value)
    return callable(value) and not isinstance(value, str)
