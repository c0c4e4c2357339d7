"""Which RL modules a Learner trains, and adding or removing them while it trains.

``MultiModuleMixin`` is one part of ``Learner``, which inherits it; it holds no state.
``add_module`` and ``remove_module`` change the ``MultiRLModule`` mid-training (e.g. league
play adds frozen opponents), with the optimizers, overrides and metrics that go with a
module; under a running Trainer they hand the new optimizers to it and, under DDP, rebuild
the wrapper (under FSDP2, the sharded unit). ``check_policies_to_train`` checks a
``policies_to_train`` rule (``Learner.should_module_be_updated`` answers it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any, Optional, Union

from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.module_checks import validate_module_id
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.learner.sharding import shard_modules

ShouldModuleBeUpdated = Union[Collection[str], Callable[[str, Optional[MultiModuleBatch]], bool]]


def check_policies_to_train(rule: Any, where: str = "policies_to_train") -> ShouldModuleBeUpdated | None:
    """Return ``rule`` if it is a valid ``policies_to_train``, else raise naming what was wrong.

    Valid: ``None`` (train every module), a callable ``(module_id, batch) -> bool``, or a
    collection of module id strings. A single string is refused: ``"policy_a"`` would be read
    as the collection of its characters, and a checkpoint could turn a name into one.

    Raises:
        ValueError: For a string, or a collection holding anything but strings.
    """
    if rule is None or callable(rule):
        return rule
    if isinstance(rule, str):
        raise ValueError(
            f"{where} must be a list of module ids or a callable (module_id, batch) -> bool, got the string "
            f"{rule!r}; for one module write [{rule!r}]"
        )
    if not isinstance(rule, Collection) or not all(isinstance(module_id, str) for module_id in rule):
        raise ValueError(f"{where} must be a list of module ids (strings) or a callable, got {rule!r}")
    return rule


class MultiModuleMixin:
    """Adding and removing modules (a part of ``Learner``)."""

    def add_module(
        self,
        *,
        module_id: str,
        module_spec: RLModuleSpec,
        config_overrides: dict[str, Any] | None = None,
        new_should_module_be_updated: ShouldModuleBeUpdated | None = None,
    ) -> MultiRLModuleSpec:
        """Add and train a new module (e.g. a league opponent), also while ``Trainer.fit`` runs.

        Its optimizers are registered through ``configure_optimizers_for_module`` (whether or
        not the module has the APIs of ``rl_module_required_apis``, as in RLlib) and, under
        a Trainer, handed to it, so they are stepped and checkpointed from then on. Under
        DDP this is a collective call: every rank adds the module at the same point, and the
        DDP wrapper is rebuilt so that its gradients are averaged too.

        Args:
            module_id: The new module's id.
            module_spec: How to build it (always built for training, not inference only).
            config_overrides: Hyperparameters of this module that differ from the Learner's.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of all modules after adding.
        """
        module = self.built_module
        validate_module_id(module_id)
        if module_id in module:
            raise ValueError(f"module {module_id!r} already exists; remove it first or pick another id")
        overrides = self.check_config_overrides(module_id, config_overrides or {})
        spec = copy.copy(module_spec)
        spec.inference_only = False
        new_module = spec.build().to(self.device)

        module.add_module(module_id, new_module)
        if overrides:
            self.config_overrides_per_module[module_id] = overrides
        if new_should_module_be_updated is not None:
            self.policies_to_train = check_policies_to_train(new_should_module_be_updated, "new_should_module_be_updated")
        # As in RLlib, an added module always gets its optimizers (rl_module_is_compatible
        # decides only for the modules build() starts with).
        self._configure_module_optimizers(module_id)
        self._modules_changed()
        return self.module_spec

    def remove_module(
        self, module_id: str, *, new_should_module_be_updated: ShouldModuleBeUpdated | None = None
    ) -> MultiRLModuleSpec:
        """Remove a module with its optimizers, schedules, overrides and metrics.

        Under DDP this is a collective call, like ``add_module``.

        Args:
            module_id: The module to remove.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of the remaining modules.
        """
        module = self.built_module
        if module_id not in module:
            raise ValueError(f"no module {module_id!r} to remove; modules are {sorted(module.keys())}")
        self.optimizer_registry.remove_module(module_id)
        module.remove_module(module_id)
        self.config_overrides_per_module.pop(module_id, None)
        self._forget_scheduled_values(module_id)
        self.metrics.delete(module_id)
        if new_should_module_be_updated is not None:
            self.policies_to_train = check_policies_to_train(new_should_module_be_updated, "new_should_module_be_updated")
        self._sync_trainer_optimizers()
        self._modules_changed()
        return self.module_spec

    def _modules_changed(self) -> None:
        """After a module was added or removed: compile anew, and build DDP's wrapper, or the FSDP unit, around the modules."""
        self._end_connector_with_time_axis()  # a stateful module added: its rows become sequences
        runner = self.step_runner
        if runner.sharding_mesh is not None:
            shard_modules(self, runner.sharding_mesh)  # compiles the new unit
            return
        runner.compile(self.module)
        runner.rewrap_data_parallel(self)
