"""The EnvRunner's step loop: the policy acts on every env at once, the vector env steps.

The vector env runs in gymnasium's ``AutoresetMode.SAME_STEP``: a step that ends an episode
returns the reset observation of the next one at once, and the true final observation in
``infos["final_obs"]``. So every vector step yields ``num_envs`` real transitions (no policy
step is spent on an ignored action, as in ``NEXT_STEP`` mode), and the episodes cut out of
the buffers end with the final observation, not the reset one. No stored transition crosses
an episode boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.columns import Columns
from lightning_rl.core.distributions import Distribution
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.rollout_buffers import RolloutBuffers, RunningEpisodes


def run_rollout(
    vector_env: gym.vector.VectorEnv,
    module: RLModule,
    episodes: RunningEpisodes,
    num_steps: int,
    *,
    explore: bool,
    stop_after_episodes: int | None = None,
) -> tuple[RolloutBuffers, int]:
    """Step ``vector_env`` up to ``num_steps`` times with ``module``, from where ``episodes`` stand.

    Args:
        vector_env: A vector env in ``AutoresetMode.SAME_STEP`` with array spaces.
        module: The policy; its forward pass runs on the module's device under
            ``torch.inference_mode``.
        episodes: The running episodes; their observation is the first step's input.
            Only ``record_infos`` changes here (see :func:`cut_episodes` for the rest).
        num_steps: The most vector steps to take.
        explore: ``forward_exploration`` and sampled actions, else ``forward_inference``
            and the most likely actions.
        stop_after_episodes: Stop after the step in which this many episodes have ended.

    Returns:
        The buffers and how many vector steps were taken.

    Raises:
        ValueError: If the forward pass returns neither ``actions`` nor
            ``action_dist_inputs``, or actions without a leading batch dimension of
            ``num_envs``.
    """
    observation_space = vector_env.single_observation_space
    action_space = vector_env.single_action_space
    clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None
    buffers = RolloutBuffers.allocate(num_steps, observation_space, episodes)
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    on_cpu = device.type == "cpu"
    forward = module.forward_exploration if explore else module.forward_inference
    dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
    env_step = vector_env.step
    episodes_ended = 0
    with torch.inference_mode():
        for t in range(num_steps):
            obs_t = torch.from_numpy(buffers.obs[t])
            if not on_cpu:
                obs_t = obs_t.to(device)
            out, actions = _act(module, forward, dist_cls, obs_t, explore)
            action_np = buffers.write_outputs(t, out, actions, on_cpu)
            if clip is not None:
                action_np = np.clip(action_np, *clip)
            num_ended = buffers.write_env_step(t, env_step(action_np), episodes, observation_space.dtype)
            if stop_after_episodes is not None and num_ended:
                episodes_ended += num_ended
                if episodes_ended >= stop_after_episodes:
                    return buffers, t + 1
    return buffers, num_steps


def _act(
    module: RLModule,
    forward: Callable[[dict[str, Any]], Mapping[str, Any]],
    dist_cls: type[Distribution],
    obs: torch.Tensor,
    explore: bool,
) -> tuple[Mapping[str, Any], torch.Tensor]:
    # The module's own actions are used as they are; otherwise they come from its action
    # distribution, whose log-probability is stored beside them.
    out = forward({Columns.OBS: obs})
    actions = out.get(Columns.ACTIONS)
    if actions is not None:
        return out, actions
    if Columns.ACTION_DIST_INPUTS not in out:
        raise ValueError(
            f"{type(module).__name__}'s forward pass returned neither "
            f"{Columns.ACTIONS!r} nor {Columns.ACTION_DIST_INPUTS!r}; got {sorted(out)}"
        )
    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    actions = dist.sample() if explore else dist.deterministic_sample()
    out = dict(out)
    out[Columns.ACTION_LOGP] = dist.logp(actions)
    return out, actions
