"""What keeps data-parallel (DDP) ranks of a Learner in step.

Under ``Trainer(strategy="ddp")`` every rank runs the same update on its own shard, and DDP
averages gradients inside each backward pass, which is a collective call: every rank must
take the same number of minibatch steps, and each backward pass must reach every parameter,
or some rank waits forever. Three pieces see to that:

- ``agree_with_other_ranks``: before an update, the ranks agree on the modules trained and
  on the number of minibatch steps (one all-reduce);
- ``unused_parameter_anchor``: a zero-valued loss term that touches every parameter;
- ``rewrap_data_parallel``: after a module is added or removed, a new DDP wrapper that
  averages the gradients of the current parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning.pytorch.strategies import Strategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lightning_rl.core.batch import MultiModuleBatch, num_rows
from lightning_rl.learner._lightning_private import wrap_model_for_strategy


def agree_with_other_ranks(
    strategy: Strategy,
    module_ids: Sequence[str],
    batch: MultiModuleBatch,
    *,
    num_epochs: int,
    minibatch_size: int | None,
    device: torch.device,
) -> tuple[set[str], int]:
    """The modules trained on any rank and the largest module batch on any rank (a collective call).

    Every rank then takes the same number of minibatch steps, each with one backward pass
    that reaches every parameter (see ``unused_parameter_anchor``), even when its shard is
    smaller or holds no rows of some module, so no rank waits on another forever.

    Args:
        strategy: The Trainer's strategy; its ``reduce`` is the all-reduce.
        module_ids: All of the Learner's module ids (the same on every rank).
        batch: This rank's prepared batch.
        num_epochs: This rank's passes over its batch.
        minibatch_size: This rank's rows per step.
        device: Where the all-reduced tensor lives (the Learner's device).

    Raises:
        ValueError: On every rank alike, if the ranks were asked for different
            ``num_epochs`` or ``minibatch_size`` (their steps could not match).
    """
    module_ids = sorted(module_ids)
    local = [num_rows(batch[m]) if m in batch else 0 for m in module_ids]
    settings = [num_epochs, minibatch_size or 0]
    # One all_reduce (max) of [rows per module, settings, -settings]: the largest rows,
    # and each setting's largest and smallest value over the ranks.
    packed = torch.tensor(local + settings + [-x for x in settings], dtype=torch.float64, device=device)
    packed = strategy.reduce(packed, reduce_op="max").tolist()
    rows, largest, smallest = packed[: len(local)], packed[len(local) : -2], [-x for x in packed[-2:]]
    if largest != smallest:
        raise ValueError(
            f"the ranks were asked for different update settings (num_epochs from {smallest[0]:.0f} to "
            f"{largest[0]:.0f}, minibatch_size from {smallest[1]:.0f} to {largest[1]:.0f}, 0 meaning None): "
            "every data-parallel rank must take the same number of minibatch steps"
        )
    trained = {module_id for module_id, count in zip(module_ids, rows) if count > 0}
    return trained, int(max(rows, default=0))


def is_wrapped_in_ddp(strategy: Strategy) -> bool:
    """Whether ``strategy`` trains its model through a ``DistributedDataParallel`` wrapper."""
    return isinstance(strategy.model, DistributedDataParallel)


def unused_parameter_anchor(module: nn.Module) -> torch.Tensor:
    """Zero times every trainable parameter of ``module``, to add to the backpropagated loss under DDP.

    DDP averages gradients bucket by bucket as backward reaches their parameters. A
    parameter that no loss on this rank touched (a module without rows on this rank, a
    frozen module, an unused head) would leave its bucket waiting for the other ranks
    forever; a rank with no rows at all would not even run backward. This term gives
    every parameter a gradient on every rank and step, zero where it was unused (also
    under ``find_unused_parameters=True``, which cannot help a rank that has no loss).
    """
    return torch.stack([p.sum() for p in module.parameters() if p.requires_grad]).sum() * 0.0


def rewrap_data_parallel(strategy: Strategy, module: nn.Module) -> None:
    """Under DDP, wrap ``module`` anew, so that DDP averages the gradients of its current parameters.

    DDP fixes the parameters it synchronizes when it is built, and building it is a
    collective call: every rank must add or remove the same module at the same point
    (e.g. in a callback's ``on_train_batch_end``, which every rank runs). Other strategies
    are left as they are.
    """
    if is_wrapped_in_ddp(strategy):
        # The old wrapper's gradient hooks go with it (its reducer removes them when freed).
        strategy.model = None
        strategy.model = wrap_model_for_strategy(strategy, module)
