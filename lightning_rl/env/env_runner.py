"""EnvRunner: steps a gymnasium vector env with an RLModule and returns episodes.

The runner keeps its envs between calls: an episode still running when ``sample()`` returns
continues in the next call, as a new chunk with the same ``id_``, so the chunks of one
episode concatenate to the whole episode.

The vector env runs in gymnasium's ``AutoresetMode.SAME_STEP``: a step that ends an
episode returns the reset observation of the next one at once, and the true final
observation in ``infos["final_obs"]``. So every vector step yields ``num_envs`` real
transitions (no policy step is spent on an ignored action, as in ``NEXT_STEP`` mode), and
the runner puts the final observation, not the reset one, at the end of each finished
episode. No stored transition crosses an episode boundary.

Each call writes every step into numpy buffers of shape ``[T, num_envs, ...]`` and cuts the
episodes out of them once at the end; the episodes hold views of these buffers, which
are fresh per call.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.checkpoint import import_class
from lightning_rl.core.columns import Columns
from lightning_rl.core.rl_module import RLModule
from lightning_rl.env.episode import SingleAgentEpisode

try:  # gymnasium >= 1.1
    from gymnasium.vector import AutoresetMode
except ImportError:  # pragma: no cover - depends on the installed gymnasium
    AutoresetMode = None  # type: ignore[assignment,misc]

EnvCreator = Callable[..., gym.Env]
WrapperSpec = str | Mapping[str, Any] | Callable[[gym.Env], gym.Env]

# Keys the vector env adds to infos itself in SAME_STEP mode; anything else came from the env.
_FINAL_KEYS = frozenset({"final_obs", "_final_obs", "final_info", "_final_info"})
_ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
_STATE_KEYS = frozenset(
    {"num_env_steps_sampled_lifetime", "num_episodes_lifetime", "num_resets", "episode_returns", "episode_lens"}
)


class EnvRunner:
    """Samples episodes from ``num_envs`` copies of a gymnasium env with an RLModule.

    Args:
        env: A registered env id (built with ``gym.make(env, **env_kwargs)``; ``"module:Id"``
            imports ``module`` first), or a callable returning a ``gym.Env`` (called with
            ``**env_kwargs`` when given, else with no arguments).
        env_kwargs: Keyword arguments for the env.
        wrappers: Applied in order to each env copy: wrapper classes or callables
            ``env -> env``, import paths of ``gym.Wrapper`` subclasses such as
            ``"gymnasium.wrappers.NormalizeObservation"``, or, for wrappers that take
            arguments, ``{"class_path": "gymnasium.wrappers.ClipReward", "init_args":
            {"min_reward": -1, "max_reward": 1}}`` (the form config files use).
        num_envs: How many env copies step together.
        vectorize_mode: ``"sync"`` steps the copies one after the other in this process
            (best for fast envs); ``"async"`` steps each in its own subprocess.
        rollout_fragment_length: Vector steps per :meth:`sample` call; each yields
            ``num_envs`` env steps.
        seed: Seed of the first reset (env ``i`` gets ``seed + i``); later full resets (from
            :meth:`sample_episodes` or after :meth:`set_state`) use fresh seeds derived from
            it. ``None`` leaves the envs randomly seeded.
        episode_stats_window: How many of the latest completed episodes the return and
            length statistics of :meth:`get_metrics` cover.

    Raises:
        ValueError: Naming the argument, for an unknown env id, a wrapper path that is not
            a ``gym.Wrapper``, ``num_envs`` or ``rollout_fragment_length`` or
            ``episode_stats_window`` below 1, an unknown ``vectorize_mode``, or an env whose
            observation or action space is not an array space (Box, Discrete,
            MultiDiscrete, MultiBinary).
        TypeError: If ``env`` or a wrapper is neither a string nor a callable.
        RuntimeError: If the installed gymnasium is older than 1.1 (no SAME_STEP autoreset).
    """

    def __init__(
        self,
        env: str | EnvCreator,
        *,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[WrapperSpec] | None = None,
        num_envs: int = 1,
        vectorize_mode: Literal["sync", "async"] = "sync",
        rollout_fragment_length: int = 200,
        seed: int | None = None,
        episode_stats_window: int = 100,
    ) -> None:
        if AutoresetMode is None:
            raise RuntimeError(
                f"EnvRunner needs gymnasium >= 1.1 (AutoresetMode.SAME_STEP); found {gym.__version__}"
            )
        for name, value in (
            ("num_envs", num_envs),
            ("rollout_fragment_length", rollout_fragment_length),
            ("episode_stats_window", episode_stats_window),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if vectorize_mode not in ("sync", "async"):
            raise ValueError(f"vectorize_mode must be 'sync' or 'async', got {vectorize_mode!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        if isinstance(env, str):
            _check_env_id(env)
        elif not callable(env):
            raise TypeError(f"env must be a registered env id or a callable returning a gym.Env, got {env!r}")

        self.num_envs = int(num_envs)
        self.vectorize_mode = vectorize_mode
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.seed = None if seed is None else int(seed)
        self.episode_stats_window = int(episode_stats_window)

        make_one = functools.partial(_make_env, env, dict(env_kwargs or {}), _resolve_wrappers(wrappers or ()))
        vector_cls = gym.vector.SyncVectorEnv if vectorize_mode == "sync" else gym.vector.AsyncVectorEnv
        # copy=False: every observation is copied into the runner's buffers right away.
        self.env = vector_cls(
            [make_one] * self.num_envs, copy=False, autoreset_mode=AutoresetMode.SAME_STEP
        )
        self._closed = False
        self.observation_space: gym.Space = self.env.single_observation_space
        self.action_space: gym.Space = self.env.single_action_space
        for name, space in (("observation", self.observation_space), ("action", self.action_space)):
            if not isinstance(space, _ARRAY_SPACES):
                self.close()
                raise ValueError(
                    f"EnvRunner supports Box, Discrete, MultiDiscrete and MultiBinary {name} spaces; "
                    f"the env has {space}"
                )
        self._clip_low: np.ndarray | None = None
        self._clip_high: np.ndarray | None = None
        if isinstance(self.action_space, gym.spaces.Box):
            self._clip_low, self._clip_high = self.action_space.low, self.action_space.high

        # The envs' progress between calls.
        self._needs_reset = True
        self._obs: np.ndarray | None = None
        self._infos: list[dict[str, Any]] | None = None
        self._record_infos = False
        self._episode_ids: list[str] = [""] * self.num_envs
        self._episode_t = np.zeros(self.num_envs, dtype=np.int64)
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)

        # Statistics: lifetime counters, the window, and what accrued since get_metrics.
        self._num_resets = 0
        self._num_env_steps_lifetime = 0
        self._num_episodes_lifetime = 0
        self._returns: deque[float] = deque(maxlen=self.episode_stats_window)
        self._lens: deque[int] = deque(maxlen=self.episode_stats_window)
        self._num_env_steps_since = 0
        self._num_episodes_since = 0
        self._sample_seconds_since = 0.0

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
            with a leading batch dimension, such as ``vf_preds``.

        Raises:
            ValueError: For a stateful (recurrent) module, which is not supported yet, or
                outputs without ``actions`` or ``action_dist_inputs``.
        """
        start = time.perf_counter()
        if self._needs_reset:
            self._reset()
        try:
            completed, running, stats = self._run(module, self.rollout_fragment_length, explore=explore)
        except BaseException:
            # The envs moved on without the runner's record of it: start afresh next time.
            self._needs_reset = True
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
        self, module: RLModule, num_episodes: int, *, explore: bool = False
    ) -> list[SingleAgentEpisode]:
        """Reset the envs and run until ``num_episodes`` complete episodes are collected.

        For evaluation: episodes start fresh (the envs are reset at the start of the call
        with a new seed), the training counters and statistics stay as they are, and the
        next :meth:`sample` starts from fresh episodes too. An episode a training
        :meth:`sample` left running is abandoned, so evaluate with a runner of its own to
        keep training episodes whole. The call returns only when enough episodes ended, so
        the env needs a time limit if the policy may never end an episode.

        Args:
            module: The policy, used as in :meth:`sample`.
            num_episodes: How many complete episodes to return.
            explore: As in :meth:`sample`; greedy by default.

        Returns:
            The first ``num_episodes`` episodes to end, whole (``t_started == 0``), in the
            order they ended; episodes still running then are dropped.

        Raises:
            ValueError: If ``num_episodes < 1``, or as :meth:`sample`.
        """
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, (int, np.integer)) or num_episodes < 1:
            raise ValueError(f"num_episodes must be an int >= 1, got {num_episodes!r}")
        self._reset()
        finished: list[SingleAgentEpisode] = []
        unfinished: dict[str, SingleAgentEpisode] = {}
        try:
            while len(finished) < num_episodes:
                completed, running, _ = self._run(
                    module, self.rollout_fragment_length, explore=explore,
                    stop_after_episodes=num_episodes - len(finished),
                )
                for episode in completed:
                    earlier = unfinished.pop(episode.id_, None)
                    if earlier is not None:
                        earlier.concat_episode(episode)
                        episode = earlier
                    finished.append(episode)
                for episode in running:
                    if episode.id_ in unfinished:
                        unfinished[episode.id_].concat_episode(episode)
                    else:
                        unfinished[episode.id_] = episode
        finally:
            # The envs are mid-way through evaluation episodes: training restarts afresh.
            self._needs_reset = True
        return finished[:num_episodes]

    def _reset(self) -> None:
        # Each full reset gets seeds of its own, so neither evaluation nor a resumed run
        # replays the episodes of the first reset; the first reset uses `seed` itself.
        seed = None if self.seed is None else self.seed + self._num_resets * self.num_envs
        obs, infos = self.env.reset(seed=seed)
        self._num_resets += 1
        self._obs = np.array(obs, dtype=self.observation_space.dtype)
        if _has_env_infos(infos):
            self._record_infos = True
        self._infos = _unbatch_infos(infos, self.num_envs) if self._record_infos else None
        self._episode_ids = [uuid.uuid4().hex for _ in range(self.num_envs)]
        self._episode_t[:] = 0
        self._episode_return[:] = 0.0
        self._needs_reset = False

    def _run(
        self,
        module: RLModule,
        num_steps: int,
        *,
        explore: bool,
        stop_after_episodes: int | None = None,
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], list[tuple[float, int]]]:
        """Step the vector env up to ``num_steps`` times; cut the episodes out of the buffers.

        Returns:
            (episodes ended in this call, chunks still running, (return, length) of each
            ended episode over all its chunks).
        """
        if module.is_stateful():
            raise ValueError(
                f"{type(module).__name__} is stateful; EnvRunner does not carry recurrent states yet"
            )
        num_envs = self.num_envs
        space = self.observation_space
        obs_buf = np.empty((num_steps + 1, num_envs, *space.shape), dtype=space.dtype)
        rew_buf = np.empty((num_steps, num_envs), dtype=np.float32)
        term_buf = np.empty((num_steps, num_envs), dtype=np.bool_)
        trunc_buf = np.empty((num_steps, num_envs), dtype=np.bool_)
        obs_buf[0] = self._obs
        final_obs: dict[tuple[int, int], np.ndarray] = {}
        # Per-step infos exist only once the env returned keys of its own; until then this
        # path costs nothing.
        info_rows: list[list[dict[str, Any]]] | None = None
        final_infos: dict[tuple[int, int], dict[str, Any]] = {}
        if self._record_infos:
            info_rows = [self._infos or [{} for _ in range(num_envs)]]

        param = next(module.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        on_cpu = device.type == "cpu"
        forward = module.forward_exploration if explore else module.forward_inference
        dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
        clip_low, clip_high = self._clip_low, self._clip_high
        env_step = self.env.step

        act_buf: np.ndarray | None = None
        extra_bufs: dict[str, np.ndarray] = {}
        episodes_ended = 0
        steps_done = num_steps
        with torch.inference_mode():
            for t in range(num_steps):
                obs_t = torch.from_numpy(obs_buf[t])
                if not on_cpu:
                    obs_t = obs_t.to(device)
                out = forward({Columns.OBS: obs_t})
                actions = out.get(Columns.ACTIONS)
                if actions is None:
                    if Columns.ACTION_DIST_INPUTS not in out:
                        raise ValueError(
                            f"{type(module).__name__}'s forward pass returned neither "
                            f"{Columns.ACTIONS!r} nor {Columns.ACTION_DIST_INPUTS!r}; got {sorted(out)}"
                        )
                    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
                    actions = dist.sample() if explore else dist.deterministic_sample()
                    out = dict(out)
                    out[Columns.ACTION_LOGP] = dist.logp(actions)
                if act_buf is None:
                    act_buf, extra_bufs = _allocate_outputs(out, actions, num_steps, num_envs)
                if on_cpu:
                    action_np = actions.numpy()
                    for key, buf in extra_bufs.items():
                        buf[t] = out[key].numpy()
                else:
                    action_np = actions.cpu().numpy()
                    for key, buf in extra_bufs.items():
                        buf[t] = out[key].cpu().numpy()
                act_buf[t] = action_np
                if clip_low is not None:
                    action_np = np.clip(action_np, clip_low, clip_high)

                next_obs, rewards, terminateds, truncateds, infos = env_step(action_np)
                obs_buf[t + 1] = next_obs
                rew_buf[t] = rewards
                term_buf[t] = terminateds
                trunc_buf[t] = truncateds
                if infos:
                    done_envs = np.flatnonzero(terminateds | truncateds)
                    if len(done_envs):
                        boundary_obs = infos["final_obs"]
                        for i in done_envs:
                            # A copy: some envs return the same array object at every step.
                            final_obs[t, i] = np.array(boundary_obs[i], dtype=space.dtype)
                    if info_rows is None and _has_env_infos(infos):
                        self._record_infos = True
                        info_rows = [[{} for _ in range(num_envs)] for _ in range(t + 1)]
                    if info_rows is not None:
                        # For an env that just finished, the top-level keys are its reset
                        # infos (the next episode's first) and final_info holds the last step's.
                        info_rows.append(_unbatch_infos(infos, num_envs))
                        final_info = infos.get("final_info")
                        for i in done_envs:
                            final_infos[t, i] = _unbatch_one(final_info, i) if final_info else {}
                    if stop_after_episodes is not None and len(done_envs):
                        episodes_ended += len(done_envs)
                        if episodes_ended >= stop_after_episodes:
                            steps_done = t + 1
                            break
                elif info_rows is not None:
                    info_rows.append([{} for _ in range(num_envs)])
        return self._cut_episodes(
            steps_done, obs_buf, act_buf, rew_buf, term_buf, trunc_buf, extra_bufs, final_obs, info_rows, final_infos
        )

    def _cut_episodes(
        self,
        num_steps: int,
        obs_buf: np.ndarray,
        act_buf: np.ndarray,
        rew_buf: np.ndarray,
        term_buf: np.ndarray,
        trunc_buf: np.ndarray,
        extra_bufs: dict[str, np.ndarray],
        final_obs: dict[tuple[int, int], np.ndarray],
        info_rows: list[list[dict[str, Any]]] | None,
        final_infos: dict[tuple[int, int], dict[str, Any]],
    ) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode], list[tuple[float, int]]]:
        completed: list[SingleAgentEpisode] = []
        stats: list[tuple[float, int]] = []
        segment_start = [0] * self.num_envs
        done = term_buf[:num_steps] | trunc_buf[:num_steps]
        # Row-major nonzero is sorted by step, then env: the order in which episodes ended.
        for t, i in zip(*np.nonzero(done)):
            t, i = int(t), int(i)
            start = segment_start[i]
            rewards = rew_buf[start : t + 1, i]
            infos = None
            if info_rows is not None:
                infos = [info_rows[k][i] for k in range(start, t + 1)] + [final_infos.get((t, i), {})]
            completed.append(
                SingleAgentEpisode(
                    self._episode_ids[i],
                    observations=np.concatenate([obs_buf[start : t + 1, i], final_obs[t, i][None]]),
                    actions=act_buf[start : t + 1, i],
                    rewards=rewards,
                    infos=infos,
                    terminated=bool(term_buf[t, i]),
                    truncated=bool(trunc_buf[t, i]),
                    extra_model_outputs={key: buf[start : t + 1, i] for key, buf in extra_bufs.items()},
                    t_started=int(self._episode_t[i]),
                )
            )
            stats.append(
                (
                    float(self._episode_return[i] + rewards.sum(dtype=np.float64)),
                    int(self._episode_t[i]) + t + 1 - start,
                )
            )
            self._episode_ids[i] = uuid.uuid4().hex
            self._episode_t[i] = 0
            self._episode_return[i] = 0.0
            segment_start[i] = t + 1

        running: list[SingleAgentEpisode] = []
        for i in range(self.num_envs):
            start = segment_start[i]
            if start == num_steps:  # the next episode has only its reset observation so far
                continue
            rewards = rew_buf[start:num_steps, i]
            running.append(
                SingleAgentEpisode(
                    self._episode_ids[i],
                    observations=obs_buf[start : num_steps + 1, i],
                    actions=act_buf[start:num_steps, i],
                    rewards=rewards,
                    infos=None if info_rows is None else [info_rows[k][i] for k in range(start, num_steps + 1)],
                    extra_model_outputs={key: buf[start:num_steps, i] for key, buf in extra_bufs.items()},
                    t_started=int(self._episode_t[i]),
                )
            )
            self._episode_t[i] += num_steps - start
            self._episode_return[i] += rewards.sum(dtype=np.float64)
        self._obs = obs_buf[num_steps]
        self._infos = None if info_rows is None else info_rows[num_steps]
        return completed, running, stats

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
            ``num_env_steps_sampled_lifetime``, and ``env_steps_per_sec`` (env steps over
            the time spent inside :meth:`sample` since the last call; NaN if none).
            Evaluation episodes (:meth:`sample_episodes`) are not counted.
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

    def close(self) -> None:
        """Close the envs (and their subprocesses in async mode); calling it again is a no-op."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"EnvRunner(num_envs={self.num_envs}, vectorize_mode={self.vectorize_mode!r}, "
            f"rollout_fragment_length={self.rollout_fragment_length}, seed={self.seed})"
        )


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def _check_env_id(env_id: str) -> None:
    name = env_id
    if ":" in env_id:
        # gym.make's "module:EnvId" form: importing the module registers the env.
        module_name, name = env_id.split(":", 1)
        try:
            importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"Unknown env id {env_id!r}: cannot import module {module_name!r} ({error})") from error
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise ValueError(f"Unknown env id {env_id!r}: it is not in gymnasium's registry{hint}")


def _resolve_wrappers(wrappers: Sequence[WrapperSpec]) -> list[Callable[[gym.Env], gym.Env]]:
    resolved = []
    for index, wrapper in enumerate(wrappers):
        if isinstance(wrapper, Mapping):
            unknown = sorted(set(wrapper) - {"class_path", "init_args"})
            if "class_path" not in wrapper or unknown:
                raise ValueError(
                    f"wrappers[{index}]: a wrapper given as a dict needs 'class_path' and optional 'init_args', "
                    f"got keys {sorted(wrapper)}"
                )
            try:
                wrapper_class = import_class(wrapper["class_path"], gym.Wrapper)
            except ValueError as error:
                raise ValueError(f"wrappers[{index}]: {error}") from error
            wrapper = functools.partial(wrapper_class, **dict(wrapper.get("init_args") or {}))
        elif isinstance(wrapper, str):
            try:
                wrapper = import_class(wrapper, gym.Wrapper)
            except ValueError as error:
                raise ValueError(f"wrappers[{index}]: {error}") from error
        elif not callable(wrapper):
            raise TypeError(
                f"wrappers[{index}] must be an import path, a {{class_path, init_args}} dict or a callable "
                f"env -> env, got {wrapper!r}"
            )
        resolved.append(wrapper)
    return resolved


def _make_env(
    env: str | EnvCreator, env_kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]]
) -> gym.Env:
    # Module level (not a closure), so that async workers can unpickle it.
    instance = gym.make(env, **env_kwargs) if isinstance(env, str) else (env(**env_kwargs) if env_kwargs else env())
    for wrapper in wrappers:
        instance = wrapper(instance)
    if not isinstance(instance, gym.Env):
        raise TypeError(f"the env creator returned a {type(instance).__name__}, not a gym.Env")
    return instance


def _allocate_outputs(
    out: Mapping[str, Any], actions: torch.Tensor, num_steps: int, num_envs: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Buffers ``[num_steps, num_envs, ...]`` for the actions and each per-row tensor output."""
    act_buf = np.empty((num_steps, *actions.shape), dtype=_numpy_dtype(actions))
    extra_bufs = {
        key: np.empty((num_steps, *value.shape), dtype=_numpy_dtype(value))
        for key, value in out.items()
        if key != Columns.ACTIONS
        and isinstance(value, torch.Tensor)
        and value.dim() >= 1
        and value.shape[0] == num_envs
    }
    if actions.dim() < 1 or actions.shape[0] != num_envs:
        raise ValueError(f"actions must have a leading batch dimension of {num_envs}, got shape {tuple(actions.shape)}")
    return act_buf, extra_bufs


def _numpy_dtype(tensor: torch.Tensor) -> np.dtype:
    return torch.empty((), dtype=tensor.dtype).numpy().dtype


def _has_env_infos(infos: Mapping[str, Any]) -> bool:
    if any(key not in _FINAL_KEYS for key in infos):
        return True
    return bool(infos.get("final_info"))


def _unbatch_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Split gymnasium's vector infos ``{key: [N], "_key": mask}`` into one dict per env."""
    return [_unbatch_one(infos, i) for i in range(num_envs)]


def _unbatch_one(infos: Mapping[str, Any], index: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in infos.items():
        if key in _FINAL_KEYS:
            continue
        if key.startswith("_") and key[1:] in infos:
            continue  # a mask
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        result[key] = _unbatch_one(value, index) if isinstance(value, Mapping) else value[index]
    return result
