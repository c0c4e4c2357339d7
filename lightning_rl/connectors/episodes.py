"""The vectorized functions the Learner connector pieces are built from: episodes to
columns (:class:`~lightning_rl.connectors.add_columns.AddColumnsFromEpisodes`), and values,
GAE advantages and value targets (:class:`~lightning_rl.connectors.gae.GeneralAdvantageEstimation`).

A connector runs on the Learner's device, once per update, over all episodes of the update
together: columns are concatenated once and every computation is a tensor operation over
the whole batch (no Python loop per step).

Episodes here are :class:`~lightning_rl.env.episode.SingleAgentEpisode` chunks: ``len(ep)``
steps, ``len(ep) + 1`` observations (the last one is the observation after the last step:
the true final observation of a terminated or truncated episode, or the next observation
of a chunk cut by the rollout length).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from lightning_rl.core.batch import to_tensor
from lightning_rl.core.columns import Columns
from lightning_rl.core.recurrent import unpack_state
from lightning_rl.core.sequences import from_sequences, sequence_layout, to_sequences

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode

# Steps per block of the discounted sums: each block is one [block, block] matmul, so the
# cost stays linear in the episode length while the Python loop runs once per block.
_DISCOUNT_BLOCK = 256


def episodes_to_batch(episodes: Sequence[SingleAgentEpisode], device: torch.device) -> dict[str, Tensor]:
    """Concatenate the steps of ``episodes`` into one batch of columns on ``device``.

    Args:
        episodes: Numpy episodes (or chunks of episodes), each with at least one step.
        device: Where the tensors go.

    Returns:
        ``obs``, ``actions``, ``rewards``, ``terminateds`` and ``truncateds`` (true on the
        last step of an episode that ended so), plus every extra model output recorded
        while sampling (``action_logp``, ``action_dist_inputs``, ...), one row per step.

    Raises:
        ValueError: For an empty list, an episode without steps, or episodes that recorded
            different extra model outputs.
    """
    _check_episodes(episodes)
    lengths = np.array([len(episode) for episode in episodes])
    ends = np.cumsum(lengths) - 1
    terminateds = np.zeros(lengths.sum(), dtype=bool)
    truncateds = np.zeros(lengths.sum(), dtype=bool)
    terminateds[ends] = [episode.is_terminated for episode in episodes]
    truncateds[ends] = [episode.is_truncated for episode in episodes]
    columns = {
        Columns.OBS: np.concatenate([episode.observations[:-1] for episode in episodes]),
        Columns.ACTIONS: np.concatenate([episode.actions for episode in episodes]),
        Columns.REWARDS: np.concatenate([episode.rewards for episode in episodes]).astype(np.float32, copy=False),
        Columns.TERMINATEDS: terminateds,
        Columns.TRUNCATEDS: truncateds,
    }
    for key in episodes[0].extra_model_outputs:
        columns[key] = np.concatenate([episode.extra_model_outputs[key] for episode in episodes])
    return {column: to_tensor(values, device) for column, values in columns.items()}


def last_observations(episodes: Sequence[SingleAgentEpisode], device: torch.device) -> Tensor:
    """The observation after the last step of each episode, stacked: ``[len(episodes), *obs_shape]``."""
    return to_tensor(np.stack([episode.observations[-1] for episode in episodes]), device)


def add_value_targets_and_advantages(
    batch: dict[str, Tensor],
    episodes: Sequence[SingleAgentEpisode],
    compute_values: Callable[[dict[str, Any]], Tensor],
    *,
    gamma: float,
    gae_lambda: float,
    initial_state: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Add ``vf_preds``, ``advantages`` and ``value_targets`` (GAE) to a batch of ``episodes``.

    Values come from one forward pass of ``compute_values`` over every step's observation
    and every episode's last observation (:func:`values_of_chunks`).
    An episode that terminated is worth 0 after its last step; one that was truncated, or
    cut by the rollout length, is bootstrapped from the value of its last observation.

    Args:
        batch: What :func:`episodes_to_batch` returned for ``episodes``; changed in place.
        episodes: The episodes, in the batch's order.
        compute_values: Maps ``{"obs": Tensor[N, ...]}`` to state values ``Tensor[N]``; for a
            stateful module, a batch of sequences to ``Tensor[B, T]``.
        gamma: Discount factor.
        gae_lambda: GAE's lambda (RLlib's ``lambda_``): 0 gives one-step TD, 1 Monte Carlo.
        initial_state: A stateful module's ``get_initial_state()`` (the names and shapes of
            its state); ``None`` or empty for a feed-forward module.

    Returns:
        ``batch``, with the three columns added.
    """
    obs = batch[Columns.OBS]
    values, last_values = values_of_chunks(batch, episodes, compute_values, initial_state)
    terminated = torch.tensor([episode.is_terminated for episode in episodes], device=obs.device)
    last_values = torch.where(terminated, torch.zeros_like(last_values), last_values)
    lengths = torch.tensor([len(episode) for episode in episodes], device=obs.device)

    advantages = generalized_advantages(batch[Columns.REWARDS], values, last_values, lengths, gamma, gae_lambda)
    batch[Columns.VF_PREDS] = values
    batch[Columns.ADVANTAGES] = advantages
    batch[Columns.VALUE_TARGETS] = advantages + values
    return batch


def values_of_chunks(
    batch: Mapping[str, Tensor],
    episodes: Sequence[SingleAgentEpisode],
    compute_values: Callable[[dict[str, Any]], Tensor],
    initial_state: Mapping[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """The values of every step and of each chunk's last observation, in one forward pass without gradients.

    A feed-forward module values every step's observation and every chunk's last
    observation in one batch; a stateful module runs along each chunk from its stored
    state (:func:`values_along_chunks`). Chunks that terminated are not zeroed here: the
    caller decides what a terminal observation is worth.

    Args:
        batch: The chunks' rows (:func:`episodes_to_batch`).
        episodes: The chunks, in the batch's order.
        compute_values: The module's ``compute_values``.
        initial_state: A stateful module's ``get_initial_state()``; ``None`` or empty for a feed-forward module.

    Returns:
        ``values [N]`` and ``last_values [E]`` (float32).
    """
    if initial_state:
        return values_along_chunks(batch, episodes, compute_values, initial_state)
    obs = batch[Columns.OBS]
    all_obs = torch.cat([obs, last_observations(episodes, obs.device).to(obs.dtype)])
    with torch.no_grad():
        all_values = compute_values({Columns.OBS: all_obs}).reshape(-1).float()
    return all_values[: len(obs)], all_values[len(obs) :]


def values_along_chunks(
    batch: Mapping[str, Tensor],
    episodes: Sequence[SingleAgentEpisode],
    compute_values: Callable[[dict[str, Any]], Tensor],
    initial_state: Mapping[str, Tensor],
) -> tuple[Tensor, Tensor]:
    """A stateful module's values of every step and of each chunk's last observation, from the stored states.

    Each chunk's ``L + 1`` observations are one sequence (padded to the longest chunk) that
    starts from the state stored for the chunk's first step, so every value is computed from
    the state the actor had there (and the bootstrap value of a chunk cut by the rollout
    length from the state after its last step). The previous action and reward at position
    ``L`` are the chunk's last action and reward. One forward pass for all chunks.

    Args:
        batch: The chunks' rows (:func:`episodes_to_batch`), with ``state_in`` packed ``[N, S]``
            and ``prev_actions`` / ``prev_rewards`` as :class:`~lightning_rl.core.acting.Acting` records them.
        episodes: The chunks, in the batch's order.
        compute_values: The module's ``compute_values``: sequences in, ``Tensor[E, T]`` out.
        initial_state: The module's ``get_initial_state()``.

    Returns:
        ``values [N]`` and ``last_values [E]`` (float32).

    Raises:
        ValueError: Without the ``state_in`` column.
    """
    check_stored_states(batch, "a stateful module")
    obs, device = batch[Columns.OBS], batch[Columns.OBS].device
    lengths = torch.tensor([len(episode) for episode in episodes], device=device)
    starts = torch.cumsum(lengths, 0) - lengths
    last_rows = starts + lengths - 1
    # Chunk e's steps and its last observation laid end to end: L_e + 1 positions each.
    chunk_of_row = torch.repeat_interleave(torch.arange(len(episodes), device=device), lengths)
    row_position = torch.arange(len(obs), device=device) + chunk_of_row
    last_position = last_rows + 1 + torch.arange(len(episodes), device=device)
    layout = sequence_layout(lengths + 1, int(lengths.max()) + 1)  # one sequence per chunk

    def with_last(rows: Tensor, last: Tensor) -> Tensor:
        extended = rows.new_empty((len(rows) + len(last), *rows.shape[1:]))
        extended[row_position] = rows
        extended[last_position] = last.to(rows.dtype)
        return to_sequences(extended, layout)

    sequences: dict[str, Any] = {
        Columns.OBS: with_last(obs, last_observations(episodes, device)),
        Columns.STATE_IN: unpack_state(batch[Columns.STATE_IN][starts], initial_state),
    }
    if Columns.PREV_ACTIONS in batch:
        sequences[Columns.PREV_ACTIONS] = with_last(batch[Columns.PREV_ACTIONS], batch[Columns.ACTIONS][last_rows])
    if Columns.PREV_REWARDS in batch:
        sequences[Columns.PREV_REWARDS] = with_last(batch[Columns.PREV_REWARDS], batch[Columns.REWARDS][last_rows])
    with torch.no_grad():
        all_values = from_sequences(compute_values(sequences), layout).float()
    return all_values[row_position], all_values[last_position]


def check_stored_states(columns: Mapping[str, Any], owner: str) -> None:
    """Raise unless a stateful module's rows carry the state the actor had at every step.

    Its values and its training sequences start from that state (``state_in``, stored packed
    per step by :class:`~lightning_rl.core.acting.Acting`).

    Args:
        columns: The module's rows, ``{column: Tensor[N, ...]}``.
        owner: Names the module in the message (``"module 'default_policy'"``).
    """
    if Columns.STATE_IN not in columns:
        raise ValueError(
            f"{owner} is stateful, so its episodes must carry the recurrent state the actor had at every step "
            f"(extra_model_outputs[{Columns.STATE_IN!r}], which lightning_rl.core.acting.Acting records), which its "
            f"values and training sequences start from; its rows have {sorted(columns)}"
        )


def generalized_advantages(
    rewards: Tensor, values: Tensor, last_values: Tensor, lengths: Tensor, gamma: float, gae_lambda: float
) -> Tensor:
    """GAE advantages for episodes laid end to end.

    ``A_t = sum_k (gamma * lambda)^k * delta_{t+k}`` within each episode, where
    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` and ``V`` after an episode's last step is
    that episode's ``last_values`` entry.

    Args:
        rewards: ``[N]``, all steps of all episodes, one episode after the other.
        values: ``[N]``, ``V(s_t)`` of every step.
        last_values: ``[E]``, the value after each episode's last step (0 if it terminated).
        lengths: ``[E]``, the number of steps of each episode (all >= 1, summing to ``N``).
        gamma: Discount factor.
        gae_lambda: GAE's lambda.

    Returns:
        ``[N]`` advantages.
    """
    next_values = next_step_values(values, last_values, lengths)
    deltas = rewards + gamma * next_values - values
    return segmented_discounted_sum(deltas, lengths, gamma * gae_lambda)


def next_step_values(values: Tensor, last_values: Tensor, lengths: Tensor) -> Tensor:
    """``V(s_{t+1})`` of every step of episodes laid end to end: the next row's value, or the episode's last value.

    Args:
        values: ``[N]``, ``V(s_t)`` of every step.
        last_values: ``[E]``, the value after each episode's last step.
        lengths: ``[E]``, the number of steps of each episode (all >= 1, summing to ``N``).

    Returns:
        ``[N]``.
    """
    ends = torch.cumsum(lengths, 0) - 1
    next_values = torch.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[ends] = last_values.to(values.dtype)
    return next_values


def segmented_discounted_sum(x: Tensor, lengths: Tensor, discount: float) -> Tensor:
    """``y_t = sum_{k >= t} discount^(k - t) * x_k``, restarting at every segment boundary.

    The segments are laid out as rows of a zero-padded ``[E, max_len]`` matrix; a zero after
    a segment's end adds nothing, so each row is a plain discounted sum (no resets needed).
    """
    num_segments, max_len = len(lengths), int(lengths.max())
    starts = torch.cumsum(lengths, 0) - lengths
    rows = torch.repeat_interleave(torch.arange(num_segments, device=x.device), lengths)
    cols = torch.arange(len(x), device=x.device) - starts[rows]
    padded = torch.zeros(num_segments, max_len, dtype=x.dtype, device=x.device)
    padded[rows, cols] = x
    return _discounted_sum_rows(padded, discount)[rows, cols]


def _discounted_sum_rows(x: Tensor, discount: float) -> Tensor:
    """``y[:, t] = sum_{k >= t} discount^(k - t) * x[:, k]`` for every row of ``x``.

    Works backwards in blocks: within a block it is one matmul with the triangular matrix
    ``M[k, t] = discount^(k - t)`` (k >= t); the sum at the start of the later block is
    carried into the earlier one with ``discount^(block_end - t)``.
    """
    length = x.shape[1]
    out = torch.empty_like(x)
    carry = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    for end in range(length, 0, -_DISCOUNT_BLOCK):
        start = max(0, end - _DISCOUNT_BLOCK)
        size = end - start
        steps = torch.arange(size, device=x.device, dtype=torch.float64)
        exponents = steps[:, None] - steps[None, :]
        weights = torch.where(exponents >= 0, discount ** exponents.clamp(min=0), 0.0).to(x.dtype)
        carry_weights = (discount ** (size - steps)).to(x.dtype)
        block = x[:, start:end] @ weights + carry[:, None] * carry_weights
        out[:, start:end] = block
        carry = block[:, 0]
    return out


def _check_episodes(episodes: Sequence[SingleAgentEpisode]) -> None:
    if len(episodes) == 0:
        raise ValueError("cannot build a train batch from an empty list of episodes")
    for index, episode in enumerate(episodes):
        if len(episode) == 0:
            raise ValueError(f"episode {index} (id {episode.id_}) has no steps; every episode needs at least one")
    keys = set(episodes[0].extra_model_outputs)
    for index, episode in enumerate(episodes[1:], start=1):
        if set(episode.extra_model_outputs) != keys:
            raise ValueError(
                f"episodes recorded different extra model outputs: episode 0 has {sorted(keys)}, "
                f"episode {index} has {sorted(episode.extra_model_outputs)}"
            )
