"""RL modules in one import: the modules, their specs, the MLP helpers and the module checks.

This is the import path the package has always offered (``from lightning_rl.core.rl_module
import RLModule``); the code lives in smaller modules, one idea each:

- :mod:`lightning_rl.core.rl_modules`: :class:`RLModule` and :class:`MultiRLModule`.
- :mod:`lightning_rl.core.rl_module_specs`: :class:`RLModuleSpec`, :class:`MultiRLModuleSpec`
  and :func:`spec_or_default`.
- :mod:`lightning_rl.core.mlp`: MLP builders from a ``model_config`` and observation flattening.
- :mod:`lightning_rl.core.module_checks`: the module-id rule, the state-shape check and
  ``ModelConfigKey`` (the ``model_config`` keys a module accepts).
"""

from lightning_rl.core.mlp import (
    DEFAULT_FCNET_ACTIVATION,
    DEFAULT_FCNET_HIDDENS,
    build_mlp,
    build_mlp_from_config,
    flat_obs_dim,
    flatten_obs,
)
from lightning_rl.core.module_checks import ModelConfigKey, check_state_matches, validate_module_id
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec, spec_or_default
from lightning_rl.core.rl_modules import MultiRLModule, RLModule

__all__ = [
    "DEFAULT_FCNET_ACTIVATION",
    "DEFAULT_FCNET_HIDDENS",
    "ModelConfigKey",
    "MultiRLModule",
    "MultiRLModuleSpec",
    "RLModule",
    "RLModuleSpec",
    "build_mlp",
    "build_mlp_from_config",
    "check_state_matches",
    "flat_obs_dim",
    "flatten_obs",
    "spec_or_default",
    "validate_module_id",
]
