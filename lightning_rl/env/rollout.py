"""The EnvRunner's step loop: the policy acts on every env at once, the vector env steps.

The vector env runs in gymnasium's ``AutoresetMode.SAME_STEP``: a step that ends an episode
returns the reset observation of the next one at once, and the true final observation in
``infos["final_obs"]``. So every vector step yields ``num_envs`` real transitions (no policy
step is spent on an ignored action, as in ``NEXT_STEP`` mode), and the episodes cut out of
the buffers end with the final observation, not the reset one. No stored transition crosses
an episode boundary.

Acting goes through the runner's :class:`~lightning_rl.core.acting.Acting`, which keeps a
recurrent module's state per env: the loop tells it each step's rewards (the env's own, also
when the episodes store normalized ones, so that a module reading ``prev_rewards`` sees in
training what it sees in evaluation and deployment) and which envs start an episode (after an
autoreset, a dropped episode, or every env rebuilt).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.acting import Acting
from lightning_rl.env.env_errors import SubEnvError
from lightning_rl.env.guarded_vector_env import EnvsRebuilt, GuardedVectorEnv
from lightning_rl.env.nonfinite import NonFiniteCheck
from lightning_rl.env.normalization import EnvNormalization
from lightning_rl.env.rollout_buffers import RolloutBuffers, RunningEpisodes
from lightning_rl.env.vector_infos import unbatch_infos


def run_rollout(
    vector: GuardedVectorEnv,
    acting: Acting,
    episodes: RunningEpisodes,
    num_steps: int,
    *,
    explore: bool,
    nonfinite: NonFiniteCheck,
    stop_after_episodes: int | None = None,
    normalization: EnvNormalization | None = None,
    training: bool = True,
) -> tuple[RolloutBuffers, int]:
    """Step ``vector`` up to ``num_steps`` times with ``acting``'s module, from where ``episodes`` stand.

    Args:
        vector: The runner's vector env (``AutoresetMode.SAME_STEP``; observations come out of
            it in the stored layout, ``vector.layout``).
        acting: The policy, one row per env; its forward pass runs on the module's device
            under ``torch.inference_mode``. Its rows' recurrent state must stand where
            ``episodes`` do (a stateful module's state carries over between calls).
        episodes: The running episodes; their observation is the first step's input.
            Only ``record_infos`` changes here, and the ids of episodes dropped before
            their first step in this call (see :func:`cut_episodes` for the rest).
        num_steps: The most vector steps to take.
        explore: ``forward_exploration`` and sampled actions, else ``forward_inference``
            and the most likely actions.
        nonfinite: Checks each step's rewards and observations.
        stop_after_episodes: Stop after the step in which this many episodes have ended.
        normalization: Normalizes each step's observations (and rewards) in the buffers,
            after the NaN check; ``episodes`` already hold normalized observations.
        training: Whether this is a training rollout (the normalization statistics are
            updated and rewards normalized) rather than evaluation.

    Returns:
        The buffers (episodes of rebuilt envs and of NaN values marked ``dropped``) and how
        many vector steps were taken.

    Raises:
        ValueError: If the forward pass returns neither ``actions`` nor
            ``action_dist_inputs``, or actions without a leading batch dimension of
            ``num_envs``.
        EnvFaultError: As ``GuardedVectorEnv.step`` and ``NonFiniteCheck.handle_step``; a
            ``SubEnvError`` if a worker fails again on the first step after a rebuild.
    """
    observation_space = vector.layout.stored_space
    action_space = vector.env.single_action_space
    clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None
    normalizes_obs = normalization is not None and normalization.observations is not None
    obs_dtype = np.float32 if normalizes_obs else None
    buffers = RolloutBuffers.allocate(num_steps, observation_space, episodes, obs_dtype)
    param = next(acting.module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    on_cpu = device.type == "cpu"
    episodes_ended = 0
    t = 0
    rebuilt_at = -1
    with torch.inference_mode():
        while t < num_steps:
            out, actions = _act(acting, vector, buffers.obs[t], device, explore=explore)
            action_np = buffers.write_outputs(t, out, actions, on_cpu)
            if clip is not None:
                action_np = np.clip(action_np, *clip)
            try:
                num_ended = _take_step(vector, buffers, t, action_np, episodes, nonfinite)
            except EnvsRebuilt as rebuilt:
                _start_over(buffers, t, episodes, rebuilt, vector, nonfinite, again=rebuilt_at == t)
                acting.start_episodes(None)
                if normalization is not None:
                    buffers.obs[t] = normalization.on_reset(buffers.obs[t], training=training)
                rebuilt_at = t
                continue  # step t again, from the rebuilt envs' first observations
            if normalization is not None:
                normalization.on_step(buffers, t, training=training)
            if acting.stateful:
                _observe_step(acting, buffers, t)
            t += 1
            if stop_after_episodes is not None and num_ended:
                episodes_ended += num_ended
                if episodes_ended >= stop_after_episodes:
                    return buffers, t
    return buffers, num_steps


def _act(
    acting: Acting, vector: GuardedVectorEnv, rows: np.ndarray, device: torch.device, *, explore: bool
) -> tuple[dict, torch.Tensor]:
    """The module's outputs and actions for one vector step's stored observation rows.

    The rows of an action-mask Dict hold the mask beside the observation (so episodes and
    replay keep both): the module gets them apart, as the ``obs`` and ``action_mask`` columns.
    """
    mask = None
    if vector.layout.masked:
        rows, mask_np = vector.layout.split_masked_batch(rows)
        mask = torch.from_numpy(mask_np).to(device)
    obs = torch.from_numpy(np.ascontiguousarray(rows)).to(device)
    return acting.act(obs, explore=explore, action_mask=mask)


def _observe_step(acting: Acting, buffers: RolloutBuffers, t: int) -> None:
    # The env's own rewards (not normalized ones): what evaluation and a deployed Policy see
    # too, so a module that reads prev_rewards gets the same inputs in training and after.
    # Then the envs whose next observation starts an episode: SAME_STEP autoreset put the new
    # episode's reset observation in obs[t + 1] already.
    acting.observe_rewards(buffers.rewards[t] if buffers.raw_rewards is None else buffers.raw_rewards[t])
    starts = np.flatnonzero(buffers.terminateds[t] | buffers.truncateds[t] | buffers.dropped[t])
    if len(starts):
        acting.start_episodes(starts)


def _take_step(
    vector: GuardedVectorEnv,
    buffers: RolloutBuffers,
    t: int,
    actions: np.ndarray,
    episodes: RunningEpisodes,
    nonfinite: NonFiniteCheck,
) -> int:
    """Step the envs with step ``t``'s actions and store the result; return how many episodes ended."""
    step, restarted = vector.step(actions)
    num_ended = buffers.write_env_step(t, step, episodes, buffers.obs.dtype)
    if restarted is not None:
        # A rebuilt env's step is not a transition: its episode is dropped (one that ended on
        # this step, before its env failed to reset, is kept).
        buffers.dropped[t] |= restarted & ~(buffers.terminateds[t] | buffers.truncateds[t])
    if not nonfinite.step_is_finite(buffers, t):
        nonfinite.handle_step(buffers, t, episodes, vector)
    return num_ended


def _start_over(
    buffers: RolloutBuffers,
    t: int,
    episodes: RunningEpisodes,
    rebuilt: EnvsRebuilt,
    vector: GuardedVectorEnv,
    nonfinite: NonFiniteCheck,
    *,
    again: bool,
) -> None:
    # Every env was rebuilt before step t: the episodes running then are dropped, and new
    # ones start at step t from the rebuilt envs' reset observations.
    if again:
        raise SubEnvError(
            f"an async env worker failed again on the first step after every env was rebuilt "
            f"(step {t} of this rollout); not rebuilding them again"
        ) from rebuilt
    if t == 0:
        for index in range(episodes.num_envs):
            episodes.start_new(index)
    else:
        buffers.dropped[t - 1] |= ~(buffers.terminateds[t - 1] | buffers.truncateds[t - 1])
    obs = np.array(rebuilt.obs, dtype=buffers.obs.dtype)
    nonfinite.check_reset(obs, vector)
    buffers.obs[t] = obs
    if buffers.info_rows is not None:
        buffers.info_rows[t] = unbatch_infos(rebuilt.infos, episodes.num_envs)

