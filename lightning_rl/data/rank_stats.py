"""Sampling statistics over data-parallel ranks: one small vector per rank, one ``all_gather``.

Each rank samples envs of its own. After each rollout every rank contributes counts and
sums (never means) of its sampling, all ranks gather every rank's vector, and each folds
them into the same global numbers: lifetime env steps and episodes summed over the ranks,
return statistics over the union of the ranks' windows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.env.env_runner import EnvRunner

NUM_EPISODES_LIFETIME = "num_episodes_lifetime"
# What each rank contributes to the per-rollout all_gather, in this order.
_STATS = (
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES_LIFETIME,
    "num_env_steps_sampled",
    "num_episodes",
    "sample_seconds",
    "window_count",
    "window_return_sum",
    "window_return_min",
    "window_return_max",
    "window_len_sum",
    "num_env_restarts",
    "num_nonfinite_env_steps",
    "sampling_failed",
)
#: Length of a rank's statistics vector (an exchange may append more after it).
NUM_RANK_STATS = len(_STATS)


class SamplingFailedOnAnotherRank(RuntimeError):
    """Raised on every rank whose own rollout went well when another rank's failed.

    The failing rank raises its own error; the others stop too, at the same rollout, instead
    of waiting in the next collective until the process group's timeout.
    """


def local_rank_stats(runner: EnvRunner, metrics: dict[str, float]) -> np.ndarray:
    """This rank's contribution to the cross-rank statistics: counts and sums, never means.

    Args:
        runner: The rank's training runner (its statistics window and lifetime counters).
        metrics: What ``runner.get_metrics()`` returned for the rollout just sampled.

    Returns:
        A float64 vector in the order of ``_STATS``. A rank with no completed episode yet
        contributes count 0 and +inf / -inf as min / max, so it does not turn the global
        statistics into NaN.
    """
    returns, lens = runner.episode_stats_window_values
    return rank_stats_of(returns, lens, metrics)


def rank_stats_of(returns: np.ndarray, lens: np.ndarray, metrics: dict[str, float]) -> np.ndarray:
    """``local_rank_stats`` of samplers that are not one ``EnvRunner`` (``AsyncSamplingDataModule``'s processes).

    Args:
        returns: The returns of the episodes in this rank's statistics window, oldest first.
        lens: Their lengths.
        metrics: The keys of ``EnvRunner.get_metrics`` for this rank's latest rollout.

    Returns:
        The vector ``local_rank_stats`` returns, in the order of ``_STATS``.
    """
    steps = metrics["num_env_steps_sampled"]
    rate = metrics["env_steps_per_sec"]
    seconds = steps / rate if steps > 0 and math.isfinite(rate) and rate > 0 else 0.0
    return np.array(
        [
            metrics[NUM_ENV_STEPS_SAMPLED_LIFETIME],
            metrics[NUM_EPISODES_LIFETIME],
            steps,
            metrics["num_episodes"],
            seconds,
            len(returns),
            returns.sum(),
            returns.min() if len(returns) else math.inf,
            returns.max() if len(returns) else -math.inf,
            lens.sum(),
            metrics["num_env_restarts"],
            metrics["num_nonfinite_env_steps"],
            0.0,
        ],
        dtype=np.float64,
    )


def failed_rank_stats() -> np.ndarray:
    """The contribution of a rank whose rollout raised: all zero, ``sampling_failed`` set."""
    stats = np.zeros(len(_STATS), dtype=np.float64)
    stats[_STATS.index("sampling_failed")] = 1.0
    return stats


def raise_if_a_rank_failed(gathered: np.ndarray) -> None:
    """Raise ``SamplingFailedOnAnotherRank`` naming the ranks whose ``failed_rank_stats`` are in ``gathered``."""
    failed = np.flatnonzero(np.atleast_2d(gathered)[:, _STATS.index("sampling_failed")] > 0).tolist()
    if failed:
        raise SamplingFailedOnAnotherRank(
            f"sampling failed on rank(s) {failed} (their own error says why); this rank stops at the same rollout"
        )


def combine_rank_stats(gathered: np.ndarray) -> dict[str, float]:
    """Fold every rank's ``local_rank_stats`` into the statistics of ``EnvRunner.get_metrics``.

    Counters (the env restarts and non-finite steps too) are summed. Return and length statistics are over the union of the ranks'
    windows (a rank with more completed episodes weighs more; NaN only while no rank has
    one). ``env_steps_per_sec`` is the env steps of all ranks over the longest sampling
    time of a rank (ranks sample at the same time).

    Args:
        gathered: ``[world_size, len(_STATS)]``, one row per rank.

    Returns:
        The keys of ``EnvRunner.get_metrics``, as floats.
    """
    column = {name: gathered[:, index] for index, name in enumerate(_STATS)}
    count = float(column["window_count"].sum())
    nan = float("nan")
    steps = float(column["num_env_steps_sampled"].sum())
    seconds = float(column["sample_seconds"].max())
    return {
        "episode_return_mean": float(column["window_return_sum"].sum()) / count if count else nan,
        "episode_return_min": float(column["window_return_min"].min()) if count else nan,
        "episode_return_max": float(column["window_return_max"].max()) if count else nan,
        "episode_len_mean": float(column["window_len_sum"].sum()) / count if count else nan,
        "num_episodes": float(column["num_episodes"].sum()),
        NUM_EPISODES_LIFETIME: float(column[NUM_EPISODES_LIFETIME].sum()),
        "num_env_steps_sampled": steps,
        NUM_ENV_STEPS_SAMPLED_LIFETIME: float(column[NUM_ENV_STEPS_SAMPLED_LIFETIME].sum()),
        "env_steps_per_sec": steps / seconds if seconds > 0 else nan,
        "num_env_restarts": float(column["num_env_restarts"].sum()),
        "num_nonfinite_env_steps": float(column["num_nonfinite_env_steps"].sum()),
    }


def all_gather_rows(local: np.ndarray, world_size: int, device: torch.device | str) -> np.ndarray:
    """Every rank's ``local`` vector, ``[world_size, len(local)]``, in rank order.

    A collective call on several ranks: every rank must make it the same number of times.

    Args:
        local: This rank's float64 vector.
        world_size: The number of ranks; with 1 no communication happens.
        device: Where the exchange runs: NCCL gathers only device tensors, gloo only CPU ones.

    Raises:
        RuntimeError: If there are several ranks but ``torch.distributed`` is not initialized.
    """
    if world_size == 1:
        return local[None]
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"the Trainer runs {world_size} processes but torch.distributed is not initialized; "
            "the data module needs a torch.distributed strategy (ddp, fsdp, deepspeed) on several ranks"
        )
    # float64 keeps counts exact up to 2**53.
    tensor = torch.from_numpy(local).to(device)
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(gathered, tensor)
    return torch.stack(gathered).cpu().numpy()


def saved_global_counts(state: dict[str, Any]) -> tuple[int, int]:
    """(env steps, episodes) summed over ranks in a saved state; older states held one rank's."""
    runner_state = state.get("train_runner", {})
    env_steps = state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, runner_state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
    episodes = state.get(NUM_EPISODES_LIFETIME, runner_state.get(NUM_EPISODES_LIFETIME, 0))
    return int(env_steps), int(episodes)


def trainer_placement(trainer: Any) -> tuple[int, int]:
    """(global rank, world size) of a data module's Trainer; (0, 1) without one."""
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)
