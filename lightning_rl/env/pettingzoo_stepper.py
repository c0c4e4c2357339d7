"""One PettingZoo env, Parallel or AEC, behind the two calls the multi-agent runner makes: reset and step.

:class:`PettingZooStepper` hides whether an env is a ``ParallelEnv`` (every live agent acts at
once) or an ``AECEnv`` (one agent acts per env step, the ``agent_selection``): a reset returns
the observations of the agents that must act, a step takes their actions and returns what the
agents observed, as plain data (dicts of numpy arrays and floats), the same in either API.

Where the env runs is the runner's ``vectorize_mode``: :class:`LocalEnv` steps it in the
runner's process (``"sync"``); :class:`~lightning_rl.env.multi_agent_worker.EnvWorker` in a
worker process of its own (``"async"``), which runs this same stepper. Both answer the runner
the same way: ``send(call, argument)``, then ``receive()`` for the answer, so that the runner
can send every copy its actions before it waits for the first answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from lightning_rl.env.multi_agent_episode import AgentID
from lightning_rl.env.pettingzoo_env import is_parallel_env

# The calls a runner sends an env: ``send(RESET, seed)`` and ``send(STEP, env_actions)``.
RESET = "reset"
STEP = "step"


@dataclass(frozen=True)
class AgentSpaces:
    """What the runner knows of an env without holding it: its agents and their spaces."""

    possible_agents: list[AgentID]
    observation_spaces: dict[AgentID, gym.Space]
    action_spaces: dict[AgentID, gym.Space]

    @classmethod
    def of(cls, env: Any) -> AgentSpaces:
        """Read ``env``'s ``possible_agents`` and each one's observation and action space."""
        agents = list(env.possible_agents)
        return cls(
            agents,
            {agent: env.observation_space(agent) for agent in agents},
            {agent: env.action_space(agent) for agent in agents},
        )


@dataclass
class StepResult:
    """What one env step returned, per agent that observed something.

    ``observations`` hold each agent's raw observation (an action-mask Dict included);
    ``done`` says that no agent is left, so the episode ended.
    """

    observations: dict[AgentID, Any]
    rewards: dict[AgentID, float]
    terminateds: dict[AgentID, bool]
    truncateds: dict[AgentID, bool]
    done: bool


class PettingZooStepper:
    """Resets and steps one PettingZoo env, Parallel or AEC, the same way.

    Args:
        env: The ``ParallelEnv`` or ``AECEnv``.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.is_parallel = is_parallel_env(env)
        # Reading `agents` / `agent_selection` through an AEC env's wrappers walks a chain of
        # __getattr__ calls, several times per step; the unwrapped env holds the same attributes.
        self._raw = env if self.is_parallel else env.unwrapped

    def reset(self, seed: int | None) -> dict[AgentID, Any]:
        """``env.reset(seed=seed)``; return the observations of the agents that act first."""
        if self.is_parallel:
            observations, _ = self.env.reset(seed=seed)
            return observations
        self.env.reset(seed=seed)
        return self._aec_observe().observations

    def step(self, env_actions: dict[AgentID, Any]) -> StepResult:
        """Step the env with the acting agents' actions (an AEC env: the one agent's)."""
        if self.is_parallel:
            observations, rewards, terminateds, truncateds, _ = self.env.step(env_actions)
            return StepResult(observations, rewards, terminateds, truncateds, done=not self._raw.agents)
        (agent,) = env_actions
        self.env.step(env_actions[agent])
        return self._aec_observe()

    def close(self) -> None:
        """Close the env."""
        self.env.close()

    def _aec_observe(self) -> StepResult:
        # After an AEC step, every agent the env selects observes: done agents (stepped with None
        # right away, their final observation recorded) until a live one, who acts next. The
        # reward `last()` gives is what that agent collected since it last acted.
        result = StepResult({}, {}, {}, {}, done=False)
        env, raw = self.env, self._raw
        while raw.agents:
            agent = raw.agent_selection
            observation, reward, terminated, truncated, _ = env.last()
            result.observations[agent], result.rewards[agent] = observation, float(reward)
            result.terminateds[agent], result.truncateds[agent] = bool(terminated), bool(truncated)
            if not (terminated or truncated):
                break
            env.step(None)
        result.done = not raw.agents
        return result


class LocalEnv:
    """A PettingZoo env stepped in this process (``vectorize_mode="sync"``): a call runs when its answer is received.

    Args:
        make_env: Builds the env.

    Attributes:
        spaces: The env's agents and spaces.
        in_worker: ``False``: a hang here cannot be ended by killing anything.
        alive: ``True``: no fault ends an env in this process (a failed one is rebuilt or reset).
    """

    in_worker = False
    alive = True

    def __init__(self, make_env: Callable[[], Any]) -> None:
        env = make_env()
        self.spaces = AgentSpaces.of(env)
        self._stepper = PettingZooStepper(env)
        self._call: tuple[str, Any] | None = None

    @property
    def env(self) -> Any:
        """The PettingZoo env."""
        return self._stepper.env

    def send(self, call: str, argument: Any) -> None:
        """Ask for ``reset(seed)`` (``RESET``) or ``step(env_actions)`` (``STEP``); :meth:`receive` runs it."""
        self._call = (call, argument)

    def receive(self) -> Any:
        """Run the call :meth:`send` asked for; return what it returned (what the env raises propagates)."""
        call, argument = self._call
        self._call = None
        return getattr(self._stepper, call)(argument)

    def close(self) -> None:
        """Close the env."""
        self._stepper.close()

    def discard(self) -> None:
        """Drop an env that failed: close it, ignoring what a broken env raises while closing."""
        with contextlib.suppress(Exception):
            self._stepper.close()
