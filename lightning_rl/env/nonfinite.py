"""Catching NaN and infinite observations and rewards the moment an env returns them.

Left alone, a NaN observation surfaces one step later as a torch error about probabilities
that names neither the env nor the observation, and a NaN reward poisons the update without
any error. :class:`NonFiniteCheck` looks at each vector step's rewards and next observations
with one ``np.isfinite(...).all()`` each (observations only when their dtype is a float);
only when that fails does it find which env and which value, and then raises
:class:`NonFiniteEnvError` naming them (``on_nonfinite="raise"``), or drops the episode and
resets that env (``"drop_episode"``), counting each such step.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np

from lightning_rl.env.env_errors import NonFiniteEnvError
from lightning_rl.env.guarded_vector_env import GuardedVectorEnv
from lightning_rl.env.rollout_buffers import RolloutBuffers, RunningEpisodes
from lightning_rl.env.vector_infos import unbatch_one

OnNonFinite = Literal["raise", "drop_episode"]
ON_NONFINITE_CHOICES = ("raise", "drop_episode")


class NonFiniteCheck:
    """Raises on, or drops the episodes of, NaN/inf observations and rewards.

    Args:
        on_nonfinite: ``"raise"`` a :class:`NonFiniteEnvError` naming the env, the step and
            the value; or ``"drop_episode"``: drop the episode, reset that env, count it.
        observation_space: The single-env observation space (integer observations are
            never checked: they cannot be NaN).

    Attributes:
        num_nonfinite_env_steps: Env steps (or resets) that returned a NaN or inf value and
            were dropped.
    """

    def __init__(self, on_nonfinite: OnNonFinite, observation_space: gym.Space) -> None:
        self.drop = on_nonfinite == "drop_episode"
        self.check_obs = np.issubdtype(observation_space.dtype, np.floating)
        self.num_nonfinite_env_steps = 0

    def step_is_finite(self, buffers: RolloutBuffers, t: int) -> bool:
        """Whether vector step ``t``'s rewards, next observations and final observations are all finite."""
        if buffers.nonfinite_final_envs or not np.isfinite(buffers.rewards[t]).all():
            return False
        return not self.check_obs or bool(np.isfinite(buffers.obs[t + 1]).all())

    def handle_step(
        self, buffers: RolloutBuffers, t: int, episodes: RunningEpisodes, vector: GuardedVectorEnv
    ) -> None:
        """Raise for the non-finite values of step ``t``, or drop their episodes and reset those envs.

        Raises:
            NonFiniteEnvError: ``"env 2 returned a NaN reward at env step 1834 (step 17 of its
                episode)"``; also in ``"drop_episode"`` mode for an env whose reset observation
                is not finite either.
        """
        problems = self._step_problems(buffers, t)
        env_step = vector.num_env_steps - 1
        if not self.drop:
            index, what = next(iter(problems.items()))
            raise NonFiniteEnvError(
                f"env {index} returned {what} at env step {env_step} "
                f"(step {buffers.episode_step(t, index, episodes)} of its episode); "
                "on_nonfinite='drop_episode' drops such episodes and counts them instead"
            )
        mask = np.zeros(episodes.num_envs, dtype=np.bool_)
        mask[list(problems)] = True
        buffers.dropped[t] |= mask
        buffers.nonfinite_final_envs.clear()
        self.num_nonfinite_env_steps += len(problems)
        obs, infos = self._reset_envs(mask, vector, env_step)
        buffers.obs[t + 1, mask] = obs[mask]
        if buffers.info_rows is not None:
            for index in np.flatnonzero(mask):
                buffers.info_rows[t + 1][index] = unbatch_one(infos, int(index))

    def check_reset(self, obs: np.ndarray, vector: GuardedVectorEnv) -> None:
        """Check the observations of a full reset (in place: envs that need it are reset again).

        Raises:
            NonFiniteEnvError: In ``"raise"`` mode for any non-finite observation, in
                ``"drop_episode"`` mode for one that a second reset does not mend.
        """
        if not self.check_obs or np.isfinite(obs).all():
            return
        mask = ~np.isfinite(obs.reshape(len(obs), -1)).all(axis=1)
        if not self.drop:
            index = int(np.flatnonzero(mask)[0])
            raise NonFiniteEnvError(
                f"env {index} returned {_describe_obs(obs[index])} from reset() at env step {vector.num_env_steps}; "
                "on_nonfinite='drop_episode' resets such envs again and counts them instead"
            )
        self.num_nonfinite_env_steps += int(mask.sum())
        fresh, _ = self._reset_envs(mask, vector, vector.num_env_steps)
        obs[mask] = fresh[mask]

    def _step_problems(self, buffers: RolloutBuffers, t: int) -> dict[int, str]:
        """``{env index: what was not finite}`` for step ``t``, rewards first."""
        problems: dict[int, str] = {}
        rewards = buffers.rewards[t]
        for index in np.flatnonzero(~np.isfinite(rewards)):
            problems[int(index)] = f"{_kind(rewards[index])} reward"
        for index in buffers.nonfinite_final_envs:
            problems.setdefault(index, f"{_describe_obs(buffers.final_obs[t, index])} as its episode's last observation")
        if self.check_obs:
            next_obs = buffers.obs[t + 1]
            for index in np.flatnonzero(~np.isfinite(next_obs.reshape(len(next_obs), -1)).all(axis=1)):
                problems.setdefault(int(index), _describe_obs(next_obs[index]))
        return problems

    def _reset_envs(self, mask: np.ndarray, vector: GuardedVectorEnv, env_step: int) -> tuple[np.ndarray, Any]:
        obs, infos, _ = vector.reset(options={"reset_mask": mask})
        obs = np.asarray(obs)
        if self.check_obs:
            still = mask & ~np.isfinite(obs.reshape(len(obs), -1)).all(axis=1)
            if still.any():
                index = int(np.flatnonzero(still)[0])
                raise NonFiniteEnvError(
                    f"env {index} returned {_describe_obs(obs[index])} at env step {env_step}, and again "
                    "right after a reset: dropping the episode cannot help"
                )
        return obs, infos


def _kind(value: Any) -> str:
    if np.isnan(value):
        return "a NaN"
    return "an inf" if value > 0 else "a -inf"


def _describe_obs(obs: np.ndarray) -> str:
    """``"a NaN observation (element (2,))"``: the first non-finite element of ``obs``."""
    position = tuple(int(k) for k in np.argwhere(~np.isfinite(obs))[0])
    return f"{_kind(obs[position])} observation (element {position})"
