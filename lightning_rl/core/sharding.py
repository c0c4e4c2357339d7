"""Whole tensors out of sharded modules, and shards back in.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) a module's parameters, and the optimizer
moments that follow them, are ``DTensor``\\ s: each rank holds one slice. Everything the
package saves or hands to a user (module weights, optimizer states, checkpoints) is whole
tensors, as a single process would have them, so a sharded Learner's checkpoint loads
anywhere; loading cuts each whole tensor back into this rank's slice.

Gathering a whole tensor is a collective call: every rank of the mesh must ask for the same
tensors in the same order (as the state functions here do, walking ``state_dict`` order).
Nothing is sharded unless ``torch.distributed.tensor`` was imported, so these functions cost
a single-process Learner one dict lookup and never import it themselves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer


def is_sharded(value: Any) -> bool:
    """Whether ``value`` is a ``DTensor`` (a parameter or tensor sharded over ranks)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(value, dtensor.DTensor)


def module_is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP unit (``fully_shard`` was applied to it), gathered or not."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """Within the block, a sharded ``module`` holds its whole weights, for any of its methods to use.

    For work outside the sharded passes, such as the Learner connector's value predictions.
    A collective call when ``module`` is sharded (every rank enters the block); otherwise nothing.
    """
    if not module_is_sharded(module):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``tensor`` as one process holds it: gathered from all ranks if sharded.

    A collective call for a sharded tensor (every rank must call it).
    """
    if is_sharded(tensor):
        return tensor.detach().full_tensor()
    return tensor.detach().clone()


def whole_copies(value: Any, then: Callable[[torch.Tensor], Any] | None = None) -> Any:
    """A copy of ``value`` with every tensor detached, cloned and gathered whole (nested dicts, lists, tuples).

    Args:
        value: What to copy.
        then: Applied to each whole tensor as soon as it is gathered (e.g. moving it to the
            CPU, or dropping it), so the whole tensors need not all be held at once.
    """
    if isinstance(value, torch.Tensor):
        copied = whole(value)
        return copied if then is None else then(copied)
    if isinstance(value, Mapping):
        return {key: whole_copies(item, then) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(whole_copies(item, then) for item in value)
    return value


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` cut into this rank's slice the way ``like`` is sharded; ``full`` itself if ``like`` is not.

    No communication: every rank holds ``full`` and keeps its own slice.
    """
    if not is_sharded(like):
        return full
    from torch.distributed.tensor import distribute_tensor

    full = full.detach().to(device=like.device, dtype=like.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def module_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` as whole, detached copies (a collective call if ``module`` is sharded)."""
    return {name: whole(tensor) for name, tensor in module.state_dict().items()}


def load_module_state(module: nn.Module, state: Mapping[str, torch.Tensor], *, strict: bool = True) -> Any:
    """``module.load_state_dict(state)`` for whole tensors, each cut to this rank's slice where ``module`` is sharded.

    Returns:
        What ``load_state_dict`` returns (missing and unexpected keys).
    """
    current = module.state_dict()
    converted = {
        name: shard_like(tensor, current[name]) if name in current and isinstance(tensor, torch.Tensor) else tensor
        for name, tensor in state.items()
    }
    return module.load_state_dict(converted, strict=strict)


def optimizer_state(optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with whole tensors: the format a single-process optimizer saves.

    A collective call if the optimizer's parameters are sharded.
    """
    return whole_copies(optimizer.state_dict())


def load_optimizer_state(optimizer: Optimizer, state: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(state)`` for a whole state, cut to this rank's slices of sharded parameters.

    A saved tensor shaped like its whole parameter (Adam's moments) is sharded like the
    parameter; scalars (Adam's ``step``) stay as they are.
    """
    params = [param for group in optimizer.param_groups for param in group["params"]]
    saved_ids = [saved_id for group in state.get("param_groups", []) for saved_id in group["params"]]
    param_of = dict(zip(saved_ids, params))
    converted_state = {}
    for saved_id, entry in state.get("state", {}).items():
        param = param_of.get(saved_id)
        converted_state[saved_id] = {
            key: _shard_if_shaped_like(value, param) for key, value in entry.items()
        }
    optimizer.load_state_dict({**state, "state": converted_state})


def _shard_if_shaped_like(value: Any, param: torch.Tensor | None) -> Any:
    if param is None or not isinstance(value, torch.Tensor) or not is_sharded(param):
        return value
    if value.dim() > 0 and value.shape == param.shape:
        return shard_like(value, param)
    return value


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a sharded tensor (in-place changes to it change the tensor); ``tensor`` otherwise."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def whole_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor as a whole, ``[n]``: sharded ones reduced over their ranks in one all-reduce.

    A collective call if any tensor is sharded (every rank passes the same tensors, in the
    same order). Unsharded tensors cost what ``torch._foreach_norm`` costs.
    """
    norms = torch.stack(torch._foreach_norm([local_part(tensor) for tensor in tensors]))
    sharded = [i for i, tensor in enumerate(tensors) if is_sharded(tensor) and _is_split(tensor)]
    if not sharded:
        return norms
    import torch.distributed as dist

    squares = norms[sharded].square()
    dist.all_reduce(squares, group=tensors[sharded[0]].device_mesh.get_group())
    norms = norms.clone()
    norms[sharded] = squares.sqrt()
    return norms


def _is_split(tensor: Any) -> bool:
    """Whether a sharded tensor is split over its ranks (not replicated on each)."""
    return any(placement.is_shard() for placement in tensor.placements)
