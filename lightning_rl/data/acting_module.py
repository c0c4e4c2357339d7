"""The Learner's module that acts in an environment, as every data module borrows it.

A data module never imports the Learner (layers: ``learner | data``): it reaches it through
the attached Trainer (``trainer.lightning_module``) and asks only for what it needs here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lightning_rl.core.rl_modules import MultiRLModule, RLModule


@contextlib.contextmanager
def learner_acting_module(trainer: Any, module_id: str) -> Iterator[RLModule]:
    """The Trainer's Learner's module ``module_id``, ready to act, for the length of the block.

    Through ``Learner.module_for_acting``: with sharded modules (FSDP2) their whole weights
    are gathered for the block, a collective call that every rank must make at the same point.

    Args:
        trainer: The Trainer the data module is attached to.
        module_id: The data module's ``module_id``.

    Raises:
        ValueError: If the Learner is not built or has no module ``module_id``.
    """
    learner = trainer.lightning_module
    check_learner_has_module(learner, module_id, "to act with")
    with learner.module_for_acting(module_id) as module:
        yield module


@contextlib.contextmanager
def learner_acting_modules(trainer: Any) -> Iterator[MultiRLModule]:
    """All of the Trainer's Learner's modules, ready to act, for the length of the block (multi-agent sampling).

    Through ``Learner.module_for_acting()`` (no module id): with sharded modules (FSDP2) their
    whole weights are gathered for the block, a collective call that every rank makes at the
    same point.

    Raises:
        ValueError: If the Learner is not built.
    """
    learner = trainer.lightning_module
    if learner.module is None:
        raise ValueError(f"{type(learner).__name__} is not built; the data module needs its modules to act with")
    with learner.module_for_acting() as modules:
        yield modules


def check_learner_has_module(learner: Any, module_id: str, purpose: str) -> None:
    """Raise unless ``learner`` is built and has the module ``module_id``.

    Args:
        learner: The Trainer's Learner.
        module_id: The data module's ``module_id``.
        purpose: What the data module wants the module for, for the error ("to act with").

    Raises:
        ValueError: Naming the Learner, the module id and the modules it has.
    """
    if learner.module is None:
        raise ValueError(f"{type(learner).__name__} is not built; the data module needs its module {purpose}")
    if module_id not in learner.module:
        raise ValueError(
            f"{type(learner).__name__} has no module {module_id!r} {purpose} (module_id of the data module); it has "
            f"{sorted(learner.module.keys())}"
        )
