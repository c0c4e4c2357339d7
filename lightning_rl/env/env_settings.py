"""``EnvSettings``: how one ``EnvRunner`` builds and steps its envs, declared once and validated once.

The same settings reach an ``EnvRunner`` from three places: a user who builds a runner with
flat keywords, an environment data module (whose flat ``data.init_args`` keys they are), and
the offline data module's evaluation. Each builds one ``EnvSettings``; its ``__post_init__`` is
the one place they are checked, and the object, not the eighteen values, is what travels from
the data module through ``EnvSampling`` to the runner. A runner that needs the same settings
with another env count or seed (the evaluation runner, each rank's seed) takes a ``replace``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from lightning_rl.core.arguments import check_int, check_num_envs, is_int, is_real
from lightning_rl.env.env_factory import (
    EnvCreator,
    VectorizeMode,
    WrapperSpec,
    check_vectorize_mode,
    resolve_env,
    sendable_wrappers,
)
from lightning_rl.env.envpool_vector_env import check_envpool_arguments
from lightning_rl.env.nonfinite import ON_NONFINITE_CHOICES, OnNonFinite
from lightning_rl.env.normalization import check_normalization_arguments


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSettings:
    """Everything an ``EnvRunner`` is built from (see ``EnvRunner`` for what each setting does).

    Args:
        env: A registered env id, the import path of an env factory, or a callable returning a ``gym.Env``.
        env_kwargs: Keyword arguments for the env.
        wrappers: Applied in order to each env copy (classes, callables, import paths or
            ``{"class_path": ..., "init_args": ...}`` dicts).
        num_envs: Env copies stepped together.
        vectorize_mode: ``"sync"``, ``"async"`` or ``"envpool"``.
        rollout_fragment_length: Vector steps per ``EnvRunner.sample`` call.
        seed: Seed of the first reset (env ``i`` gets ``seed + i``); ``None`` leaves the envs randomly seeded.
        episode_stats_window: Completed episodes the return and length statistics cover.
        sample_timeout_s: The most seconds one rollout may take; ``None`` waits forever.
        restart_failed_sub_environments: Rebuild an env that fails instead of raising.
        on_nonfinite: ``"raise"`` or ``"drop_episode"`` for a NaN or infinite value.
        record_video: Build the envs to record an evaluation episode's frames.
        normalize_observations: Normalize observations by their running statistics.
        normalize_rewards: Scale rewards by the running std of the discounted return.
        normalization_clip: The bound on normalized observations and rewards.
        normalization_gamma: The discount of the return whose std scales the rewards.

    Raises:
        ValueError: Naming the setting, for any value out of its range, an unknown env id or
            factory path, an ``env`` that is neither a string nor a callable, or, with
            ``vectorize_mode="envpool"``, what EnvPool cannot build.
        ImportError: For ``vectorize_mode="envpool"`` without envpool installed.
    """

    env: str | EnvCreator
    env_kwargs: dict[str, Any] | None = None
    wrappers: Sequence[WrapperSpec] | None = None
    num_envs: int = 1
    vectorize_mode: VectorizeMode = "sync"
    rollout_fragment_length: int = 200
    seed: int | None = None
    episode_stats_window: int = 100
    sample_timeout_s: float | None = 60.0
    restart_failed_sub_environments: bool = False
    on_nonfinite: OnNonFinite = "raise"
    record_video: bool = False
    normalize_observations: bool = False
    normalize_rewards: bool = False
    normalization_clip: float = 10.0
    normalization_gamma: float = 0.99
    #: What ``env`` names: the env id itself or the factory a path imports (set by the checks).
    env_creator: str | EnvCreator = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_vectorize_mode(self.vectorize_mode)
        if self.vectorize_mode == "envpool":
            # EnvPool's ids are its own (gymnasium's registry need not have them), and what
            # works on gymnasium env objects cannot work there: refused here, by name.
            creator = check_envpool_arguments(
                self.env, self.env_kwargs, self.wrappers, record_video=self.record_video,
                restart_failed_sub_environments=self.restart_failed_sub_environments,
            )  # fmt: skip
        elif isinstance(self.env, str):
            creator = resolve_env(self.env)  # an unknown id or factory path fails here, before anything runs
        elif callable(self.env):
            creator = self.env
        else:
            raise ValueError(f"env must be a gymnasium id or a callable that makes an env, got {self.env!r}")
        object.__setattr__(self, "env_creator", creator)
        if self.wrappers is not None:
            # Picklable, for envs built in other processes (async workers, samplers).
            object.__setattr__(self, "wrappers", sendable_wrappers(self.wrappers))
        check_num_envs("num_envs", self.num_envs)
        for name in ("rollout_fragment_length", "episode_stats_window"):
            check_int(name, getattr(self, name))
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        self._check_fault_settings()
        check_normalization_arguments(
            self.normalize_observations, self.normalize_rewards, self.normalization_clip, self.normalization_gamma
        )

    def _check_fault_settings(self) -> None:
        timeout = self.sample_timeout_s
        if timeout is not None and (not is_real(timeout) or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"sample_timeout_s must be a number of seconds > 0 or None, got {timeout!r}")
        if not isinstance(self.restart_failed_sub_environments, bool):
            raise ValueError(
                f"restart_failed_sub_environments must be True or False, got {self.restart_failed_sub_environments!r}"
            )
        if self.on_nonfinite not in ON_NONFINITE_CHOICES:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE_CHOICES}, got {self.on_nonfinite!r}")

    @property
    def normalizes(self) -> bool:
        """Whether observations or rewards are normalized."""
        return self.normalize_observations or self.normalize_rewards

    def replace(self, **changes: Any) -> EnvSettings:
        """These settings with ``changes`` (``num_envs=4, seed=7``), checked as a new object."""
        return dataclasses.replace(self, **changes)
