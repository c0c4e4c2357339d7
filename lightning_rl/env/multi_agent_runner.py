"""MultiAgentEnvRunner: samples multi-agent episodes from N copies of a PettingZoo env.

The runner keeps its env copies between calls: an episode still running when :meth:`sample`
returns continues in the next call, as a new chunk with the same ``id_`` (see
:meth:`MultiAgentEpisode.cut`). At every step, each agent that must act (every live agent of
a ``ParallelEnv``, the ``agent_selection`` of an ``AECEnv``) in every copy is grouped with
the others mapped to the same module, and each module runs ONE forward pass over its rows
(:mod:`lightning_rl.env.multi_agent_rollout` holds the step loop).

The env copies step in this process (``vectorize_mode="sync"``) or each in a worker process of
its own (``"async"``, :mod:`lightning_rl.env.multi_agent_worker`), where they step in parallel
and where a copy that hangs, even in C code, can be ended; the modules act in this process
either way, and the episodes are the same for the same seed.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from lightning_rl.core.arguments import check_bool, check_choice, check_int, check_num_envs, check_number, is_int
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.env.agent_acting import AgentActing
from lightning_rl.env.closes_once import ClosesOnce
from lightning_rl.env.env_errors import EnvFaultError, NonFiniteEnvError, SubEnvError
from lightning_rl.env.episode_quota import EpisodeQuota
from lightning_rl.env.guarded_vector_env import rollout_alarm
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode
from lightning_rl.env.multi_agent_rollout import EnvCopy, EpisodeRecord, check_agent_spaces, step_copies
from lightning_rl.env.multi_agent_worker import EnvWorker, SampleDeadline, start_env_workers
from lightning_rl.env.nonfinite import ON_NONFINITE_CHOICES, OnNonFinite
from lightning_rl.env.pettingzoo_env import PettingZooEnvCreator, check_pettingzoo_env_name, make_pettingzoo_env
from lightning_rl.env.pettingzoo_stepper import AgentSpaces, LocalEnv
from lightning_rl.env.policy_mapping import PolicyMappingFn, module_spaces, resolve_policy_mapping_fn

_STATE_KEYS = frozenset(
    {
        "num_env_steps_sampled_lifetime",
        "num_agent_steps_sampled_lifetime",
        "num_episodes_lifetime",
        "num_full_resets",
        "episodes",
    }
)
# Keys that states saved before they existed lack: restored as 0 when absent.
_OPTIONAL_STATE_KEYS = frozenset({"num_env_restarts_lifetime"})

MultiAgentVectorizeMode = Literal["sync", "async"]
MULTI_AGENT_VECTORIZE_MODES = ("sync", "async")


class MultiAgentEnvRunner(ClosesOnce):
    """Samples :class:`MultiAgentEpisode` s from ``num_envs`` copies of a PettingZoo env.

    Args:
        env: An import path (``"mpe2.simple_spread_v3"``, ``"pettingzoo.classic.connect_four_v3"``
            or ``"package.module.factory"``, see ``pettingzoo_env.check_pettingzoo_env_name``) or a
            callable returning a ``ParallelEnv`` or ``AECEnv``.
        env_kwargs: Keyword arguments for the env factory.
        num_envs: How many env copies step together.
        policy_mapping_fn: ``"shared"`` (every agent acts with ``DEFAULT_MODULE_ID``),
            ``"per_agent"`` (each agent with the module of its own id), or a callable
            ``(agent_id, episode) -> module_id``, called once per agent per episode.
        seed: Seed of the first reset (copy ``i`` gets ``seed + i``); an episode that ends is
            followed by an unseeded reset, which continues the copy's random state. A later full
            reset (:meth:`sample_episodes`, or after :meth:`set_state`) uses fresh seeds derived
            from ``seed``. ``None`` leaves the envs randomly seeded.
        episode_stats_window: How many of the latest completed episodes :meth:`get_metrics`'s
            means cover.
        sample_timeout_s: The most seconds one :meth:`sample` or :meth:`sample_episodes` call
            may take: a ``SampleTimeoutError`` naming the copy, the agents and the step that did
            not return; ``None`` waits forever. In ``"sync"`` mode the envs step in this process
            and an alarm interrupts them, in the main thread only, and never inside C code
            that does not return to Python (use ``"async"`` for such envs); in ``"async"`` mode
            every wait for a worker keeps to it, and a worker that did not answer is killed.
            An env that raises (or whose worker process dies) is a ``SubEnvError``, naming the
            copy, the agents and the step.
        restart_failed_sub_environments: When an env copy raises (or its worker process dies,
            or in ``"async"`` mode hangs past ``sample_timeout_s``), rebuild it (a new env from
            ``env`` and ``env_kwargs``, in a new worker in ``"async"`` mode), drop its unfinished
            episode, warn naming the copy, the agents, the step and the cause, and go on; counted
            in :meth:`get_metrics`'s ``num_env_restarts_lifetime``. After a worker is rebuilt
            (building one gets at least 60 s), the rest of the call has ``sample_timeout_s``
            again. Without it, the error is raised. In ``"sync"`` mode a hang is not restarted:
            it ends the call.
        on_nonfinite: A NaN or infinite reward or observation of a step: ``"raise"`` a
            ``NonFiniteEnvError`` naming the copy, the agent and the step, or ``"drop_episode"``:
            throw that episode away (its chunks of this call are not returned nor counted, an
            evaluation plays another in its place), warn naming it, count it in
            :attr:`num_nonfinite_env_steps`, and start a new one in that copy. A non-finite
            reset observation always raises. Checked in this process, on what the env returned.
        vectorize_mode: ``"sync"`` steps the copies one after the other in this process;
            ``"async"`` steps each in a worker process of its own, all at once (workers die with
            this process, use one torch thread, and only step their env; a callable ``env`` is
            sent to them with cloudpickle).
        check_interrupt: ``"async"`` only: called at least every 0.1 s while the runner waits
            for a worker; what it raises ends the wait and the call (the data module's raises
            Lightning's stop once the Trainer received SIGTERM).

    Raises:
        ValueError: Naming the argument, for ``num_envs`` or ``episode_stats_window`` below 1, a
            seed that is not an int, an unknown mapping name, an env path that does not resolve,
            an agent space that is not an array space (or an action-mask Dict around one), or
            agents whose spaces clash on one module, or an unknown ``vectorize_mode``.
        ImportError: If PettingZoo is not installed.
        SubEnvError: In ``"async"`` mode, naming the copy, if an env cannot be built in its worker.
    """

    def __init__(
        self,
        env: str | PettingZooEnvCreator,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        num_envs: int = 1,
        policy_mapping_fn: str | PolicyMappingFn = "shared",
        seed: int | None = None,
        episode_stats_window: int = 100,
        sample_timeout_s: float | None = 60.0,
        on_nonfinite: OnNonFinite = "raise",
        restart_failed_sub_environments: bool = False,
        vectorize_mode: MultiAgentVectorizeMode = "sync",
        check_interrupt: Callable[[], None] | None = None,
    ) -> None:
        check_num_envs("num_envs", num_envs)
        check_choice("vectorize_mode", vectorize_mode, choices=MULTI_AGENT_VECTORIZE_MODES)
        if vectorize_mode == "async" and isinstance(env, str):
            check_pettingzoo_env_name(env)  # a wrong name is a ValueError here, not a worker's error
        self.vectorize_mode = vectorize_mode
        self._env, self._env_kwargs = env, env_kwargs
        check_bool("restart_failed_sub_environments", restart_failed_sub_environments)
        self.restart_failed_sub_environments = restart_failed_sub_environments
        self.num_env_restarts = 0
        self._make_env = functools.partial(make_pettingzoo_env, env, env_kwargs)
        if on_nonfinite not in ON_NONFINITE_CHOICES:
            raise ValueError(f"on_nonfinite must be one of {list(ON_NONFINITE_CHOICES)}, got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        self.num_nonfinite_env_steps = 0
        check_number("sample_timeout_s", sample_timeout_s, low=0, low_open=True, finite=True, optional=True)
        self.sample_timeout_s = None if sample_timeout_s is None else float(sample_timeout_s)
        # The end of the current call, which every wait for a worker keeps to ("async").
        self._deadline = SampleDeadline(self.sample_timeout_s, check_interrupt)
        check_int("episode_stats_window", episode_stats_window)
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.num_envs = int(num_envs)
        self.episode_stats_window = int(episode_stats_window)
        self.seed = None if seed is None else int(seed)
        self.policy_mapping_fn = resolve_policy_mapping_fn(policy_mapping_fn)
        self._copies: list[EnvCopy] = []
        try:
            if vectorize_mode == "async":
                envs = self._new_envs(list(range(self.num_envs)))
                self._copies = [EnvCopy(env, self.policy_mapping_fn, index) for index, env in enumerate(envs)]
                self._read_spaces(envs[0].spaces)
            else:
                for index in range(self.num_envs):
                    self._copies.append(EnvCopy(LocalEnv(self._make_env), self.policy_mapping_fn, index))
                    if index == 0:
                        self._read_spaces(self._copies[0].env.spaces)  # fail before building the other copies
        except BaseException:
            self.close()
            raise

        self._needs_reset = True
        self._num_full_resets = 0
        # How the agents act (a recurrent module's state per agent per copy); rebuilt for another module object.
        self._acting: AgentActing | None = None
        self._num_env_steps_lifetime = 0
        self._num_agent_steps_lifetime = 0
        self._num_episodes_lifetime = 0
        self._episodes: deque[EpisodeRecord] = deque(maxlen=self.episode_stats_window)
        self._num_env_steps_since = 0
        self._num_agent_steps_since = 0
        self._num_episodes_since = 0
        self._sample_seconds_since = 0.0

    # ------------------------------------------------------------------------------------
    # Agents, spaces and the mapping
    # ------------------------------------------------------------------------------------

    def _read_spaces(self, spaces: AgentSpaces) -> None:
        self.possible_agents: list[AgentID] = list(spaces.possible_agents)
        self._observation_spaces = dict(spaces.observation_spaces)
        self._action_spaces = dict(spaces.action_spaces)
        for agent in self.possible_agents:
            check_agent_spaces(agent, self._observation_spaces[agent], self._action_spaces[agent])
        self.module_spaces()  # clashing spaces on one module fail here, before any sampling

    def observation_space(self, agent_id: AgentID) -> gym.Space:
        """Return the observation space of ``agent_id`` (PettingZoo's, a masked Dict included)."""
        return self._observation_spaces[agent_id]

    def action_space(self, agent_id: AgentID) -> gym.Space:
        """Return the action space of ``agent_id``."""
        return self._action_spaces[agent_id]

    def module_spaces(self) -> dict[ModuleID, tuple[gym.Space, gym.Space]]:
        """Return ``{module_id: (observation_space, action_space)}`` of the modules the mapping uses.

        Each possible agent is mapped once with a probe episode (see ``policy_mapping.module_spaces``).

        Raises:
            ValueError: If two agents mapped to one module have different spaces.
        """
        return module_spaces(self.possible_agents, self.observation_space, self.action_space, self.policy_mapping_fn)

    def set_policy_mapping_fn(self, policy_mapping_fn: str | PolicyMappingFn) -> None:
        """Use ``policy_mapping_fn`` for the episodes that start from now on (running ones keep theirs).

        Args:
            policy_mapping_fn: As the constructor's argument.
        """
        self.policy_mapping_fn = resolve_policy_mapping_fn(policy_mapping_fn)
        for copy in self._copies:
            copy.mapping_fn = self.policy_mapping_fn

    # ------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------

    def sample(self, module: RLModule, *, num_env_steps: int, explore: bool = True) -> list[MultiAgentEpisode]:
        """Step every env copy ``num_env_steps`` times (an AEC env steps once per agent turn).

        Args:
            module: A ``MultiRLModule`` holding every module the agents map to (a single
                ``RLModule`` acts as ``DEFAULT_MODULE_ID``). Each module's
                ``forward_exploration`` (``forward_inference`` when not exploring) runs once per
                step over all the agents mapped to it, under ``torch.inference_mode``.
            num_env_steps: Env steps per copy.
            explore: Sample actions rather than take the most likely ones.

        Returns:
            The episodes that ended in this call, in the order they ended (each the chunk
            sampled in this call), then the chunk of each copy's running episode, which
            continues in the next call under the same ``id_``. Numpy episodes; each acting
            step's ``extra_model_outputs`` holds ``action_logp``, ``action_dist_inputs``, the
            module's other per-row outputs, and ``action_mask`` for masked observations; a
            recurrent module's also ``state_in``, ``prev_actions`` and ``prev_rewards`` (its
            state is kept per agent per copy, carried over between calls, and starts afresh
            with each episode: see :mod:`lightning_rl.env.agent_acting`). A
            running chunk without any completed agent step is not returned yet: it goes on.
            An episode left running with a module that ``module`` no longer holds (a league
            removed it) is abandoned, and its copy starts a new one.

        Raises:
            ValueError: If ``num_env_steps < 1``, an agent maps to a
                module the given one lacks, or its forward pass returns neither ``actions`` nor
                ``action_dist_inputs``.
        """
        check_int("num_env_steps", num_env_steps)
        self._check_module(module)
        start = time.perf_counter()
        completed: list[MultiAgentEpisode] = []
        try:
            with self._timeout():
                self._step_copies(module, num_env_steps, explore, completed)
        except BaseException:
            self._needs_reset = True  # the envs moved on without the episodes' record of it
            raise
        running = []
        for copy in self._copies:
            if copy.episode.agent_steps():
                copy.add_chunk_returns()
                running.append(copy.episode)
                copy.episode = copy.episode.cut()
        episodes = [episode.to_numpy() for episode in completed + running]
        env_steps = sum(episode.env_steps() for episode in episodes)
        agent_steps = sum(episode.agent_steps() for episode in episodes)
        self._num_env_steps_lifetime += env_steps
        self._num_agent_steps_lifetime += agent_steps
        self._num_env_steps_since += env_steps
        self._num_agent_steps_since += agent_steps
        self._sample_seconds_since += time.perf_counter() - start
        return episodes

    def _step_copies(self, module: RLModule, num_env_steps: int, explore: bool, completed: list) -> None:
        if self._needs_reset:
            self._full_reset()
        self._restart_episodes_of_removed_modules(module)
        for _ in range(num_env_steps):
            dropped, failed = self._dropped(), self._failed()
            acting = self._acting_for(module)
            for index, record in step_copies(self._copies, acting, explore=explore, dropped=dropped, failed=failed):
                completed.append(self._copies[index].episode)
                self._record(record)
                self._reset_copy(index, seed=None)
            self._count_dropped(dropped)
            self._restart(failed or ())

    def _new_envs(self, indices: list[int]) -> list[LocalEnv | EnvWorker]:
        """New envs for the copies ``indices``: in this process, or in workers started together."""
        if self.vectorize_mode == "sync":
            return [LocalEnv(self._make_env) for _ in indices]
        return start_env_workers(self._env, self._env_kwargs, indices, self._deadline)

    def _dropped(self) -> list[tuple[int, NonFiniteEnvError]] | None:
        return [] if self.on_nonfinite == "drop_episode" else None

    def _failed(self) -> list[tuple[int, EnvFaultError]] | None:
        return [] if self.restart_failed_sub_environments else None

    def _reset_copy(self, index: int, seed: int | None) -> None:
        """Start a new episode in copy ``index``; a copy whose reset raises is rebuilt (if restarts are on)."""
        try:
            self._copies[index].reset(seed=seed)
        except SubEnvError as error:
            if not self.restart_failed_sub_environments:
                raise
            self._restart([(index, error)], seed=seed)

    def _restart(self, failed: Sequence[tuple[int, EnvFaultError]], seed: int | None = None) -> None:
        """Rebuild each failed copy from the env's factory and start a new episode in it.

        A rebuilt copy whose first reset fails too is not rebuilt again: that error is raised.
        """
        for index, error in failed:
            warnings.warn(f"{error}; the env copy is rebuilt (restart_failed_sub_environments)", stacklevel=3)
            copy = self._copies[index]
            copy.env.discard()  # a failed worker is killed; a failed env in this process may not close cleanly
            copy.replace_env(self._new_envs([index])[0])
            self.num_env_restarts += 1
            # A hang used up the call's time, and building a worker takes some: the rest of the call gets it afresh.
            self._deadline.renew()
            copy.reset(seed=seed)

    def _count_dropped(self, dropped: list[tuple[int, NonFiniteEnvError]] | None) -> None:
        for _, error in dropped or ():
            self.num_nonfinite_env_steps += 1
            warnings.warn(f"{error}; the episode is dropped (on_nonfinite='drop_episode')", stacklevel=3)

    def _timeout(self) -> contextlib.AbstractContextManager:
        if self.vectorize_mode == "async":
            return self._deadline.running()
        if self.sample_timeout_s is None:
            return contextlib.nullcontext()
        return rollout_alarm(self.sample_timeout_s, "run the fit in the main thread to bound a rollout")

    def sample_episodes(
        self,
        module: RLModule,
        *,
        num_episodes: int,
        explore: bool = False,
        policy_mapping_fn: str | PolicyMappingFn | None = None,
        on_episode: Callable[[MultiAgentEpisode], None] | None = None,
    ) -> list[MultiAgentEpisode]:
        """Reset every copy and run until ``num_episodes`` complete episodes are collected.

        For evaluation: the training counters and statistics stay as they are, and the next
        :meth:`sample` starts from fresh episodes (an episode a training :meth:`sample` left
        running is abandoned: evaluate with a runner of its own to keep training episodes whole).

        Args:
            module: The modules, as in :meth:`sample`.
            num_episodes: How many complete episodes to return.
            explore: As in :meth:`sample`; greedy by default.
            policy_mapping_fn: The mapping for these episodes (e.g. the main module against an
                opponent); the runner's own when ``None``.
            on_episode: Called with each of the returned episodes as soon as it ends, so a caller
                stopped part way (a signal) keeps the episodes that ended.

        Returns:
            ``num_episodes`` whole episodes (``env_t_started == 0``), in the order they ended:
            exactly that many are started (copies beyond it stay idle), and all are played out,
            so long games count as much as short ones.

        Raises:
            ValueError: As :meth:`sample`, or for ``num_episodes < 1``.
        """
        check_int("num_episodes", num_episodes)
        self._check_module(module)
        mapping = self.policy_mapping_fn if policy_mapping_fn is None else resolve_policy_mapping_fn(policy_mapping_fn)
        for copy in self._copies:
            copy.mapping_fn = mapping
        finished: list[MultiAgentEpisode] = []
        try:
            with self._timeout():
                self._full_reset()
                # Exactly num_episodes games are started and every one is played to its end: keeping
                # the first ones to finish instead would over-weight short games (quick blunders).
                quota = EpisodeQuota(num_episodes, self.num_envs)
                while not quota.done:
                    active = quota.envs
                    copies = [self._copies[index] for index in active]
                    dropped, failed = self._dropped(), self._failed()
                    acting = self._acting_for(module)
                    ended = step_copies(copies, acting, explore=explore, dropped=dropped, failed=failed)
                    for position, _ in ended:
                        index = active[position]
                        finished.append(self._copies[index].episode.to_numpy())
                        if on_episode is not None and len(finished) <= num_episodes:
                            on_episode(finished[-1])
                        if quota.end(index):
                            self._reset_copy(index, seed=None)
                    # A failed copy is rebuilt with a new episode, which counts in its place, or idles.
                    self._restart([(active[position], error) for position, error in failed or ()])
                    for position, _ in failed or ():
                        quota.end(active[position], kept=False)
                    # A dropped episode's copy started a new one: it counts in its place, or idles.
                    for position, error in dropped or ():
                        quota.end(active[position], kept=False)
                        if quota.num_episodes > 2 * num_episodes:  # more dropped than asked for
                            raise NonFiniteEnvError(
                                f"{error}; evaluation dropped {quota.num_episodes - num_episodes} episodes for NaN or "
                                f"infinite values, more than the {num_episodes} it plays: the env returns them too often"
                            )
                    self._count_dropped(dropped)
        finally:
            for copy in self._copies:
                copy.mapping_fn = self.policy_mapping_fn
            self._needs_reset = True  # the copies are mid-way through evaluation episodes
        return finished[:num_episodes]

    def _restart_episodes_of_removed_modules(self, module: RLModule) -> None:
        # A league removes old snapshots: an episode still running with a module that is gone
        # cannot go on, so its copy starts a new episode (mapped afresh). A new episode mapped
        # to a missing module is still an error, raised by the first step.
        if not isinstance(module, MultiRLModule):
            return
        for copy in self._copies:
            if any(module_id not in module for module_id in copy.episode.agent_to_module_mapping.values()):
                copy.reset(seed=None)

    def _full_reset(self) -> None:
        # A worker that a fault ended (it hung, or died, without restart_failed_sub_environments)
        # is replaced: each call starts with every copy whole, as a sync runner's copies are.
        ended = [index for index, copy in enumerate(self._copies) if not copy.env.alive]
        for index, env in zip(ended, self._new_envs(ended)):
            self._copies[index].replace_env(env)
        # Each full reset gets seeds of its own, so neither evaluation nor a resumed run replays
        # the episodes of the first reset; the first reset uses `seed` itself.
        base = None if self.seed is None else self.seed + self._num_full_resets * self.num_envs
        for index in range(len(self._copies)):
            self._reset_copy(index, seed=None if base is None else base + index)
        self._num_full_resets += 1
        self._needs_reset = False

    def _check_module(self, module: RLModule) -> None:
        if not isinstance(module, RLModule):
            raise TypeError(f"module must be an RLModule or MultiRLModule, got {type(module).__name__}")

    def _acting_for(self, module: RLModule) -> AgentActing:
        if self._acting is None or self._acting.module is not module:
            self._acting = AgentActing(module, self._copies, self.possible_agents)
        return self._acting

    def _record(self, record: EpisodeRecord) -> None:
        self._episodes.append(record)
        self._num_episodes_lifetime += 1
        self._num_episodes_since += 1

    # ------------------------------------------------------------------------------------
    # Statistics and state
    # ------------------------------------------------------------------------------------

    @property
    def num_env_steps_sampled_lifetime(self) -> int:
        """Env steps in the episodes :meth:`sample` returned over the runner's life."""
        return self._num_env_steps_lifetime

    @property
    def num_agent_steps_sampled_lifetime(self) -> int:
        """Agent steps (completed transitions of any agent) :meth:`sample` returned over the runner's life."""
        return self._num_agent_steps_lifetime

    def get_metrics(self) -> dict[str, float]:
        """Return sampling statistics and start a new period for the per-period ones.

        Returns:
            Over the last ``episode_stats_window`` completed training episodes (NaN before the
            first): ``episode_return_mean`` (the sum over agents), ``episode_return_min``,
            ``episode_return_max``, ``episode_len_mean`` (env steps),
            ``agent_episode_return_mean/<agent_id>`` per agent seen in the window, and
            ``module_episode_return_mean/<module_id>`` (the mean over the agent-episodes mapped
            to that module). Since the last call: ``num_episodes``, ``num_env_steps_sampled``,
            ``num_agent_steps_sampled``, ``env_steps_per_sec`` (NaN if nothing was sampled). Over
            the runner's life: ``num_episodes_lifetime``, ``num_env_steps_sampled_lifetime``,
            ``num_agent_steps_sampled_lifetime``, ``num_env_restarts_lifetime`` (copies rebuilt
            by ``restart_failed_sub_environments``).
        """
        nan = float("nan")
        returns = np.asarray([record.episode_return for record in self._episodes], dtype=np.float64)
        agent_returns: dict[AgentID, list[float]] = {}
        module_returns: dict[ModuleID, list[float]] = {}
        for record in self._episodes:
            for agent, value in record.agent_returns.items():
                agent_returns.setdefault(agent, []).append(value)
                module_returns.setdefault(record.agent_modules[agent], []).append(value)
        metrics = {
            "episode_return_mean": float(returns.mean()) if len(returns) else nan,
            "episode_return_min": float(returns.min()) if len(returns) else nan,
            "episode_return_max": float(returns.max()) if len(returns) else nan,
            "episode_len_mean": float(np.mean([r.env_steps for r in self._episodes])) if self._episodes else nan,
            "num_episodes": float(self._num_episodes_since),
            "num_episodes_lifetime": float(self._num_episodes_lifetime),
            "num_env_steps_sampled": float(self._num_env_steps_since),
            "num_agent_steps_sampled": float(self._num_agent_steps_since),
            "num_env_steps_sampled_lifetime": float(self._num_env_steps_lifetime),
            "num_agent_steps_sampled_lifetime": float(self._num_agent_steps_lifetime),
            "num_env_restarts_lifetime": float(self.num_env_restarts),
            "env_steps_per_sec": (
                self._num_env_steps_since / self._sample_seconds_since if self._sample_seconds_since > 0 else nan
            ),
        }
        metrics.update({f"agent_episode_return_mean/{a}": float(np.mean(v)) for a, v in agent_returns.items()})
        metrics.update({f"module_episode_return_mean/{m}": float(np.mean(v)) for m, v in module_returns.items()})
        self._num_episodes_since = self._num_env_steps_since = self._num_agent_steps_since = 0
        self._sample_seconds_since = 0.0
        return metrics

    def get_state(self) -> dict[str, Any]:
        """Return the counters and the statistics window as plain Python data (the envs are not part of it).

        Returns:
            ``{"num_env_steps_sampled_lifetime": int, "num_agent_steps_sampled_lifetime": int,
            "num_episodes_lifetime": int, "num_full_resets": int, "num_env_restarts_lifetime": int,
            "episodes": [{"episode_return":
            float, "env_steps": int, "agent_returns": {agent: float}, "agent_modules": {agent:
            module}}]}``.
        """
        return {
            "num_env_steps_sampled_lifetime": int(self._num_env_steps_lifetime),
            "num_agent_steps_sampled_lifetime": int(self._num_agent_steps_lifetime),
            "num_episodes_lifetime": int(self._num_episodes_lifetime),
            "num_full_resets": int(self._num_full_resets),
            "num_env_restarts_lifetime": int(self.num_env_restarts),
            "episodes": [
                {
                    "episode_return": float(record.episode_return),
                    "env_steps": int(record.env_steps),
                    "agent_returns": {str(a): float(v) for a, v in record.agent_returns.items()},
                    "agent_modules": {str(a): str(m) for a, m in record.agent_modules.items()},
                }
                for record in self._episodes
            ],
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`get_state`'s counters; the next :meth:`sample` resets every copy.

        The reset uses seeds derived from the saved reset count, so a resumed run does not
        replay the episodes it started with. Per-period counters start afresh.

        Args:
            state: What :meth:`get_state` returned.

        Raises:
            ValueError: Naming the missing or unexpected keys, a negative counter, or an episode
                record without its fields; nothing changes then.
        """
        known = _STATE_KEYS | _OPTIONAL_STATE_KEYS
        missing, unexpected = sorted(_STATE_KEYS - set(state)), sorted(set(state) - known)
        if missing or unexpected:
            raise ValueError(f"MultiAgentEnvRunner state: missing keys {missing}, unexpected keys {unexpected}")
        counters = (known & set(state)) - {"episodes"}
        for key in sorted(counters):
            if isinstance(state[key], bool) or int(state[key]) < 0:
                raise ValueError(f"MultiAgentEnvRunner state: {key} must be an int >= 0, got {state[key]!r}")
        try:
            records = [
                EpisodeRecord(
                    float(e["episode_return"]),
                    int(e["env_steps"]),
                    {str(a): float(v) for a, v in e["agent_returns"].items()},
                    {str(a): str(m) for a, m in e["agent_modules"].items()},
                )  # fmt: skip
                for e in state["episodes"]
            ]
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(f"MultiAgentEnvRunner state: an entry of 'episodes' is malformed ({error!r})") from error
        self._num_env_steps_lifetime = int(state["num_env_steps_sampled_lifetime"])
        self._num_agent_steps_lifetime = int(state["num_agent_steps_sampled_lifetime"])
        self._num_episodes_lifetime = int(state["num_episodes_lifetime"])
        self._num_full_resets = int(state["num_full_resets"])
        self.num_env_restarts = int(state.get("num_env_restarts_lifetime", 0))
        self._episodes = deque(records, maxlen=self.episode_stats_window)
        self._num_env_steps_since = self._num_agent_steps_since = self._num_episodes_since = 0
        self._sample_seconds_since = 0.0
        self._needs_reset = True

    # ------------------------------------------------------------------------------------
    # Lifetime
    # ------------------------------------------------------------------------------------

    @property
    def envs(self) -> list[Any]:
        """The PettingZoo env copies (``"sync"`` mode).

        Raises:
            RuntimeError: In ``"async"`` mode, where the envs live in the worker processes.
        """
        if self.vectorize_mode == "async":
            raise RuntimeError("vectorize_mode='async': the env copies live in worker processes, not in this one")
        return [copy.env.env for copy in self._copies]

    def _close_envs(self) -> None:
        for copy in self._copies:
            copy.env.close()

    def __repr__(self) -> str:
        return (
            f"MultiAgentEnvRunner(num_envs={self.num_envs}, vectorize_mode={self.vectorize_mode!r}, "
            f"possible_agents={self.possible_agents}, seed={self.seed})"
        )
