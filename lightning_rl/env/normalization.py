"""The env runner's normalization piece: observations by their running mean and std, rewards by the return's.

What Stable-Baselines3's ``VecNormalize`` and RLlib's ``MeanStdFilter`` do, as a part of the
:class:`~lightning_rl.env.env_runner.EnvRunner` rather than a wrapper around each env copy, so
that one set of statistics covers every sub-env (and, merged after each rollout, every
data-parallel rank) and can be saved with the run:

- Observations: every observation the policy acts on (the reset observations and each
  step's next observations; not the final observation of an ended episode, which is
  normalized but never acted on, as in ``VecNormalize``) is added to a running mean and
  variance, and stored as ``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)`` in float32.
  The statistics are updated before the step's observations are normalized.
- Rewards: each env keeps its running discounted return ``ret = ret * gamma + reward`` (reset
  when its episode ends); the returns go into a running variance and each reward is stored as
  ``clip(reward / sqrt(var + epsilon), -clip, clip)``. The env's own rewards stay beside them
  (``RolloutBuffers.raw_rewards``), so episode returns are reported in the env's units.

Evaluation (``training=False`` in the hooks) normalizes observations with the statistics as
they stand and never updates them; its rewards stay the env's own.

Samplers apart from the Learner (``AsyncSamplingDataModule``) keep their runners' statistics
alike with the data module's, RLlib's ``MeanStdFilter`` way: each sampler sends what it saw
since its last report with every rollout (:meth:`EnvNormalization.report_new_statistics`), the
data module merges the reports of every rank into its own statistics (:meth:`merge_ranks`) and
sends them back with the weights (:meth:`statistics_vector`), and the sampler takes them plus
what it saw since its last report (:meth:`load_statistics_vector`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.arguments import is_real
from lightning_rl.core.encoders import image_shape
from lightning_rl.core.normalization import OBSERVATION_NORMALIZATION_KEY, RunningMeanStd
from lightning_rl.env.rollout_buffers import RolloutBuffers

#: Where an env data module's ``state_dict`` holds the reward statistics (``None`` when off).
REWARD_NORMALIZATION_KEY = "reward_normalization"

#: Added to the variance before its square root is taken (``VecNormalize``'s value).
EPSILON = 1e-8

# Observation elements a rank keeps before folding them into its new statistics (8 MiB of float64).
_FOLD_ELEMENTS = 1 << 20


def check_saved_statistics_fit(state: Mapping[str, Any], normalize_observations: bool) -> None:
    """Refuse observation statistics saved by a run that normalized observations, for one that does not.

    Its policy was trained on normalized observations: acting on raw ones would be wrong.
    Reward statistics saved by a run that normalized rewards are simply not used by one that
    does not (rewards never reach the policy).

    Args:
        state: A saved state holding :data:`OBSERVATION_NORMALIZATION_KEY` (or not).
        normalize_observations: Whether this run normalizes observations.

    Raises:
        ValueError: Naming the setting to turn on.
    """
    if state.get(OBSERVATION_NORMALIZATION_KEY) is not None and not normalize_observations:
        raise ValueError(
            f"the saved state holds {OBSERVATION_NORMALIZATION_KEY} statistics but normalize_observations is off; "
            "the policy was trained on normalized observations: set normalize_observations=True"
        )


def check_normalization_arguments(
    normalize_observations: bool, normalize_rewards: bool, clip: float, gamma: float
) -> None:
    """Check the normalization arguments an ``EnvRunner`` (and an environment data module) takes.

    Raises:
        ValueError: Naming the argument and what it must be.
    """
    for name, value in (("normalize_observations", normalize_observations), ("normalize_rewards", normalize_rewards)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if not is_real(clip) or not math.isfinite(clip) or clip <= 0:
        raise ValueError(f"normalization_clip must be a finite number > 0, got {clip!r}")
    if not is_real(gamma) or not 0 <= gamma <= 1:
        raise ValueError(f"normalization_gamma must be a number in [0, 1], got {gamma!r}")


def _to_vector(statistics: RunningMeanStd) -> np.ndarray:
    """``[count, *mean, *var]`` (float64): the layout in which ranks and samplers exchange statistics."""
    return np.concatenate([[statistics.count], statistics.mean.ravel(), statistics.var.ravel()])


def _merge_vector(statistics: RunningMeanStd, vector: np.ndarray) -> None:
    """Merge the statistics a :func:`_to_vector` vector holds into ``statistics``."""
    size = (len(vector) - 1) // 2
    shape = statistics.shape
    statistics.merge(float(vector[0]), vector[1 : 1 + size].reshape(shape), vector[1 + size :].reshape(shape))


class _RankStatistics:
    """A ``RunningMeanStd`` kept equal over data-parallel ranks, and what this rank saw since.

    ``current`` normalizes; ``merged`` is the statistics over all ranks as of the last
    :meth:`merge_ranks`; ``new`` (with the rows not folded into it yet) holds this rank's rows
    since then. Without a merge (a runner used on its own) ``current`` is simply the
    statistics of every row seen.
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.current = RunningMeanStd(shape)
        self.merged = RunningMeanStd(shape)
        self.new = RunningMeanStd(shape)
        # Rows wait here and are folded into ``new`` a large chunk at a time: one merge per
        # chunk, rather than one more merge on every vector step of the step loop.
        self._unfolded: list[np.ndarray] = []
        self._unfolded_elements = 0

    @property
    def exchange_size(self) -> int:
        """Length of :meth:`new_rows_vector`: count, mean and variance."""
        return 1 + 2 * int(np.prod(self.shape, dtype=np.int64))

    def update(self, rows: np.ndarray) -> None:
        """Add ``rows`` (``[N, *shape]`` float64; kept until folded, so the caller must not reuse the array)."""
        count = len(rows)
        mean = np.add.reduce(rows, axis=0) / count
        deviations = rows - mean
        self.current.merge(float(count), mean, np.add.reduce(deviations * deviations, axis=0) / count)
        self._unfolded.append(rows)
        self._unfolded_elements += rows.size
        if self._unfolded_elements >= _FOLD_ELEMENTS:
            self._fold()

    def new_rows_vector(self) -> np.ndarray:
        """``[count, *mean, *var]`` of this rank's rows since the last merge (float64)."""
        self._fold()
        return _to_vector(self.new)

    def merge_ranks(self, vectors: np.ndarray) -> None:
        """Fold every rank's :meth:`new_rows_vector` (rows in rank order) into ``merged``; restart ``new``.

        Every rank merges the same numbers in the same order, so every rank ends with the same statistics.
        """
        for vector in vectors:
            _merge_vector(self.merged, vector)
        self._restart_from(self.merged)

    def report_new_rows(self) -> np.ndarray:
        """:meth:`new_rows_vector`, after which those rows count as reported: ``new`` restarts, ``current`` stays."""
        vector = self.new_rows_vector()
        self.new = RunningMeanStd(self.shape)
        return vector

    def current_vector(self) -> np.ndarray:
        """``[count, *mean, *var]`` of ``current`` (float64)."""
        return _to_vector(self.current)

    def load_vector(self, vector: np.ndarray) -> None:
        """``merged`` becomes ``vector``'s statistics (``current_vector``'s layout); ``current``, those and ``new``."""
        self.merged = RunningMeanStd(self.shape)
        _merge_vector(self.merged, vector)
        self._fold()
        self.current = RunningMeanStd(self.shape)
        for statistics in (self.merged, self.new):
            self.current.merge(statistics.count, statistics.mean, statistics.var)

    def state(self) -> dict[str, Any]:
        return self.current.state_dict()

    def load(self, state: Mapping[str, Any]) -> None:
        self.merged.load_state_dict(state)
        self._restart_from(self.merged)

    def _fold(self) -> None:
        if self._unfolded:
            self.new.update(np.concatenate(self._unfolded))
            self._unfolded, self._unfolded_elements = [], 0

    def _restart_from(self, statistics: RunningMeanStd) -> None:
        self.current = RunningMeanStd(self.shape)
        self.current.merge(statistics.count, statistics.mean, statistics.var)
        self.new = RunningMeanStd(self.shape)
        self._unfolded, self._unfolded_elements = [], 0


class EnvNormalization:
    """Normalizes an env runner's observations and rewards with running statistics.

    The runner calls :meth:`on_reset` with the observations of a reset and :meth:`on_step`
    after each vector step; :meth:`new_statistics` and :meth:`merge_ranks` keep the statistics
    equal over data-parallel ranks; :meth:`state_dict` is what checkpoints hold.

    Args:
        observation_space: The single-env observation space; a ``Box`` when normalizing
            observations.
        num_envs: The runner's env copies (each keeps its own running return).
        normalize_observations: Normalize observations by their running mean and std.
        normalize_rewards: Divide rewards by the running std of the discounted return.
        clip: Normalized observations and rewards are clipped to ``[-clip, clip]``.
        gamma: The discount of the running return (use the Learner's).

    Raises:
        ValueError: For observations to normalize that are not a ``Box``, or are an image
            (:func:`~lightning_rl.core.encoders.image_shape`), or as
            :func:`check_normalization_arguments`.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        num_envs: int,
        *,
        normalize_observations: bool,
        normalize_rewards: bool,
        clip: float = 10.0,
        gamma: float = 0.99,
    ) -> None:
        check_normalization_arguments(normalize_observations, normalize_rewards, clip, gamma)
        if normalize_observations and not isinstance(observation_space, gym.spaces.Box):
            why = ""
            if isinstance(observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
                # Normalized, the flat row's one-hot and uint8 image parts would no longer be what
                # the Dict space the module is built from says they are.
                why = (
                    "; Dict and Tuple observations are stored flattened and not normalized: normalize the parts "
                    "that need it inside the env (a gymnasium ObservationWrapper)"
                )
            raise ValueError(
                f"normalize_observations needs a Box observation space (an array of numbers); this env's is "
                f"{observation_space}{why}"
            )
        if normalize_observations and image_shape(observation_space) is not None:
            # The module's encoder reads the space, not the values: it would divide normalized
            # numbers by 255 as if they were still pixels.
            raise ValueError(
                f"normalize_observations is for vector observations; this env's {observation_space} is an image, "
                "which the module's CNN scales itself (uint8 / 255, bool as 0/1). Turn normalize_observations off."
            )
        self.clip = float(clip)
        self.gamma = float(gamma)
        self.observations = _RankStatistics(tuple(observation_space.shape)) if normalize_observations else None
        self.rewards = _RankStatistics(()) if normalize_rewards else None
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._obs_shift, self._obs_scale = self._observation_transform()

    # ------------------------------------------------------------------------------------
    # Hooks the runner calls
    # ------------------------------------------------------------------------------------

    def on_reset(self, obs: np.ndarray, *, training: bool) -> np.ndarray:
        """Called with the observations of a reset of every env (``[num_envs, ...]``); returns what to store.

        Every env starts a new episode, so every running return restarts from 0. When
        ``training``, the observations are added to the statistics first.
        """
        self._returns[:] = 0.0
        return self._observe(obs, training=training)

    def on_step(self, buffers: RolloutBuffers, t: int, *, training: bool) -> None:
        """Called after vector step ``t`` was written into ``buffers`` (and checked for NaN); normalizes it in place.

        Changes ``buffers.obs[t + 1]``, the final observations of the episodes that ended in
        step ``t``, and, when ``training`` with reward normalization, ``buffers.rewards[t]``
        (the env's own rewards go to ``buffers.raw_rewards[t]``).
        """
        if self.observations is not None:
            buffers.obs[t + 1] = self._observe(buffers.obs[t + 1], training=training)
            for index in np.flatnonzero(buffers.terminateds[t] | buffers.truncateds[t]):
                final = buffers.final_obs.get((t, int(index)))
                if final is not None:
                    buffers.final_obs[t, int(index)] = self.normalize_observations(final)
        if self.rewards is not None and training:
            self._normalize_rewards(buffers, t)

    def normalize_observations(self, obs: np.ndarray) -> np.ndarray:
        """``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)`` in float32, with the statistics as they stand.

        Computed in float32 from float32 mean and std, as ``ObservationNormalization`` (what
        ``Policy`` and export apply) computes it, so both give the same numbers.
        """
        normalized = np.asarray(obs, dtype=np.float32) - self._obs_shift
        np.divide(normalized, self._obs_scale, out=normalized)
        # min(max(x, -clip), clip), as torch's clamp; np.clip costs several times more per call.
        np.maximum(normalized, -self.clip, out=normalized)
        return np.minimum(normalized, self.clip, out=normalized)

    # ------------------------------------------------------------------------------------
    # Statistics over ranks
    # ------------------------------------------------------------------------------------

    @property
    def exchange_size(self) -> int:
        """Length of :meth:`new_statistics` (the same on every rank for the same env and settings)."""
        return sum(part.exchange_size for part in self._parts())

    def new_statistics(self) -> np.ndarray:
        """This rank's statistics since the last :meth:`merge_ranks`, as one float64 vector to all-gather."""
        vectors = [part.new_rows_vector() for part in self._parts()]
        return np.concatenate(vectors) if vectors else np.zeros(0, dtype=np.float64)

    def merge_ranks(self, gathered: np.ndarray) -> None:
        """Merge every rank's :meth:`new_statistics` (``[world_size, exchange_size]``, rank order).

        Called on every rank after each training rollout; afterwards the statistics are equal
        on every rank (the same numbers merged in the same order).
        """
        start = 0
        for part in self._parts():
            part.merge_ranks(gathered[:, start : start + part.exchange_size])
            start += part.exchange_size
        self._obs_shift, self._obs_scale = self._observation_transform()

    # ------------------------------------------------------------------------------------
    # Statistics over samplers apart from the Learner (AsyncSamplingDataModule)
    # ------------------------------------------------------------------------------------

    def report_new_statistics(self) -> np.ndarray:
        """A sampler's side: its statistics since its last report, as :meth:`new_statistics`'s vector.

        The rows are reported once: the next report holds only the rows seen after this one.
        The statistics this runner normalizes with do not change.
        """
        vectors = [part.report_new_rows() for part in self._parts()]
        return np.concatenate(vectors) if vectors else np.zeros(0, dtype=np.float64)

    def statistics_vector(self) -> np.ndarray:
        """The statistics this runner normalizes with, as one float64 vector (:attr:`exchange_size` long).

        What the data module sends its samplers with the weights (:meth:`load_statistics_vector`).
        """
        vectors = [part.current_vector() for part in self._parts()]
        return np.concatenate(vectors) if vectors else np.zeros(0, dtype=np.float64)

    def load_statistics_vector(self, vector: np.ndarray) -> None:
        """A sampler's side: normalize with ``vector``'s statistics (:meth:`statistics_vector` of the data module's)
        plus the rows this runner saw since its last :meth:`report_new_statistics`, which ``vector`` does not hold yet.

        Raises:
            ValueError: If ``vector`` is not :attr:`exchange_size` long (statistics of other settings).
        """
        vector = np.asarray(vector, dtype=np.float64)
        if vector.shape != (self.exchange_size,):
            raise ValueError(f"normalization statistics of {self.exchange_size} numbers expected, got {vector.shape}")
        start = 0
        for part in self._parts():
            part.load_vector(vector[start : start + part.exchange_size])
            start += part.exchange_size
        self._obs_shift, self._obs_scale = self._observation_transform()

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{OBSERVATION_NORMALIZATION_KEY: ..., REWARD_NORMALIZATION_KEY: ...}``; ``None`` for a part that is off.

        The observation entry is ``{"count", "mean", "var", "clip", "epsilon"}`` (mean and var
        float64 tensors), what ``ObservationNormalization.from_state`` reads; the reward entry
        has ``"gamma"`` too. Statistics only: the running returns restart with the envs.
        """
        state: dict[str, Any] = {OBSERVATION_NORMALIZATION_KEY: None, REWARD_NORMALIZATION_KEY: None}
        if self.observations is not None:
            state[OBSERVATION_NORMALIZATION_KEY] = {**self.observations.state(), "clip": self.clip, "epsilon": EPSILON}
        if self.rewards is not None:
            state[REWARD_NORMALIZATION_KEY] = {
                **self.rewards.state(), "clip": self.clip, "epsilon": EPSILON, "gamma": self.gamma,
            }  # fmt: skip
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the statistics of :meth:`state_dict`; this runner's own ``clip`` and ``gamma`` stay.

        A part missing from ``state`` (or ``None``: saved by a run without it) starts afresh;
        saved reward statistics are not used when rewards are not normalized here.

        Raises:
            ValueError: As :func:`check_saved_statistics_fit`, or for statistics of another shape.
        """
        check_saved_statistics_fit(state, self.observations is not None)
        for key, part in ((OBSERVATION_NORMALIZATION_KEY, self.observations), (REWARD_NORMALIZATION_KEY, self.rewards)):
            saved = state.get(key)
            if saved is not None and part is not None:
                part.load(saved)
        self._obs_shift, self._obs_scale = self._observation_transform()

    # ------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------

    def _parts(self) -> list[_RankStatistics]:
        return [part for part in (self.observations, self.rewards) if part is not None]

    def _observe(self, obs: np.ndarray, *, training: bool) -> np.ndarray:
        if self.observations is None:
            return obs
        if training:
            self.observations.update(np.array(obs, dtype=np.float64))
            self._obs_shift, self._obs_scale = self._observation_transform()
        return self.normalize_observations(obs)

    def _observation_transform(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sqrt(var + epsilon)) as float32, computed as ``ObservationNormalization`` does."""
        if self.observations is None:
            return np.zeros(()), np.ones(())
        current = self.observations.current
        return current.mean.astype(np.float32), np.sqrt(current.var + EPSILON).astype(np.float32)

    def _normalize_rewards(self, buffers: RolloutBuffers, t: int) -> None:
        # VecNormalize's rule: update the return statistics with this step's running returns,
        # then scale the rewards. Dropped steps (NaN values, rebuilt envs) count nowhere.
        if buffers.raw_rewards is None:
            buffers.raw_rewards = np.empty_like(buffers.rewards)
        buffers.raw_rewards[t] = buffers.rewards[t]
        raw = buffers.raw_rewards[t]
        dropped = buffers.dropped[t]
        if dropped.any():
            kept = ~dropped
            self._returns[kept] = self._returns[kept] * self.gamma + raw[kept]
            if kept.any():
                self.rewards.update(self._returns[kept])
        else:
            self._returns *= self.gamma
            self._returns += raw
            self.rewards.update(self._returns.copy())
        normalized = raw / np.float32(math.sqrt(float(self.rewards.current.var) + EPSILON))
        np.maximum(normalized, -self.clip, out=normalized)
        buffers.rewards[t] = np.minimum(normalized, self.clip, out=normalized)
        ended = buffers.terminateds[t] | buffers.truncateds[t] | dropped
        if ended.any():
            self._returns[ended] = 0.0
