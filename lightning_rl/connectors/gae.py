"""Generalized advantage estimation as a Learner connector piece (PPO's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from lightning_rl.connectors.add_columns import module_episodes
from lightning_rl.connectors.episodes import add_value_targets_and_advantages
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.core.columns import Columns

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule

PerModuleSetting = Union[float, Mapping[str, float], Callable[[str], float]]
"""One number for every module, ``{module_id: number}``, or ``module_id -> number``."""


class GeneralAdvantageEstimation(ConnectorPiece):
    """Adds ``vf_preds``, ``advantages`` and ``value_targets`` to every module's rows.

    Values come from the module's ``compute_values`` with its current weights, in one
    forward pass per module over every step and every episode's last observation (a
    stateful module's over each episode chunk as one sequence, from the state stored for
    its first step: ``values_along_chunks``); the
    advantages are GAE over each episode (see
    :func:`~lightning_rl.connectors.episodes.add_value_targets_and_advantages`). Runs after
    :class:`~lightning_rl.connectors.add_columns.AddColumnsFromEpisodes`, whose record of
    which episodes became which module's rows it reads.

    Args:
        gamma: Discount factor in [0, 1]: a number, ``{module_id: number}``, or a callable
            ``module_id -> number`` read at every call (e.g. one returning the Learner's
            per-module config, so overrides and modules added later are honored). A
            LearnerGroup pickles the Learner with its pipeline: pass a bound method or a
            module-level function rather than a lambda.
        gae_lambda: GAE's lambda in [0, 1], given the same ways.
        lambda_: RLlib's name for ``gae_lambda``; pass one of the two.
        standardize_advantages: Whether to leave each module's advantages standardized over
            the update's rows (mean 0, standard deviation 1, the deviation floored at 1e-4), as
            RLlib's piece does, so a loss reading ``batch["advantages"]`` gets what it would
            in RLlib. ``value_targets`` are computed before, from the raw advantages.

    Raises:
        ValueError: For both or neither of ``gae_lambda`` and ``lambda_``.
    """

    def __init__(
        self,
        gamma: PerModuleSetting,
        gae_lambda: PerModuleSetting | None = None,
        *,
        lambda_: PerModuleSetting | None = None,
        standardize_advantages: bool = True,
    ) -> None:
        if (gae_lambda is None) == (lambda_ is None):
            raise ValueError(
                "GeneralAdvantageEstimation takes gae_lambda, or lambda_ (RLlib's name for it): exactly one of them"
            )
        self.gamma = _PerModule("gamma", gamma)
        self.gae_lambda = _PerModule("gae_lambda", gae_lambda if lambda_ is None else lambda_)
        self.standardize_advantages = bool(standardize_advantages)

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any],
        metrics: MetricsLogger,
    ) -> TrainBatch:
        """Add the three columns for every module in ``shared_data[MODULE_EPISODES]``.

        Raises:
            ValueError: If no piece before this one recorded the module episodes.
            TypeError: If a module has no ``compute_values``.
        """
        for module_id, episodes_of_module in module_episodes(shared_data, type(self).__name__).items():
            module = rl_module[module_id]
            add_value_targets_and_advantages(
                batch[module_id],
                episodes_of_module,
                compute_values_of(module, module_id, type(self).__name__),
                gamma=self.gamma.for_module(module_id),
                gae_lambda=self.gae_lambda.for_module(module_id),
                initial_state=module.get_initial_state(),
            )
            if self.standardize_advantages:
                advantages = batch[module_id][Columns.ADVANTAGES]
                std = advantages.std(unbiased=False) if advantages.numel() > 1 else advantages.new_ones(())
                batch[module_id][Columns.ADVANTAGES] = (advantages - advantages.mean()) / std.clamp_min(1e-4)
        return batch

    def __repr__(self) -> str:
        return f"GeneralAdvantageEstimation(gamma={self.gamma!r}, gae_lambda={self.gae_lambda!r})"


def compute_values_of(module: Any, module_id: str, owner: str) -> Callable[[dict[str, Any]], Any]:
    """``module.compute_values``, the state-value function a value-bootstrapping piece needs.

    Args:
        module: One module of the Learner.
        module_id: Named in the error.
        owner: The piece's class name, named in the error.

    Raises:
        TypeError: If the module has no ``compute_values``.
    """
    compute_values = getattr(module, "compute_values", None)
    if not callable(compute_values):
        raise TypeError(
            f"module {module_id!r} ({type(module).__name__}) has no compute_values(batch) -> Tensor[N]; "
            f"{owner} needs a state-value function"
        )
    return compute_values


class _PerModule:
    """A setting in [0, 1] that may differ per module; numbers are checked once, up front."""

    def __init__(self, name: str, setting: PerModuleSetting) -> None:
        self.name = name
        if isinstance(setting, Mapping):
            setting = {mid: self._checked(value, f"{name}[{mid!r}]") for mid, value in setting.items()}
        elif not callable(setting):
            setting = self._checked(setting, name)
        self.setting = setting

    def for_module(self, module_id: str) -> float:
        if isinstance(self.setting, Mapping):
            if module_id not in self.setting:
                raise ValueError(
                    f"GeneralAdvantageEstimation: {self.name} has no value for module {module_id!r}; "
                    f"it has values for {sorted(self.setting)}"
                )
            return self.setting[module_id]
        if callable(self.setting):
            return self._checked(self.setting(module_id), f"{self.name}({module_id!r})")
        return self.setting

    @staticmethod
    def _checked(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"GeneralAdvantageEstimation: {what} must be a number in [0, 1], got {value!r}")
        return float(value)

    def __repr__(self) -> str:
        return getattr(self.setting, "__qualname__", None) or repr(self.setting)
