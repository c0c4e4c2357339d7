"""The MultiAgentEnvRunner's step loop: PettingZoo env copies, and one forward pass per module per step.

Each env copy (:class:`EnvCopy`) holds one env, stepped in this process or in a worker process
of its own (:mod:`lightning_rl.env.pettingzoo_stepper`, :mod:`lightning_rl.env.multi_agent_worker`),
and the episode running in it, behind the same calls whether the env is a ``ParallelEnv``
(every live agent acts at once) or an ``AECEnv`` (one agent acts per env step, the
``agent_selection``): :meth:`EnvCopy.reset`, :attr:`EnvCopy.waiting` (the agents that must act
now, with their observations), :meth:`EnvCopy.send_step` and :meth:`EnvCopy.receive_step`.
:func:`step_copies` then takes one step of every copy: it gathers every (copy, agent) that must
act, groups the rows by the module each agent is mapped to, runs ONE forward pass per module
over all its rows (through :class:`~lightning_rl.env.agent_acting.AgentActing`, which keeps a
recurrent module's state per agent per copy), sends every copy its actions, and then records
each copy's answer, so that copies in worker processes step in parallel.

An agent whose observation space is PettingZoo's action-mask Dict (``{"action_mask",
"observation"}``) is stored with the observation part in its episode's ``observations`` and
the mask of each step it acted at in ``extra_model_outputs["action_mask"]``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.action_masks import (
    ACTION_MASK,
    check_maskable_action_space,
    is_action_masked_space,
    observation_part,
    split_masked_observation,
)
from lightning_rl.core.columns import DEFAULT_MODULE_ID, Columns
from lightning_rl.core.observation_layout import ARRAY_SPACES
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.env.agent_acting import AgentActing
from lightning_rl.env.env_errors import EnvFaultError, NonFiniteEnvError, SampleTimeoutError, SubEnvError
from lightning_rl.env.multi_agent_episode import ALL_AGENTS, AgentID, ModuleID, MultiAgentEpisode
from lightning_rl.env.multi_agent_worker import EnvWorker, WorkerDied, WorkerRaised
from lightning_rl.env.pettingzoo_stepper import RESET, STEP, LocalEnv, StepResult

# An agent's observation as the module sees it: (observation part, action mask or None).
AgentObservation = tuple[np.ndarray, np.ndarray | None]


@dataclass
class EpisodeRecord:
    """What the statistics keep of one completed episode (plain data, for the runner's state)."""

    episode_return: float
    env_steps: int
    agent_returns: dict[AgentID, float]
    agent_modules: dict[AgentID, ModuleID]


def check_agent_spaces(agent: AgentID, observation_space: gym.Space, action_space: gym.Space) -> None:
    """Refuse spaces the runner cannot stack into batches.

    Args:
        agent: The agent, for the message.
        observation_space: An array space, or PettingZoo's action-mask Dict around one with a
            ``Discrete`` action space.
        action_space: An array space.

    Raises:
        ValueError: Naming the agent and the space.
    """
    observed = observation_part(observation_space)
    if not isinstance(observed, ARRAY_SPACES):
        raise ValueError(
            f"agent {agent!r} has the observation space {observation_space}; expected an array space (Box, Discrete, "
            "MultiDiscrete, MultiBinary) or a Dict of exactly 'observation' (an array space) and 'action_mask' "
            "(other Dict and Tuple observations are read by the single-agent EnvRunner only)"
        )
    if not isinstance(action_space, ARRAY_SPACES):
        raise ValueError(f"agent {agent!r} has the action space {action_space}; expected an array space")
    if is_action_masked_space(observation_space):
        check_maskable_action_space(action_space, f"agent {agent!r}")


class EnvCopy:
    """One PettingZoo env, in this process or in a worker process, and the episode running in it.

    Faults are errors that name the copy, the agents and the step: an exception of the env a
    ``SubEnvError`` (also a worker process that died), a NaN or infinite reward or observation
    a ``NonFiniteEnvError`` (as the single-agent runner's ``on_nonfinite="raise"``), and a
    ``SampleTimeoutError`` (the runner's ``sample_timeout_s``) says which copy did not return.

    Args:
        env: The env, as a :class:`~lightning_rl.env.pettingzoo_stepper.LocalEnv` or a ready
            :class:`~lightning_rl.env.multi_agent_worker.EnvWorker`.
        mapping_fn: The policy mapping function new episodes get.
        index: The copy's index in its runner, for errors.
    """

    def __init__(
        self, env: LocalEnv | EnvWorker, mapping_fn: Callable[[AgentID, MultiAgentEpisode], ModuleID], index: int = 0
    ) -> None:
        self.index = index
        self.mapping_fn = mapping_fn
        self.episode = MultiAgentEpisode(agent_to_module_mapping_fn=mapping_fn)
        #: ``{agent_id: (observation part, mask)}`` of the agents that must act at the next step.
        self.waiting: dict[AgentID, AgentObservation] = {}
        # The whole episode's per-agent returns and end flags, over all its chunks.
        self._returns: dict[AgentID, float] = {}
        self._ended_terminated: dict[AgentID, bool] = {}
        self._env_steps = 0
        # The agents whose actions the step sent last (send_step) is taking, for errors.
        self._stepping: list[AgentID] = []
        # Episode ids come from the last seeded reset: (its seed, episodes since), so a seeded
        # run's ids, and the match-ups a policy mapping draws from them, repeat run after run.
        self._id_seed: int | None = None
        self._episodes_since_seed = 0
        self.replace_env(env)

    def replace_env(self, env: LocalEnv | EnvWorker) -> None:
        """Step ``env`` from now on (a rebuilt copy of a failed one); call :meth:`reset` next.

        The copy object stays the same, so what is kept per copy (a recurrent module's state
        rows) stays with it; its running episode is abandoned at the reset.
        """
        self.env = env
        spaces = env.spaces
        self._masked = {agent: is_action_masked_space(space) for agent, space in spaces.observation_spaces.items()}
        self.action_spaces: dict[AgentID, gym.Space] = dict(spaces.action_spaces)

    def reset(self, seed: int | None) -> None:
        """Start a new episode (the running one is abandoned) with ``env.reset(seed=seed)``.

        The episode's id is a function of the last seeded reset's seed and the episodes started
        since (``episode_id``): the same for the same seeds, so a policy mapping that draws from
        ``episode.id_`` (a league's match-ups) is reproducible. Before any seeded reset: uuid4.
        """
        if seed is not None:
            self._id_seed, self._episodes_since_seed = int(seed), 0
        episode_id = None if self._id_seed is None else seeded_episode_id(self._id_seed, self._episodes_since_seed)
        self._episodes_since_seed += 1
        self.episode = MultiAgentEpisode(agent_to_module_mapping_fn=self.mapping_fn, id_=episode_id)
        self._returns, self._ended_terminated, self._env_steps = {}, {}, 0
        with self._faults("reset", list(self.env.spaces.possible_agents)):
            self.env.send(RESET, seed)
            observations = self.env.receive()
        self._check_finite(observations, {}, "reset")
        split = {agent: self._split(agent, observation) for agent, observation in observations.items()}
        self.episode.add_env_reset({agent: obs for agent, (obs, _) in split.items()})
        self.waiting = split

    def send_step(self, env_actions: dict[AgentID, Any]) -> None:
        """Send the env the waiting agents' actions; :meth:`receive_step` records what it returns.

        Args:
            env_actions: ``{agent_id: action}`` for every waiting agent, as the env takes them
                (ints, clipped Box actions).
        """
        self._stepping = list(env_actions)
        with self._faults(self._step_name(), self._stepping):
            self.env.send(STEP, env_actions)

    def receive_step(self, actions: dict[AgentID, Any], extras: dict[AgentID, dict[str, Any]]) -> EpisodeRecord | None:
        """Wait for the step :meth:`send_step` asked for, and record it.

        Args:
            actions: ``{agent_id: action}`` of the step's agents, as the module chose them
                (what the episode stores).
            extras: ``{agent_id: {key: value}}``, the model outputs to store with each action.

        Returns:
            The completed episode's record when this step ended it (``self.episode`` is then
            the done episode; call :meth:`reset` next), else ``None``.
        """
        where = self._step_name()
        with self._faults(where, self._stepping):
            result: StepResult = self.env.receive()
        observations, rewards, terminateds, truncateds = (
            result.observations, result.rewards, result.terminateds, result.truncateds
        )  # fmt: skip
        self._check_finite(observations, rewards, where)
        done = result.done
        split = {agent: self._split(agent, observation) for agent, observation in observations.items()}
        for agent in observations:
            if terminateds.get(agent) or truncateds.get(agent):
                self._ended_terminated[agent] = bool(terminateds.get(agent))
        terminated_all = done and all(self._ended_terminated.get(agent, False) for agent in self._seen_agents())
        self.episode.add_env_step(
            {agent: obs for agent, (obs, _) in split.items()}, actions, rewards,
            terminateds={**terminateds, ALL_AGENTS: terminated_all},
            truncateds={**truncateds, ALL_AGENTS: done and not terminated_all},
            extra_model_outputs=extras,
        )  # fmt: skip
        self._env_steps += 1
        self.waiting = {
            agent: obs for agent, obs in split.items() if not (terminateds.get(agent) or truncateds.get(agent))
        }
        if not done:
            return None
        self.add_chunk_returns()
        return EpisodeRecord(
            episode_return=float(sum(self._returns.values())),
            env_steps=self._env_steps,
            agent_returns=dict(self._returns),
            agent_modules={agent: self.episode.module_for(agent) for agent in self._returns},
        )

    def _step_name(self) -> str:
        return f"step {self._env_steps} of its episode"

    @contextlib.contextmanager
    def _faults(self, where: str, agents: list[AgentID]) -> Iterator[None]:
        """Turn what the env raises at ``where`` into an error naming this copy, ``agents`` and the step."""
        try:
            yield
        except SampleTimeoutError as error:
            if self.env.in_worker:  # the worker's wait timed out (and killed it)
                message = f"env copy {self.index} did not return from {where} (agents {agents}): {error}"
            else:  # the rollout's alarm went off inside the env
                message = f"{error}: env copy {self.index} did not return from {where} (agents {agents})"
            raise SampleTimeoutError(message) from None
        except EnvFaultError:
            raise
        except WorkerRaised as error:
            raise SubEnvError(f"env copy {self.index} raised at {where} (agents {agents}): {error}") from None
        except WorkerDied as error:
            raise SubEnvError(f"env copy {self.index} failed at {where} (agents {agents}): {error}") from None
        except Exception as error:
            raise SubEnvError(
                f"env copy {self.index} raised at {where} (agents {agents}): {type(error).__name__}: {error}"
            ) from error

    def _check_finite(self, observations: dict[AgentID, Any], rewards: dict[AgentID, Any], where: str) -> None:
        """Raise ``NonFiniteEnvError`` naming the copy, the agent and the step for a NaN or infinite value."""
        for agent, reward in rewards.items():
            if not math.isfinite(float(reward)):
                raise NonFiniteEnvError(f"env copy {self.index}, agent {agent!r}, {where}: the reward is {reward}")
        for agent, observation in observations.items():
            values = observation.get("observation") if isinstance(observation, dict) else observation
            values = np.asarray(values)
            if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
                raise NonFiniteEnvError(
                    f"env copy {self.index}, agent {agent!r}, {where}: the observation holds {values[~np.isfinite(values)][0]}"
                )

    def add_chunk_returns(self) -> None:
        """Add the running chunk's per-agent returns to the episode's; call once per chunk, before it is cut."""
        for agent, value in self.episode.agent_returns().items():
            self._returns[agent] = self._returns.get(agent, 0.0) + value

    def _seen_agents(self) -> list[AgentID]:
        return [*self._ended_terminated, *self.episode.agent_ids]

    def _split(self, agent: AgentID, observation: Any) -> AgentObservation:
        # Copies: some envs hand out views of arrays they change in place at the next step.
        if self._masked.get(agent, False):
            observation, mask = split_masked_observation(observation)
            return np.array(observation), np.array(mask)
        return np.array(observation), None


def step_copies(
    copies: list[EnvCopy],
    acting: AgentActing,
    *,
    explore: bool,
    dropped: list[tuple[int, NonFiniteEnvError]] | None = None,
    failed: list[tuple[int, EnvFaultError]] | None = None,
) -> list[tuple[int, EpisodeRecord]]:
    """Take one env step in every copy: one forward pass per module over all rows mapped to it.

    Args:
        copies: The env copies (all of ``acting``'s, or some of them); each must have waiting agents.
        acting: How the agents act: its ``module`` is a ``MultiRLModule`` holding every module
            id the agents map to, or a single ``RLModule`` when every agent maps to
            ``DEFAULT_MODULE_ID``. A copy's agents start afresh when its episode is a new one;
            each agent's reward (its agent episode's) goes back to it after the step.
        explore: Sample actions (``forward_exploration``) or take the most likely ones.
        dropped: ``None`` to raise a copy's ``NonFiniteEnvError``; a list to drop the episode
            instead (``on_nonfinite="drop_episode"``): the copy starts a new one, and ``(copy
            index, error)`` is appended.
        failed: ``None`` to raise a copy's ``SubEnvError`` (or a worker's ``SampleTimeoutError``);
            a list to append ``(copy index, error)`` instead and go on with the other copies
            (``restart_failed_sub_environments``: the caller rebuilds that copy).

    Returns:
        ``(copy index, record)`` of each copy whose episode ended in this step.

    Raises:
        ValueError: If an agent maps to a module id ``module`` does not hold, or the rows of one
            module mix masked and unmasked observations.
    """
    groups: dict[ModuleID, list[tuple[int, AgentID]]] = {}
    for index, copy in enumerate(copies):
        acting.follow_episode(copy, copy.episode.id_)
        for agent in copy.waiting:
            groups.setdefault(copy.episode.module_for(agent), []).append((index, agent))
    actions: list[dict[AgentID, Any]] = [{} for _ in copies]
    env_actions: list[dict[AgentID, Any]] = [{} for _ in copies]
    extras: list[dict[AgentID, dict[str, Any]]] = [{} for _ in copies]
    for module_id, rows in groups.items():
        observations = [copies[index].waiting[agent] for index, agent in rows]
        slots = [acting.row(copies[index], agent) for index, agent in rows]
        out, chosen = _act(acting, module_id, slots, observations, explore=explore)
        for row, (index, agent) in enumerate(rows):
            actions[index][agent] = chosen[row]
            env_actions[index][agent] = _env_action(chosen[row], copies[index].action_spaces[agent])
            extras[index][agent] = {key: value[row] for key, value in out.items()}
    # Every copy gets its actions before any answer is awaited: copies in worker processes step at once.
    sent = []
    for index, copy in enumerate(copies):
        try:
            copy.send_step(env_actions[index])
        except EnvFaultError as error:
            _go_on_after(copy, index, error, dropped, failed)
            continue
        sent.append(index)
    ended = []
    for index in sent:
        try:
            record = copies[index].receive_step(actions[index], extras[index])
        except EnvFaultError as error:
            _go_on_after(copies[index], index, error, dropped, failed)
            continue
        if record is not None:
            ended.append((index, record))
    if acting.stateful:
        _observe_rewards(copies, acting)
    return ended


def _go_on_after(
    copy: EnvCopy,
    index: int,
    error: EnvFaultError,
    dropped: list[tuple[int, NonFiniteEnvError]] | None,
    failed: list[tuple[int, EnvFaultError]] | None,
) -> None:
    """Raise ``error``, or note it in ``dropped`` or ``failed`` where the runner goes on from it.

    A non-finite value drops the episode (the copy starts a new one). A failed copy is noted for
    the runner to rebuild: an env that raised or whose worker died, and a worker that hung (it
    was killed); a hang in this process ends the whole call instead (the rollout's alarm).
    """
    if isinstance(error, NonFiniteEnvError):
        if dropped is None:
            raise error
        dropped.append((index, error))
        copy.reset(seed=None)  # the episode is thrown away; a NaN in the reset itself raises
        return
    restartable = isinstance(error, SubEnvError) or (isinstance(error, SampleTimeoutError) and copy.env.in_worker)
    if failed is None or not restartable:
        raise error
    failed.append((index, error))


def _observe_rewards(copies: list[EnvCopy], acting: AgentActing) -> None:
    # Each agent that acts next gets the reward of its agent episode's latest step as its next
    # prev_rewards, as the Learner sees it; one that has not acted yet in its episode keeps zero
    # (a reward before an agent's first action is no step of its). One call per module.
    groups: dict[ModuleID, tuple[list[int], list[float]]] = {}
    for copy in copies:
        for agent in copy.waiting:
            agent_episode = copy.episode.agent_episodes.get(agent)
            if agent_episode is None or len(agent_episode) == 0:
                continue
            rows, rewards = groups.setdefault(copy.episode.module_for(agent), ([], []))
            rows.append(acting.row(copy, agent))
            rewards.append(float(agent_episode.rewards[-1]))
    for module_id, (rows, rewards) in groups.items():
        acting.observe_rewards(module_id, rows, rewards)


def _module_for(module: RLModule, module_id: ModuleID) -> RLModule:
    if isinstance(module, MultiRLModule):
        if module_id not in module:
            raise ValueError(
                f"an agent is mapped to module {module_id!r}, which the MultiRLModule lacks; it holds {sorted(module)}"
            )
        return module[module_id]
    if module_id != DEFAULT_MODULE_ID:
        raise ValueError(
            f"an agent is mapped to module {module_id!r}, but a single RLModule was given (it acts as "
            f"{DEFAULT_MODULE_ID!r}); pass a MultiRLModule holding {module_id!r}"
        )
    return module


def _act(
    acting: AgentActing, module_id: ModuleID, slots: list[int], observations: list[AgentObservation], *, explore: bool
) -> tuple[dict, np.ndarray]:
    """One forward pass of module ``module_id`` over the rows' observations; the actions and per-row outputs as numpy.

    ``slots`` are the rows' :meth:`AgentActing.row`, where a recurrent module keeps their state.

    Returns:
        ``({key: array[B, ...]}`` of every per-row tensor output (``action_mask`` included for
        masked rows), ``actions[B, ...]``).
    """
    module = _module_for(acting.module, module_id)
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    obs = torch.from_numpy(np.stack([obs for obs, _ in observations])).to(device)
    has_mask = [mask is not None for _, mask in observations]
    if any(has_mask) and not all(has_mask):
        raise ValueError("the agents mapped to one module must all have action-masked observations, or none")
    mask = torch.from_numpy(np.stack([mask for _, mask in observations])).to(device) if all(has_mask) else None
    with torch.inference_mode():
        out, actions = acting.act(module_id, module, slots, obs, explore=explore, action_mask=mask)
    rows = obs.shape[0]
    arrays = {
        key: value.cpu().numpy()
        for key, value in out.items()
        if key != Columns.ACTIONS and isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows
    }
    if mask is not None:
        arrays[ACTION_MASK] = mask.cpu().numpy()
    return arrays, actions.cpu().numpy()


def _env_action(action: np.ndarray, space: gym.Space) -> Any:
    # Discrete actions go to the env as Python ints; Box actions are clipped to their bounds.
    if isinstance(space, gym.spaces.Discrete):
        return int(action)
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    return action


def seeded_episode_id(seed: int, index: int) -> str:
    """The id of the ``index``-th episode after a reset with ``seed``: 32 hex digits, as a uuid4's hex.

    A hash, so ids of nearby seeds share nothing a policy mapping could pick up.
    """
    return hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=16).hexdigest()
