"""Episodes of a recurrent module, stepped one env step at a time with ``Acting`` (test helper).

What an env runner does for a stateful module, by hand: per env, the state, previous action and
reward move on with each step, start afresh where an episode starts (an autoreset), and each
step's ``state_in``, ``prev_actions`` and ``prev_rewards`` are stored in the episode. A
rollout ends by cutting every running episode into a chunk; the next rollout continues it
(``t_started > 0``) from the state the actor carried on.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.acting import Acting
from lightning_rl.core.columns import Columns
from lightning_rl.env.episode import SingleAgentEpisode

RECORDED = (
    Columns.ACTION_LOGP,
    Columns.ACTION_DIST_INPUTS,
    Columns.STATE_IN,
    Columns.PREV_ACTIONS,
    Columns.PREV_REWARDS,
)


class _Chunk:
    def __init__(self, obs: np.ndarray, t_started: int, id_: str | None = None) -> None:
        self.id_ = id_ or f"ep{np.random.default_rng().integers(1 << 40)}"
        self.t_started = t_started
        self.observations = [obs]
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.extras: dict[str, list[np.ndarray]] = {key: [] for key in RECORDED}

    def episode(self, *, terminated: bool = False, truncated: bool = False) -> SingleAgentEpisode:
        return SingleAgentEpisode(
            self.id_,
            observations=np.stack(self.observations).astype(np.float32),
            actions=np.asarray(self.actions),  # Box actions as sampled (the stored action is the unclipped one)
            rewards=np.asarray(self.rewards, dtype=np.float32),
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs={key: np.stack(values) for key, values in self.extras.items()},
            t_started=self.t_started,
        )


class Rollouts:
    """``num_envs`` envs of ``env_id`` (episodes truncated at ``max_episode_steps``) acted on by ``module``.

    Args:
        module: A stateful single-agent module for the env's spaces.
        num_envs: Envs stepped side by side.
        max_episode_steps: Where episodes are truncated.
        seed: The envs' first reset seeds and the action sampling's torch seed.
        env_id: A gymnasium env with ``Discrete`` or ``Box`` actions.
    """

    def __init__(
        self, module: Any, num_envs: int = 2, max_episode_steps: int = 30, seed: int = 0, env_id: str = "CartPole-v1"
    ) -> None:
        self.module = module
        self.envs = [gym.make(env_id, max_episode_steps=max_episode_steps) for _ in range(num_envs)]
        self.discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)
        self.acting = Acting(module, num_envs)
        self.chunks = [
            _Chunk(env.reset(seed=seed + index)[0], t_started=0) for index, env in enumerate(self.envs)
        ]
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, num_steps: int) -> list[SingleAgentEpisode]:
        """``num_steps`` steps of every env: the episodes that ended, then every running one cut into a chunk."""
        done: list[SingleAgentEpisode] = []
        for _ in range(num_steps):
            obs = torch.as_tensor(np.stack([chunk.observations[-1] for chunk in self.chunks]), dtype=torch.float32)
            with torch.no_grad():
                torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=self.generator)))
                out, actions = self.acting.act(obs, explore=True)
            rewards, starts = [], []
            for index, (env, chunk) in enumerate(zip(self.envs, self.chunks)):
                action = int(actions[index]) if self.discrete else actions[index].numpy()
                next_obs, reward, terminated, truncated, _ = env.step(action)
                chunk.actions.append(action)
                chunk.rewards.append(float(reward))
                chunk.observations.append(next_obs)
                for key in RECORDED:
                    chunk.extras[key].append(out[key][index].numpy())
                rewards.append(float(reward))
                if terminated or truncated:
                    done.append(chunk.episode(terminated=terminated, truncated=truncated))
                    self.chunks[index] = _Chunk(env.reset()[0], t_started=0)  # an autoreset
                    starts.append(index)
            self.acting.observe_rewards(torch.tensor(rewards))
            self.acting.start_episodes(starts)
        cut = [chunk.episode() for chunk in self.chunks if chunk.actions]
        self.chunks = [
            _Chunk(chunk.observations[-1], t_started=chunk.t_started + len(chunk.actions), id_=chunk.id_)
            for chunk in self.chunks
        ]
        return done + cut
