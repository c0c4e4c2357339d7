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
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


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
