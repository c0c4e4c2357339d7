"""EnvRunner: steps a gymnasium vector env with an RLModule and returns episodes.

The runner keeps its envs between calls: an episode still running when ``sample()`` returns
continues in the next call, as a new chunk with the same ``id_``, so the chunks of one
episode concatenate to the whole episode.

This module holds the runner's public API, its counters and statistics; the parts live beside
it, one idea each:

- :mod:`lightning_rl.env.env_factory`: the vector env, built from an env id or callable and
  wrapper specs (``AutoresetMode.SAME_STEP``; array spaces, and Dict or Tuple observations,
  which are stored flattened, see :mod:`lightning_rl.core.observation_layout`).
- :mod:`lightning_rl.env.rollout`: the step loop (policy actions, vector env steps).
- :mod:`lightning_rl.env.rollout_buffers`: the per-call ``[T, num_envs, ...]`` buffers, the
  episodes cut out of them, and what carries over between calls.
- :mod:`lightning_rl.env.vector_infos`: gymnasium's batched infos split per env.
- :mod:`lightning_rl.env.guarded_vector_env`, :mod:`lightning_rl.env.sub_env_guard`,
  :mod:`lightning_rl.env.nonfinite`: env faults (hangs, errors, dead workers, NaN values)
  turned into errors that name the env and the step, or into restarts and dropped episodes.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.acting import Acting
from lightning_rl.core.arguments import check_int
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.closes_once import ClosesOnce
from lightning_rl.env.env_factory import (
    EnvCreator,
    VectorizeMode,
    WrapperSpec,
    check_autoreset_support,
    make_vector_env,
    resolve_wrappers,
)
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.episode_quota import EpisodeQuota
from lightning_rl.env.frame_recorder import EpisodeFrameRecorder, env_kwargs_for_video
from lightning_rl.env.guarded_vector_env import GuardedVectorEnv
from lightning_rl.env.nonfinite import NonFiniteCheck, OnNonFinite
from lightning_rl.env.normalization import EnvNormalization
from lightning_rl.env.rollout import run_rollout
from lightning_rl.env.rollout_buffers import EpisodeStat, RunningEpisodes, cut_episodes

_STATE_KEYS = frozenset(
    {"num_env_steps_sampled_lifetime", "num_episodes_lifetime", "num_resets", "episode_returns", "episode_lens"}
)


class EnvRunner(ClosesOnce):
    """Samples episodes from ``num_envs`` copies of a gymnasium env with an RLModule.

    Dict and Tuple observation spaces (of Box, Discrete, MultiDiscrete and MultiBinary parts)
    are stored flattened: every observation the module acts on and every episode holds is
    ``gym.spaces.flatten(observation_space, obs)``, one row of :attr:`stored_observation_space`,
    while :attr:`observation_space`, which modules are built from, stays the Dict (see
    :mod:`lightning_rl.core.observation_layout`). PettingZoo's action-mask Dict is stored so too,
    the mask beside the observation; the module acts on the two apart (the ``obs`` and
    ``action_mask`` columns), so its actions are legal.

    Args:
        env: A registered env id (built with ``gym.make(env, **env_kwargs)``; ``"module:Id"``
            imports ``module`` first), the import path of an env factory
            (``"package.module.make_env"``; the rule is ``env_factory.resolve_env``'s), or a
            callable returning a ``gym.Env`` (a factory is called with ``**env_kwargs`` when
            given, else with no arguments).
        env_kwargs: Keyword arguments for the env.
        wrappers: Applied in order to each env copy: wrapper classes or callables
            ``env -> env``, import paths of ``gym.Wrapper`` subclasses such as
            ``"gymnasium.wrappers.NormalizeObservation"``, or, for wrappers that take
            arguments, ``{"class_path": "gymnasium.wrappers.ClipReward", "init_args":
            {"min_reward": -1, "max_reward": 1}}`` (the form config files use).
        num_envs: How many env copies step together.
        vectorize_mode: ``"sync"`` steps the copies one after the other in this process
            (best for fast envs); ``"async"`` steps each in its own subprocess; ``"envpool"``
            steps them in EnvPool's C++ threads (``pip install "lightning-rl[envpool]"``;
            ``env`` must be an id EnvPool has, with its EnvPool options as ``env_kwargs``, no
            wrappers, ``record_video`` or ``restart_failed_sub_environments``; see
            :mod:`lightning_rl.env.envpool_vector_env` for what else differs).
        rollout_fragment_length: Vector steps per :meth:`sample` call; each yields
            ``num_envs`` env steps.
        seed: Seed of the first reset (env ``i`` gets ``seed + i``); later full resets (from
            :meth:`sample_episodes` or after :meth:`set_state`) use fresh seeds derived from
            it. ``None`` leaves the envs randomly seeded.
        episode_stats_window: How many of the latest completed episodes the return and
            length statistics of :meth:`get_metrics` cover.
        sample_timeout_s: The most seconds one rollout may take (a :meth:`sample` call, or
            each ``rollout_fragment_length`` steps of :meth:`sample_episodes`, resets
            included); an env that has not returned by then is named in a
            ``SampleTimeoutError``. ``None`` waits forever.
        restart_failed_sub_environments: When an env copy raises (or returns an
            observation of the wrong shape), rebuild it, drop its unfinished episode and
            go on; when an async worker process exits, rebuild every worker and drop every
            unfinished episode. Counted in :meth:`get_metrics`'s ``num_env_restarts``.
            Without it, such a failure raises a ``SubEnvError`` naming the env and step.
        on_nonfinite: What a NaN or infinite observation or reward does: ``"raise"`` a
            ``NonFiniteEnvError`` naming the env, the step and the value, or
            ``"drop_episode"``: drop that episode, reset that env, and count the step in
            ``num_nonfinite_env_steps``.
        record_video: Make the envs with ``render_mode="rgb_array"`` (an env id; a callable
            must set it itself) and wrap each in an ``EpisodeFrameRecorder``, after
            ``wrappers``, so that ``sample_episodes(..., record_first_episode=True)`` can
            record a video. Only the recorded episode renders frames.
        normalize_observations: Store (and act on) observations normalized by their running
            mean and std over all envs, clipped to ``[-normalization_clip,
            normalization_clip]``; the statistics are :attr:`normalization`'s (see
            :mod:`lightning_rl.env.normalization`). Box observations only: Dict and Tuple
            observations are refused (their one-hot and image parts would lose the meaning
            the module relies on).
        normalize_rewards: Store rewards divided by the running std of each env's discounted
            return (``normalization_gamma``), clipped alike; episode returns in
            :meth:`get_metrics` stay in the env's units.
        normalization_clip: The bound on normalized observations and rewards.
        normalization_gamma: The discount of the return whose std scales the rewards.

    The keywords are the fields of :class:`~lightning_rl.env.env_settings.EnvSettings`, which
    checks them; :meth:`from_settings` builds a runner from such an object.

    Raises:
        ValueError: Naming the argument, for an unknown env id, an ``env`` that is neither a
            string nor a callable, a wrapper path that is not
            a ``gym.Wrapper``, ``num_envs`` or ``rollout_fragment_length`` or
            ``episode_stats_window`` below 1, an unknown ``vectorize_mode`` or
            ``on_nonfinite``, a ``sample_timeout_s`` that is not a positive number, an env
            whose action space is not an array space (Box, Discrete, MultiDiscrete,
            MultiBinary) or whose observation space is neither one nor a Dict or Tuple of
            them, observations to normalize that
            are not a Box, or
            invalid normalization arguments; with ``vectorize_mode="envpool"``, for what EnvPool
            cannot build (an id it lacks, a callable, wrappers, other ``env_kwargs``,
            ``record_video``, ``restart_failed_sub_environments``, Dict observations).
        TypeError: If a wrapper is neither a string nor a callable.
        ImportError: For ``vectorize_mode="envpool"`` without envpool installed.
        RuntimeError: If the installed gymnasium is older than 1.1 (no SAME_STEP autoreset).
    """

    def __init__(
        self,
        env: str | EnvCreator,
        *,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[WrapperSpec] | None = None,
        num_envs: int = 1,
        vectorize_mode: VectorizeMode = "sync",
        rollout_fragment_length: int = 200,
        seed: int | None = None,
        episode_stats_window: int = 100,
        sample_timeout_s: float | None = 60.0,
        restart_failed_sub_environments: bool = False,
        on_nonfinite: OnNonFinite = "raise",
        record_video: bool = False,
        normalize_observations: bool = False,
        normalize_rewards: bool = False,
        normalization_clip: float = 10.0,
        normalization_gamma: float = 0.99,
    ) -> None:
        # The keywords are EnvSettings' fields, in its order: they are checked there, once.
        self._build(EnvSettings(**{name: value for name, value in locals().items() if name != "self"}))

    @classmethod
    def from_settings(cls, settings: EnvSettings) -> EnvRunner:
        """A runner built from settings already checked (what the data modules hand over).

        Args:
            settings: The runner's settings; see the constructor for what each one does.
        """
        runner = cls.__new__(cls)
        runner._build(settings)
        return runner

    def _build(self, settings: EnvSettings) -> None:
        check_autoreset_support()
        #: The settings this runner was built from.
        self.settings = settings
        self.num_envs = settings.num_envs
        self.vectorize_mode = settings.vectorize_mode
        self.rollout_fragment_length = settings.rollout_fragment_length
        self.seed = None if settings.seed is None else int(settings.seed)
        self.episode_stats_window = settings.episode_stats_window
        self.record_video = settings.record_video

        env = settings.env_creator
        env_kwargs, wrappers = dict(settings.env_kwargs or {}), resolve_wrappers(settings.wrappers or ())
        if self.record_video:
            env_kwargs, wrappers = env_kwargs_for_video(env, env_kwargs), [*wrappers, EpisodeFrameRecorder]
        restart = settings.restart_failed_sub_environments
        build = functools.partial(
            make_vector_env,
            env,
            env_kwargs,
            wrappers,
            self.num_envs,
            self.vectorize_mode,
            restart_failed_sub_environments=restart,
            # EnvPool seeds its envs when the pool is made: with the first reset's seed, that
            # reset needs no second pool.
            seed=self.seed if self.vectorize_mode == "envpool" else None,
        )
        timeout = None if settings.sample_timeout_s is None else float(settings.sample_timeout_s)
        self._vector = GuardedVectorEnv(build, sample_timeout_s=timeout, restart=restart)
        #: The env's own observation space (a Dict stays a Dict: modules are built from it).
        self.observation_space: gym.Space = self.env.single_observation_space
        #: The space of the observations in the episodes: ``observation_space`` itself, or for a
        #: Dict or Tuple a flat Box (see ``core.observation_layout``), each row ``gym.spaces.flatten``'s.
        self.stored_observation_space: gym.Space = self._vector.layout.stored_space
        self.action_space: gym.Space = self.env.single_action_space
        self._nonfinite = NonFiniteCheck(settings.on_nonfinite, self.stored_observation_space)
        #: The observation and reward statistics (``None`` when neither is normalized).
        self.normalization = self._make_normalization(settings)

        # The envs' progress between calls.
        self._needs_reset = True
        self._episodes = RunningEpisodes(self.num_envs)
        # How the module acts, one row per env (with a recurrent module's state): rebuilt for
        # another module object, restarted by every full reset.
        self._acting: Acting | None = None

        # Statistics: lifetime counters, the window, and what accrued since get_metrics.
        self._num_resets = 0
        self._num_env_steps_lifetime = 0
        self._num_episodes_lifetime = 0
        self._returns: deque[float] = deque(maxlen=self.episode_stats_window)
        self._lens: deque[int] = deque(maxlen=self.episode_stats_window)
        self._num_env_steps_since = 0
        self._num_episodes_since = 0
        self._sample_seconds_since = 0.0

    def _make_normalization(self, settings: EnvSettings) -> EnvNormalization | None:
        if not settings.normalizes:
            return None
        try:
            return EnvNormalization(
                self.observation_space, self.num_envs, normalize_observations=settings.normalize_observations,
                normalize_rewards=settings.normalize_rewards, clip=settings.normalization_clip,
                gamma=settings.normalization_gamma,
            )  # fmt: skip
        except ValueError:  # observations that cannot be normalized: the envs are built already
            self.close()
            raise

    # ------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------

    def sample(self, module: RLModule, *, explore: bool = True) -> list[SingleAgentEpisode]:
        """Step every env ``rollout_fragment_length`` times with ``module``.

        Args:
            module: The policy. Its ``forward_exploration`` (``forward_inference`` when not
                exploring) runs on the module's device under ``torch.inference_mode``; if
                its output has ``actions`` they are used as they are, otherwise actions come
                from its action distribution over ``action_dist_inputs``.
            explore: Sample actions (``forward_exploration``) rather than take the most
                likely ones (``forward_inference``, ``deterministic_sample``).

        Returns:
            The episodes that ended during this call, in the order they ended (each the
            part of the episode sampled in this call), then one chunk per env of the
            episode still running, which continues in the next call under the same
            ``id_``. Numpy episodes; ``extra_model_outputs`` holds ``action_logp`` (when a
            distribution was sampled), ``action_dist_inputs`` and every other tensor output
            with a leading batch dimension, such as ``vf_preds``; for a stateful (recurrent)
            module also ``state_in`` (the packed state each step started from),
            ``prev_actions`` and ``prev_rewards`` (see :class:`~lightning_rl.core.acting.Acting`).
            A recurrent state carries over between calls with its episode, and starts afresh
            with every episode (autoresets, dropped episodes and full resets included). With
            normalization on, observations and rewards are the normalized ones (so are
            ``prev_rewards``), and the call's observations and returns were added to
            :attr:`normalization`'s statistics.

        Raises:
            ValueError: For outputs without ``actions`` or ``action_dist_inputs``.
            EnvFaultError: Naming the env and the step: ``SampleTimeoutError`` after
                ``sample_timeout_s``, ``SubEnvError`` for an env that failed (without
                ``restart_failed_sub_environments``), ``NonFiniteEnvError`` for a NaN or
                infinite value (with ``on_nonfinite="raise"``). Async workers are
                terminated on any error; the next call builds them afresh.
        """
        start = time.perf_counter()
        try:
            with self._vector.rollout():
                if self._needs_reset:
                    self._reset(training=True)
                completed, running, stats = self._run(
                    module, self.rollout_fragment_length, explore=explore, training=True
                )
        except BaseException:
            self._after_failure()
            raise
        steps = sum(len(episode) for episode in completed) + sum(len(episode) for episode in running)
        self._num_env_steps_lifetime += steps
        self._num_env_steps_since += steps
        self._num_episodes_lifetime += len(stats)
        self._num_episodes_since += len(stats)
        for episode_return, episode_len in stats:
            self._returns.append(episode_return)
            self._lens.append(episode_len)
        self._sample_seconds_since += time.perf_counter() - start
        return completed + running

    def sample_episodes(
        self, module: RLModule, num_episodes: int, *, explore: bool = False, record_first_episode: bool = False
    ) -> list[SingleAgentEpisode]:
        """Reset the envs and run until ``num_episodes`` complete episodes are collected.

        For evaluation: episodes start fresh (the envs are reset at the start of the call
        with a new seed), the training counters and statistics stay as they are, and the
        next :meth:`sample` starts from fresh episodes too. An episode a training
        :meth:`sample` left running is abandoned, so evaluate with a runner of its own to
        keep training episodes whole (a recurrent module's state starts afresh with this call's
        reset, and again with the next :meth:`sample`'s). The call returns only when enough episodes ended, so
        the env needs a time limit if the policy may never end an episode. With
        normalization on, observations are normalized with :attr:`normalization`'s statistics
        as they stand (never updated here) and rewards are the env's own.

        Args:
            module: The policy, used as in :meth:`sample`.
            num_episodes: How many complete episodes to return.
            explore: As in :meth:`sample`; greedy by default.
            record_first_episode: Record the rgb frames of env 0's first episode (the runner
                must be built with ``record_video=True``); the call goes on until that episode
                ended, even past ``num_episodes``. :meth:`take_recorded_frames` returns them.

        Returns:
            ``num_episodes`` whole episodes (``t_started == 0``), in the order they ended: the
            first ``num_episodes`` to start, each played to its end, whatever ``num_envs`` is, so
            long episodes count as much as short ones (the mean return is the one sequential
            play gives). Episodes an env starts beyond those are thrown away; a dropped episode
            (a NaN value with ``on_nonfinite="drop"``, a rebuilt env) is replaced by another.

        Raises:
            ValueError: If ``num_episodes < 1``, for ``record_first_episode`` without
                ``record_video``, or as :meth:`sample`.
        """
        check_int("num_episodes", num_episodes)
        if record_first_episode and not self.record_video:
            raise ValueError("record_first_episode needs an EnvRunner built with record_video=True")
        finished: list[SingleAgentEpisode] = []
        unfinished: dict[str, SingleAgentEpisode] = {}
        quota = EpisodeQuota(num_episodes, self.num_envs)
        try:
            with self._vector.rollout():
                self._reset(training=False, record_env_0=record_first_episode)
            # The first num_episodes episodes to start are kept, each played to its end: keeping
            # the first ones to end would favour short episodes (see episode_quota).
            counted = {self._episodes.ids[index] for index in quota.envs}
            recorded_id = self._episodes.ids[0] if record_first_episode else None
            self._episodes.ended = []
            # Env 0's id changes when its recorded episode ends (or is dropped).
            while not quota.done or self._episodes.ids[0] == recorded_id:
                with self._vector.rollout():
                    completed, running, _ = self._run(
                        module,
                        self.rollout_fragment_length,
                        explore=explore,
                        training=False,
                        # No fewer episodes can end before the counted ones all have.
                        stop_after_episodes=max(quota.num_episodes - len(finished), 1),
                    )
                completed_by_id = {episode.id_: episode for episode in completed}
                for env, ended_id, next_id in self._episodes.ended:
                    if ended_id not in counted:
                        continue
                    counted.discard(ended_id)
                    episode = completed_by_id.get(ended_id)
                    if quota.end(env, kept=episode is not None):
                        counted.add(next_id)
                    earlier = unfinished.pop(ended_id, None)
                    if episode is None:
                        continue  # dropped (a NaN value, a rebuilt env): another one started in its place
                    if earlier is not None:
                        earlier.concat_episode(episode)
                        episode = earlier
                    finished.append(episode)
                self._episodes.ended.clear()
                for episode in running:
                    if episode.id_ not in counted:
                        continue
                    if episode.id_ in unfinished:
                        unfinished[episode.id_].concat_episode(episode)
                    else:
                        unfinished[episode.id_] = episode
        except BaseException:
            self._after_failure()
            raise
        finally:
            self._episodes.ended = None
            # The envs are mid-way through evaluation episodes: training restarts afresh.
            self._needs_reset = True
        return finished

    def take_recorded_frames(self) -> np.ndarray | None:
        """The frames ``sample_episodes(..., record_first_episode=True)`` recorded, and forget them.

        Returns:
            ``[T, height, width, 3]`` uint8 frames: the reset's, then one after each step;
            ``None`` when nothing was recorded since the last call.

        Raises:
            ValueError: For a runner built without ``record_video``.
        """
        if not self.record_video:
            raise ValueError("take_recorded_frames needs an EnvRunner built with record_video=True")
        return self.env.call("take_frames")[0]

    @property
    def render_fps(self) -> int | None:
        """The frames per second the env declares for its renderings (``metadata["render_fps"]``), if any."""
        fps = self.env.metadata.get("render_fps")
        return None if fps is None else int(fps)

    def _reset(self, *, training: bool, record_env_0: bool = False) -> None:
        if self._vector.env.closed:
            self._vector.rebuild()  # the workers were terminated after an error
        if record_env_0:  # arm env 0's EpisodeFrameRecorder for the episode this reset starts
            self.env.set_attr("record_next_episode", [True] + [False] * (self.num_envs - 1))
        # Each full reset gets seeds of its own, so neither evaluation nor a resumed run
        # replays the episodes of the first reset; the first reset uses `seed` itself.
        seed = None if self.seed is None else self.seed + self._num_resets * self.num_envs
        obs, infos, _ = self._vector.reset(seed=seed)
        self._num_resets += 1
        obs = np.array(obs, dtype=self.stored_observation_space.dtype)
        self._nonfinite.check_reset(obs, self._vector)
        if self.normalization is not None:
            obs = self.normalization.on_reset(obs, training=training)
        self._episodes.restart(obs, infos)
        if self._acting is not None:
            self._acting.start_episodes(None)
        self._needs_reset = False

    def _after_failure(self) -> None:
        # The envs moved on without the runner's record of it: start afresh next time. Async
        # workers may be stuck, dead or mid-call: terminate them (the next reset rebuilds
        # them), so that no worker outlives the error and keeps the interpreter from exiting.
        self._needs_reset = True
        if self._vector.is_async:
            self._vector.terminate()

    def _run(
        self,
        module: RLModule,
        num_steps: int,
        *,
        explore: bool,
        training: bool,
        stop_after_episodes: int | None = None,
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], list[EpisodeStat]]:
        """Step the vector env up to ``num_steps`` times; cut the episodes out of the buffers.

        ``training`` rollouts update the normalization statistics and normalize rewards;
        evaluation ones normalize observations with the statistics as they stand.

        Returns:
            (episodes ended in this call, chunks still running, (return, length) of each
            ended episode over all its chunks).
        """
        if self._acting is None or self._acting.module is not module:
            self._acting = Acting(module, self.num_envs)
        buffers, steps_done = run_rollout(
            self._vector,
            self._acting,
            self._episodes,
            num_steps,
            explore=explore,
            nonfinite=self._nonfinite,
            stop_after_episodes=stop_after_episodes,
            normalization=self.normalization,
            training=training,
        )
        return cut_episodes(buffers, steps_done, self._episodes)

    # ------------------------------------------------------------------------------------
    # Statistics and state
    # ------------------------------------------------------------------------------------

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps sampled by :meth:`sample` over the runner's life (restored by :meth:`set_state`)."""
        return self._num_env_steps_lifetime

    @property
    def episode_stats_window_values(self) -> tuple[np.ndarray, np.ndarray]:
        """The returns (float64) and lengths (int64) of the episodes in the statistics window.

        Copies, oldest first; empty before the first completed episode. For combining the
        windows of several runners (data-parallel ranks) into one statistic, which the
        means of :meth:`get_metrics` cannot do without the counts.
        """
        return np.asarray(self._returns, dtype=np.float64), np.asarray(self._lens, dtype=np.int64)

    def get_metrics(self) -> dict[str, float]:
        """Return sampling statistics and start a new period for the per-period ones.

        Returns:
            ``episode_return_mean``, ``episode_return_min``, ``episode_return_max``,
            ``episode_len_mean`` (over the last ``episode_stats_window`` completed
            episodes; NaN before the first), ``num_episodes`` and ``num_env_steps_sampled``
            (since the last call), ``num_episodes_lifetime``,
            ``num_env_steps_sampled_lifetime``, ``env_steps_per_sec`` (env steps over
            the time spent inside :meth:`sample` since the last call; NaN if none),
            ``num_env_restarts`` (env copies rebuilt, see
            ``restart_failed_sub_environments``) and ``num_nonfinite_env_steps`` (steps
            whose NaN or inf value dropped an episode, see ``on_nonfinite``), both since
            the runner was built (not restored by :meth:`set_state`). Evaluation episodes
            (:meth:`sample_episodes`) are not counted; dropped episodes neither.
        """
        returns = np.asarray(self._returns, dtype=np.float64)
        nan = float("nan")
        metrics = {
            "episode_return_mean": float(returns.mean()) if len(returns) else nan,
            "episode_return_min": float(returns.min()) if len(returns) else nan,
            "episode_return_max": float(returns.max()) if len(returns) else nan,
            "episode_len_mean": float(np.mean(self._lens)) if len(self._lens) else nan,
            "num_episodes": float(self._num_episodes_since),
            "num_episodes_lifetime": float(self._num_episodes_lifetime),
            "num_env_steps_sampled": float(self._num_env_steps_since),
            "num_env_steps_sampled_lifetime": float(self._num_env_steps_lifetime),
            "env_steps_per_sec": (
                self._num_env_steps_since / self._sample_seconds_since if self._sample_seconds_since > 0 else nan
            ),
            "num_env_restarts": float(self._vector.num_env_restarts),
            "num_nonfinite_env_steps": float(self._nonfinite.num_nonfinite_env_steps),
        }
        self._num_episodes_since = 0
        self._num_env_steps_since = 0
        self._sample_seconds_since = 0.0
        return metrics

    def get_state(self) -> dict[str, Any]:
        """Return the counters and the statistics window as plain Python data.

        The envs themselves are not part of the state.

        Returns:
            ``{"num_env_steps_sampled_lifetime": int, "num_episodes_lifetime": int,
            "num_resets": int, "episode_returns": [float], "episode_lens": [int]}``.
        """
        return {
            "num_env_steps_sampled_lifetime": int(self._num_env_steps_lifetime),
            "num_episodes_lifetime": int(self._num_episodes_lifetime),
            "num_resets": int(self._num_resets),
            "episode_returns": [float(value) for value in self._returns],
            "episode_lens": [int(value) for value in self._lens],
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`get_state`'s counters; the next :meth:`sample` resets the envs.

        The reset uses seeds derived from the saved reset count, so a resumed run does not
        replay the episodes it started with. Per-period counters start afresh.

        Args:
            state: What :meth:`get_state` returned.

        Raises:
            ValueError: Naming the missing or unexpected keys, or a negative counter; nothing
                changes then.
        """
        missing = sorted(_STATE_KEYS - set(state))
        unexpected = sorted(set(state) - _STATE_KEYS)
        if missing or unexpected:
            raise ValueError(f"EnvRunner state: missing keys {missing}, unexpected keys {unexpected}")
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime", "num_resets"):
            if int(state[key]) < 0:
                raise ValueError(f"EnvRunner state: {key} must be >= 0, got {state[key]!r}")
        if len(state["episode_returns"]) != len(state["episode_lens"]):
            raise ValueError(
                f"EnvRunner state: episode_returns has {len(state['episode_returns'])} entries, "
                f"episode_lens {len(state['episode_lens'])}"
            )
        self._num_env_steps_lifetime = int(state["num_env_steps_sampled_lifetime"])
        self._num_episodes_lifetime = int(state["num_episodes_lifetime"])
        self._num_resets = int(state["num_resets"])
        self._returns = deque((float(v) for v in state["episode_returns"]), maxlen=self.episode_stats_window)
        self._lens = deque((int(v) for v in state["episode_lens"]), maxlen=self.episode_stats_window)
        self._num_env_steps_since = 0
        self._num_episodes_since = 0
        self._sample_seconds_since = 0.0
        self._needs_reset = True

    # ------------------------------------------------------------------------------------
    # Lifetime
    # ------------------------------------------------------------------------------------

    @property
    def env(self) -> gym.vector.VectorEnv:
        """The gymnasium vector env (a new one after async workers were rebuilt); each copy is in a ``SubEnvGuard``."""
        return self._vector.env

    def _close_envs(self) -> None:
        self._vector.close()  # async mode: its subprocesses too

    def __repr__(self) -> str:
        return (
            f"EnvRunner(num_envs={self.num_envs}, vectorize_mode={self.vectorize_mode!r}, "
            f"rollout_fragment_length={self.rollout_fragment_length}, seed={self.seed})"
        )
