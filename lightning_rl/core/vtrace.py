"""V-trace (Espeholt et al., 2018, "IMPALA", section 4.1): value targets and policy-gradient
advantages for steps taken by a behaviour policy ``mu`` that lags the Learner's policy ``pi``.

A pure function over time-major sequences, apart from the Learners that use it (as GAE's
kernel is apart from PPO). For the steps ``t = s .. s+n-1`` of one sequence, with
``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and ``c_t = min(c_bar, pi / mu)``::

    delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + sum_t (prod_{i=s}^{t-1} gamma_i * c_i) * delta_t          (paper, eq. 1)
            = V(x_s) + delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))          (its recursion)
    A_s     = rho_pg_s * (r_s + gamma_s * v_{s+1} - V(x_s)),  rho_pg_s = min(rho_pg_bar, pi / mu)

``gamma_t`` is ``gamma`` where the episode goes on after step ``t`` and 0 where it terminated
there. After a sequence's last real step, ``V(x_{t+1})`` and ``v_{t+1}`` are its bootstrap
value: the value of the next observation when the episode was cut (the rollout fragment
ended) or truncated (a time limit), so a cut never reads as an episode end.

With ``pi == mu`` and no clipping (``rho = c = 1``), ``v_s`` is the n-step return
bootstrapped from the sequence's end, and ``A_s`` the one-step TD error of ``v_{s+1}``.

Learners hold steps in one of two layouts, and :func:`vtrace_on_rows` and
:func:`vtrace_on_sequences` bring each to the kernel and back: rows of consecutive steps
(a feed-forward module's minibatch, cut into sequences where episode chunks end) and
zero-padded sequences ``[S, T]`` with ``loss_mask`` (a stateful module's). V-trace is valid
for any cut of an episode into sequences, as long as each is bootstrapped from the value of
the observation after its last step (``values_bootstrapped``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lightning_rl.core.sequences import from_sequences, sequence_layout, to_sequences


class VTraceReturns(NamedTuple):
    """What :func:`vtrace` returns, each ``[T, B]`` like its inputs (zeros where ``loss_mask`` is false).

    Attributes:
        vs: The V-trace value targets ``v_t``.
        pg_advantages: The policy-gradient advantages ``A_t``.
    """

    vs: Tensor
    pg_advantages: Tensor


@torch.no_grad()
def vtrace(
    *,
    target_logp: Tensor,
    behaviour_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_values: Tensor,
    discounts: Tensor,
    loss_mask: Tensor | None = None,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages of a batch of time-major sequences (no gradients).

    Args:
        target_logp: ``[T, B]``, ``log pi(a_t | x_t)`` under the Learner's current policy.
        behaviour_logp: ``[T, B]``, ``log mu(a_t | x_t)`` under the policy that acted.
        rewards: ``[T, B]``.
        values: ``[T, B]``, ``V(x_t)``.
        bootstrap_values: ``[B]``, the value after each sequence's last real step (any
            number where that step terminated its episode: its discount is 0).
        discounts: ``[T, B]``, ``gamma`` where the episode goes on after step ``t``, 0 where it terminated.
        loss_mask: ``[T, B]``, true on real steps, which come first in each sequence (zero
            padding after); ``None`` when all steps are real.
        clip_rho_threshold: ``rho_bar`` (RLlib's ``vtrace_clip_rho_threshold``); ``None`` does not clip.
        clip_pg_rho_threshold: ``rho_pg_bar`` (``vtrace_clip_pg_rho_threshold``); ``None`` does not clip.
        clip_c_threshold: ``c_bar``; ``None`` does not clip.

    Returns:
        ``VTraceReturns(vs, pg_advantages)``.

    Raises:
        ValueError: If the shapes do not match, or ``loss_mask`` is not a prefix per sequence.
    """
    shape = values.shape
    if values.dim() != 2:
        raise ValueError(f"vtrace takes time-major [T, B] tensors; values has shape {tuple(shape)}")
    for name, tensor in (("target_logp", target_logp), ("behaviour_logp", behaviour_logp), ("rewards", rewards),
                         ("discounts", discounts)):  # fmt: skip
        if tensor.shape != shape:
            raise ValueError(f"vtrace: {name} has shape {tuple(tensor.shape)}, values {tuple(shape)}")
    if bootstrap_values.shape != shape[1:]:
        raise ValueError(f"vtrace: bootstrap_values has shape {tuple(bootstrap_values.shape)}, expected ({shape[1]},)")
    mask = torch.ones(shape, dtype=torch.bool, device=values.device) if loss_mask is None else loss_mask.bool()
    if mask.shape != shape:
        raise ValueError(f"vtrace: loss_mask has shape {tuple(mask.shape)}, values {tuple(shape)}")
    if bool((mask[1:] & ~mask[:-1]).any()):
        raise ValueError("vtrace: loss_mask must be true on a prefix of each sequence (real steps first, then padding)")

    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold)
    pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)

    # V(x_{t+1}): the next real step's value, or the bootstrap value after a sequence's last real step.
    is_last = mask & ~torch.cat([mask[1:], torch.zeros_like(mask[:1])])
    next_values = torch.cat([values[1:], torch.zeros_like(values[:1])])
    next_values = torch.where(is_last, bootstrap_values.expand_as(values), next_values)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    deltas = torch.where(mask, clipped_rhos * (rewards + discounts * next_values - values), zero)
    decays = torch.where(mask, discounts * cs, zero)

    # v_t - V(x_t) = delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})), backwards; 0 past the last real step.
    vs_minus_values = torch.zeros_like(values)
    carry = torch.zeros_like(values[0])
    for t in range(shape[0] - 1, -1, -1):
        carry = deltas[t] + decays[t] * carry
        vs_minus_values[t] = carry
    vs = torch.where(mask, values + vs_minus_values, zero)

    next_vs = torch.cat([vs[1:], torch.zeros_like(vs[:1])])
    next_vs = torch.where(is_last, bootstrap_values.expand_as(values), next_vs)
    pg_advantages = torch.where(mask, pg_rhos * (rewards + discounts * next_vs - values), zero)
    return VTraceReturns(vs, pg_advantages)


def vtrace_on_rows(
    *,
    target_logp: Tensor,
    behaviour_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    values_bootstrapped: Tensor,
    discounts: Tensor,
    sequence_ends: Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace over rows of consecutive steps, cut into sequences after every row where ``sequence_ends`` is true.

    The last row always ends a sequence too (a minibatch may stop mid-chunk), and each
    sequence is bootstrapped from ``values_bootstrapped`` at its last row. The rows become
    zero-padded sequences (``sequence_layout``, ``to_sequences``), go through
    :func:`vtrace_on_sequences`, and come back (``from_sequences``).

    Args:
        target_logp, behaviour_logp, rewards, values, discounts: ``[N]``, as :func:`vtrace` takes them per step.
        values_bootstrapped: ``[N]``, ``V(x_{t+1})`` of each row (read at the rows that end a sequence).
        sequence_ends: ``[N]`` bool, true on the last row of each episode chunk (``last_in_chunk``).
        clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold: As for :func:`vtrace`.

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, each ``[N]``.
    """
    if len(values) == 0:  # a data-parallel rank without rows still takes the step
        return VTraceReturns(torch.zeros_like(values), torch.zeros_like(values))
    ends = sequence_ends.bool().clone()
    ends[-1] = True
    end_rows = torch.nonzero(ends).reshape(-1)
    lengths = torch.diff(end_rows, prepend=end_rows.new_tensor([-1]))
    layout = sequence_layout(lengths, int(lengths.max()))
    # Each sequence's last real step is one of end_rows: vtrace_on_sequences bootstraps there.
    returns = vtrace_on_sequences(
        target_logp=to_sequences(target_logp, layout),
        behaviour_logp=to_sequences(behaviour_logp, layout),
        rewards=to_sequences(rewards, layout),
        values=to_sequences(values, layout),
        values_bootstrapped=to_sequences(values_bootstrapped, layout),
        discounts=to_sequences(discounts, layout),
        loss_mask=layout.loss_mask(),
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        clip_c_threshold=clip_c_threshold,
    )
    return VTraceReturns(*(from_sequences(out, layout) for out in returns))


def vtrace_on_sequences(
    *,
    target_logp: Tensor,
    behaviour_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    values_bootstrapped: Tensor,
    discounts: Tensor,
    loss_mask: Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace over zero-padded, batch-major sequences ``[S, T]`` (a stateful module's minibatch).

    Each sequence is bootstrapped from ``values_bootstrapped`` at its last real step.

    Args:
        target_logp, behaviour_logp, rewards, values, discounts: ``[S, T]``, as :func:`vtrace` takes them per step.
        values_bootstrapped: ``[S, T]``, ``V(x_{t+1})`` of each step.
        loss_mask: ``[S, T]`` bool, true on real steps (a prefix of each sequence).
        clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold: As for :func:`vtrace`.

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, each ``[S, T]`` (zeros on padding).
    """
    last_step = (loss_mask.long().sum(dim=1) - 1).clamp(min=0)
    bootstrap_values = values_bootstrapped.gather(1, last_step[:, None]).squeeze(1)
    returns = vtrace(
        target_logp=target_logp.transpose(0, 1),
        behaviour_logp=behaviour_logp.transpose(0, 1),
        rewards=rewards.transpose(0, 1),
        values=values.transpose(0, 1),
        bootstrap_values=bootstrap_values,
        discounts=discounts.transpose(0, 1),
        loss_mask=loss_mask.transpose(0, 1),
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        clip_c_threshold=clip_c_threshold,
    )
    return VTraceReturns(*(out.transpose(0, 1) for out in returns))
