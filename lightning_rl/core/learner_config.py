"""``LearnerConfig``: a Learner's hyperparameters, readable as attributes, with per-module overrides."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

RLLIB_ALIASES: Mapping[str, str] = MappingProxyType({"lambda_": "gae_lambda"})
"""RLlib's config names that read one of ours under another name (``config.lambda_`` is ``gae_lambda``)."""

RLLIB_NAMES_HERE: Mapping[str, str] = MappingProxyType(
    {
        "add_default_connectors_to_learner_pipeline": (
            " (RLlib's AlgorithmConfig flag): override build_learner_connector and build the pipeline you want"
        ),
        "_torch_lr_scheduler_classes": (
            " (RLlib's AlgorithmConfig setting): pass a torch LRScheduler to register_optimizer(lr_or_lr_schedule=...) "
            "in configure_optimizers_for_module"
        ),
        "lambda_": " (RLlib's name for GAE's lambda): this Learner has no gae_lambda",
    }
)
"""Why an RLlib ``AlgorithmConfig`` name is not a hyperparameter here, and what to use; added to the error."""


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
            pass
        alias = RLLIB_ALIASES.get(name)
        if alias is not None and alias in self:
            return self[alias]
        hint = RLLIB_NAMES_HERE.get(name, "")
        raise AttributeError(f"no hyperparameter {name!r}{hint}; the Learner has {sorted(self)}")

    def get_config_for_module(self, module_id: str) -> LearnerConfig:
        """These hyperparameters with ``module_id``'s overrides applied."""
        return LearnerConfig({**self, **self._overrides_per_module.get(module_id, {})})
