"""A small PettingZoo env that misbehaves on request, for the tests of env copies in worker processes.

A module of its own, with light imports, so that the workers (which import it by name) start quickly.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


class Countdown(ParallelEnv):
    """Agents a and b; the seed draws each episode's length (3 to 6 steps), the observations and the rewards.

    The copy whose last seeded reset had an odd seed (copy 1 of a runner seeded 0) is faulty:
    at step ``at_step`` of that episode it hangs in C code, raises, kills its own process
    (``kill -9``), or returns a NaN reward for b (``fault``). Rebuilt copies reset unseeded: they
    are sound. ``marker``: a file written just before the fault.
    """

    metadata = {"name": "countdown_v0"}

    def __init__(self, fault: str = "none", at_step: int = 2, marker: str | None = None) -> None:
        self.possible_agents = ["a", "b"]
        self.fault, self.at_step, self.marker = fault, at_step, marker
        self.faulty = False
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
            self.faulty = seed % 2 == 1
        self.t, self.length = 0, int(self.rng.integers(3, 7))
        self.agents = list(self.possible_agents)
        return self._observations(), {agent: {} for agent in self.agents}

    def _observations(self) -> dict[str, np.ndarray]:
        return {agent: self.rng.normal(size=2).astype(np.float32) for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self.faulty and self.t == self.at_step and self.fault != "nan_reward":
            if self.marker is not None:
                Path(self.marker).write_text(str(os.getpid()))
            if self.fault == "hang":
                ctypes.CDLL(None).sleep(1000)  # C code: no Python signal handler runs in it
            if self.fault == "raise":
                raise RuntimeError("boom")
            if self.fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)
        self.t += 1
        rewards = {agent: float(actions[agent]) + float(self.rng.normal()) for agent in self.agents}
        if self.faulty and self.fault == "nan_reward" and self.t == self.at_step + 1:
            self.faulty = False  # once per seeded reset
            rewards["b"] = float("nan")
        done = self.t >= self.length
        observations = self._observations()
        flags = dict.fromkeys(self.agents, done)
        infos = {agent: {} for agent in self.agents}
        self.agents = [] if done else self.agents
        return observations, rewards, flags, dict.fromkeys(flags, False), infos
