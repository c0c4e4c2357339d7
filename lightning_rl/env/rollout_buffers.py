"""The numpy buffers one EnvRunner call writes its steps into, and the episodes cut out of them.

A call writes every vector step into buffers of shape ``[T, num_envs, ...]`` (observations
``[T + 1, ...]``: the last is where the next call starts) and cuts the episodes out once at
the end. The episodes hold views of these buffers, which are fresh per call.

:class:`RunningEpisodes` is what carries over between calls: each env's current episode id,
its length and return so far, and the observation (and infos) the next call starts from. An
episode still running when a call returns continues in the next one as a new chunk with the
same ``id_``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.columns import Columns
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.vector_infos import has_env_infos, unbatch_infos, unbatch_one

# (return, length) of an ended episode over all its chunks.
EpisodeStat = tuple[float, int]


@dataclass
class RunningEpisodes:
    """Where each env's episode stands between the runner's calls.

    Args:
        num_envs: How many envs the vector env steps.
    """

    num_envs: int
    obs: np.ndarray | None = None
    infos: list[dict[str, Any]] | None = None
    # Infos are recorded from the first time the env returned keys of its own; until then
    # recording them costs nothing.
    record_infos: bool = False
    ids: list[str] = field(init=False)
    t: np.ndarray = field(init=False)
    returns: np.ndarray = field(init=False)
    # When a list: (env, ended id, new id) of every episode that ended or was dropped, in that
    # order (what an evaluation follows to know which env's next episode counts).
    ended: list[tuple[int, str, str]] | None = None

    def __post_init__(self) -> None:
        self.ids = [""] * self.num_envs
        self.t = np.zeros(self.num_envs, dtype=np.int64)
        self.returns = np.zeros(self.num_envs, dtype=np.float64)

    def restart(self, obs: np.ndarray, infos: Mapping[str, Any]) -> None:
        """Start a fresh episode in every env, from the vector env's reset ``obs`` and ``infos``."""
        self.obs = obs
        if has_env_infos(infos):
            self.record_infos = True
        self.infos = unbatch_infos(infos, self.num_envs) if self.record_infos else None
        self.ids = [uuid.uuid4().hex for _ in range(self.num_envs)]
        self.t[:] = 0
        self.returns[:] = 0.0

    def start_new(self, index: int) -> None:
        """Env ``index``'s episode ended (or was dropped): the next step starts a new one."""
        new_id = uuid.uuid4().hex
        if self.ended is not None:
            self.ended.append((index, self.ids[index], new_id))
        self.ids[index] = new_id
        self.t[index] = 0
        self.returns[index] = 0.0


@dataclass
class RolloutBuffers:
    """Everything one call sampled, step by step: ``[T, num_envs, ...]`` arrays and per-step infos.

    ``final_obs`` and ``final_infos`` hold, keyed by ``(step, env)``, the true last observation
    and infos of each episode that ended (the vector env's top-level ones are the next
    episode's reset). ``actions`` and ``extra`` are allocated at the first policy step, when
    their shapes and dtypes are known.

    ``dropped[t, i]`` marks a step after which env ``i``'s episode is thrown away (its env
    was rebuilt, or returned a NaN): the steps of that episode in this call are cut out of
    no episode, and a new episode starts at ``t + 1``. ``nonfinite_final_envs`` lists the
    envs whose episode ended in the latest step with a non-finite last observation.

    ``raw_rewards`` holds the env's own rewards when ``rewards`` holds normalized ones (see
    ``EnvNormalization``); episode returns are summed from it, so they stay in the env's units.
    """

    obs: np.ndarray
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    dropped: np.ndarray
    info_rows: list[list[dict[str, Any]]] | None
    actions: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    final_obs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    final_infos: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    nonfinite_final_envs: list[int] = field(default_factory=list)
    raw_rewards: np.ndarray | None = None

    @classmethod
    def allocate(
        cls,
        num_steps: int,
        observation_space: gym.Space,
        episodes: RunningEpisodes,
        obs_dtype: np.dtype | type | None = None,
    ) -> RolloutBuffers:
        """Empty buffers for ``num_steps`` vector steps, starting from ``episodes``' current observation.

        Observations are stored as ``obs_dtype`` (default: the space's; float32 when normalized).
        """
        num_envs = episodes.num_envs
        dtype = observation_space.dtype if obs_dtype is None else obs_dtype
        obs = np.empty((num_steps + 1, num_envs, *observation_space.shape), dtype=dtype)
        obs[0] = episodes.obs
        info_rows = [episodes.infos or [{} for _ in range(num_envs)]] if episodes.record_infos else None
        return cls(
            obs=obs,
            rewards=np.empty((num_steps, num_envs), dtype=np.float32),
            terminateds=np.empty((num_steps, num_envs), dtype=np.bool_),
            truncateds=np.empty((num_steps, num_envs), dtype=np.bool_),
            dropped=np.zeros((num_steps, num_envs), dtype=np.bool_),
            info_rows=info_rows,
        )

    def episode_step(self, t: int, index: int, episodes: RunningEpisodes) -> int:
        """The step within its episode that env ``index`` took at vector step ``t`` of this call."""
        ends = np.flatnonzero(self.terminateds[:t, index] | self.truncateds[:t, index] | self.dropped[:t, index])
        return int(t - ends[-1] - 1) if len(ends) else int(episodes.t[index]) + t

    def write_outputs(self, t: int, out: Mapping[str, Any], actions: torch.Tensor, on_cpu: bool) -> np.ndarray:
        """Store step ``t``'s actions and per-row tensor outputs; return the actions as numpy.

        Raises:
            ValueError: If ``actions`` has no leading batch dimension of ``num_envs``.
        """
        if self.actions is None:
            self._allocate_outputs(out, actions)
        if on_cpu:
            action_np = actions.numpy()
            for key, buf in self.extra.items():
                buf[t] = out[key].numpy()
        else:
            action_np = actions.cpu().numpy()
            for key, buf in self.extra.items():
                buf[t] = out[key].cpu().numpy()
        self.actions[t] = action_np
        return action_np

    def write_env_step(
        self,
        t: int,
        step: tuple[Any, Any, np.ndarray, np.ndarray, Mapping[str, Any]],
        episodes: RunningEpisodes,
        observation_dtype: np.dtype,
    ) -> int:
        """Store what the vector env's step ``t`` returned; return how many episodes ended in it.

        Turns on ``episodes.record_infos`` the first time the env returns infos of its own.
        """
        next_obs, rewards, terminateds, truncateds, infos = step
        if self.nonfinite_final_envs:
            self.nonfinite_final_envs = []
        self.obs[t + 1] = next_obs
        self.rewards[t] = rewards
        self.terminateds[t] = terminateds
        self.truncateds[t] = truncateds
        if not infos:
            if self.info_rows is not None:
                self.info_rows.append([{} for _ in range(episodes.num_envs)])
            return 0
        done_envs = np.flatnonzero(terminateds | truncateds)
        if len(done_envs):
            boundary_obs = infos["final_obs"]
            check_finite = np.issubdtype(observation_dtype, np.floating)
            for i in done_envs:
                # A copy: some envs return the same array object at every step.
                final = self.final_obs[t, i] = np.array(boundary_obs[i], dtype=observation_dtype)
                if check_finite and not np.isfinite(final).all():
                    self.nonfinite_final_envs.append(int(i))
        if self.info_rows is None and has_env_infos(infos):
            episodes.record_infos = True
            self.info_rows = [[{} for _ in range(episodes.num_envs)] for _ in range(t + 1)]
        if self.info_rows is not None:
            # For an env that just finished, the top-level keys are its reset infos (the
            # next episode's first) and final_info holds the last step's.
            self.info_rows.append(unbatch_infos(infos, episodes.num_envs))
            final_info = infos.get("final_info")
            for i in done_envs:
                self.final_infos[t, i] = unbatch_one(final_info, i) if final_info else {}
        return len(done_envs)

    def _allocate_outputs(self, out: Mapping[str, Any], actions: torch.Tensor) -> None:
        # Buffers [num_steps, num_envs, ...] for the actions and each per-row tensor output.
        num_steps, num_envs = self.rewards.shape
        self.actions = np.empty((num_steps, *actions.shape), dtype=_numpy_dtype(actions))
        self.extra = {
            key: np.empty((num_steps, *value.shape), dtype=_numpy_dtype(value))
            for key, value in out.items()
            if key != Columns.ACTIONS
            and isinstance(value, torch.Tensor)
            and value.dim() >= 1
            and value.shape[0] == num_envs
        }
        if actions.dim() < 1 or actions.shape[0] != num_envs:
            raise ValueError(
                f"actions must have a leading batch dimension of {num_envs}, got shape {tuple(actions.shape)}"
            )


def cut_episodes(
    buffers: RolloutBuffers, num_steps: int, episodes: RunningEpisodes
) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], list[EpisodeStat]]:
    """Cut the first ``num_steps`` steps of ``buffers`` into episodes and move ``episodes`` on.

    Args:
        buffers: What the call wrote.
        num_steps: How many vector steps it took.
        episodes: The episodes running when the call started; they end up as they stand
            after it (new ids for the ones that ended, lengths, returns, next observation).

    Returns:
        (episodes ended in this call, in the order they ended; the chunk of each env's
        running episode, unless it has only its reset observation so far; (return, length)
        of each ended episode over all its chunks).
    """
    completed, stats, segment_start = _cut_completed(buffers, num_steps, episodes)
    running = _cut_running(buffers, num_steps, episodes, segment_start)
    episodes.obs = buffers.obs[num_steps]
    episodes.infos = None if buffers.info_rows is None else buffers.info_rows[num_steps]
    return completed, running, stats


def _cut_completed(
    buffers: RolloutBuffers, num_steps: int, episodes: RunningEpisodes
) -> tuple[list[SingleAgentEpisode], list[EpisodeStat], list[int]]:
    completed: list[SingleAgentEpisode] = []
    stats: list[EpisodeStat] = []
    segment_start = [0] * episodes.num_envs
    info_rows = buffers.info_rows
    dropped = buffers.dropped[:num_steps]
    done = buffers.terminateds[:num_steps] | buffers.truncateds[:num_steps] | dropped
    # Row-major nonzero is sorted by step, then env: the order in which episodes ended.
    for t, i in zip(*np.nonzero(done)):
        t, i = int(t), int(i)
        start = segment_start[i]
        if dropped[t, i]:
            # A rebuilt env or a NaN: the episode's steps are not handed out, and it counts nowhere.
            episodes.start_new(i)
            segment_start[i] = t + 1
            continue
        rewards = buffers.rewards[start : t + 1, i]
        env_rewards = rewards if buffers.raw_rewards is None else buffers.raw_rewards[start : t + 1, i]
        infos = None
        if info_rows is not None:
            infos = [info_rows[k][i] for k in range(start, t + 1)] + [buffers.final_infos.get((t, i), {})]
        completed.append(
            SingleAgentEpisode(
                episodes.ids[i],
                observations=np.concatenate([buffers.obs[start : t + 1, i], buffers.final_obs[t, i][None]]),
                actions=buffers.actions[start : t + 1, i],
                rewards=rewards,
                infos=infos,
                terminated=bool(buffers.terminateds[t, i]),
                truncated=bool(buffers.truncateds[t, i]),
                extra_model_outputs={key: buf[start : t + 1, i] for key, buf in buffers.extra.items()},
                t_started=int(episodes.t[i]),
            )
        )
        stats.append(
            (float(episodes.returns[i] + env_rewards.sum(dtype=np.float64)), int(episodes.t[i]) + t + 1 - start)
        )
        episodes.start_new(i)
        segment_start[i] = t + 1
    return completed, stats, segment_start


def _cut_running(
    buffers: RolloutBuffers, num_steps: int, episodes: RunningEpisodes, segment_start: list[int]
) -> list[SingleAgentEpisode]:
    running: list[SingleAgentEpisode] = []
    info_rows = buffers.info_rows
    for i in range(episodes.num_envs):
        start = segment_start[i]
        if start == num_steps:  # the next episode has only its reset observation so far
            continue
        rewards = buffers.rewards[start:num_steps, i]
        running.append(
            SingleAgentEpisode(
                episodes.ids[i],
                observations=buffers.obs[start : num_steps + 1, i],
                actions=buffers.actions[start:num_steps, i],
                rewards=rewards,
                infos=None if info_rows is None else [info_rows[k][i] for k in range(start, num_steps + 1)],
                extra_model_outputs={key: buf[start:num_steps, i] for key, buf in buffers.extra.items()},
                t_started=int(episodes.t[i]),
            )
        )
        env_rewards = rewards if buffers.raw_rewards is None else buffers.raw_rewards[start:num_steps, i]
        episodes.t[i] += num_steps - start
        episodes.returns[i] += env_rewards.sum(dtype=np.float64)
    return running


def _numpy_dtype(tensor: torch.Tensor) -> np.dtype:
    return torch.empty((), dtype=tensor.dtype).numpy().dtype
