"""``LearnerConfig``: a Learner's hyperparameters, readable as attributes, with per-module overrides."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class LearnerConfig(dict):
    """A Learner's hyperparameters, readable as attributes (``config.lr``).

    ``learner.config`` also knows the per-module overrides: its
    ``get_config_for_module(module_id)`` (RLlib's name) is ``learner.config_for_module(module_id)``.
    """

    _overrides_per_module: Mapping[str, Mapping[str, Any]] = MappingProxyType({})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r}; the Learner has {sorted(self)}") from None

    def get_config_for_module(self, module_id: str) -> LearnerConfig:
        """These hyperparameters with ``module_id``'s overrides applied."""
        return LearnerConfig({**self, **self._overrides_per_module.get(module_id, {})})
