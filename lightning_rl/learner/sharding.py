"""Sharded Learners: FSDP2 through Lightning's ``ModelParallelStrategy``, on CPU ranks or GPUs.

Under ``Trainer(strategy="fsdp2")`` (``FSDP2Strategy``) or a ``ModelParallelStrategy`` with
``tensor_parallel_size=1``, each rank keeps a slice of every parameter and of the optimizer
moments that follow it (``torch.distributed.fsdp.fully_shard``), so a rank holds about
``1 / world_size`` of the weights and optimizer states that DDP would give it. What this
module does for a Learner:

- ``shard_modules``: all modules of the Learner become one FSDP unit (the ``MultiRLModule``),
  whose passes (``forward_train``, ``forward_exploration``, ``forward_inference``) gather the
  whole weights first; the optimizers are built again on the slices, with the weights and
  optimizer states the Learner had. Called by ``configure_model`` and again after a module
  is added or removed (the unit is rebuilt around the new set of modules).
- the unit's ``zero_pass`` and ``reduce_replicated_gradients``: what keeps
  the ranks' collective calls in step within a minibatch step (see
  ``StepRunner.minibatch_step``): every rank gathers the same weights, gives every
  parameter a gradient, and averages the gradients FSDP does not reduce.
- ``FSDP2Strategy``: ``ModelParallelStrategy`` with the sizes a Learner needs and checkpoints
  in the format every other strategy writes, so they load in one process, under DDP or on any
  number of sharded ranks.

Why one unit for all modules rather than one per layer: a loss may read parameters outside
their layer's forward (SAC's actor loss passes through the critics' detached weights; its
temperature ``log_alpha`` is read in the loss), and several modules trained in one step must
gather and reduce in the same order on every rank. One unit's weights stay gathered from its
forward pass until the backward pass has reduced the gradients, which serves both; the
slices of weights, gradients and optimizer states, which is what sharding saves, are the same.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import (
    ModelParallelStrategy,
    Strategy,
    StrategyRegistry,
)
from lightning.pytorch.strategies.parallel import ParallelStrategy
from torch import nn

from lightning_rl.core.rl_module_specs import MultiRLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.core.sharding import (
    is_sharded,
    load_module_state,
    load_optimizer_state,
    module_is_sharded,
    module_state,
    whole_copies,
)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

FSDP2_STRATEGY_NAME = "fsdp2"

# The passes of a MultiRLModule that gather its whole weights before they run; "zero_pass"
# gives every parameter a zero gradient in each minibatch step (see _zero_pass).
SHARDED_FORWARD_METHODS = ("forward_train", "forward_exploration", "forward_inference", "zero_pass")


def is_sharding_strategy(strategy: Strategy | None) -> bool:
    """Whether ``strategy`` shards the Learner's modules (a ``ModelParallelStrategy``, ``FSDP2Strategy`` included)."""
    return isinstance(strategy, ModelParallelStrategy)


def data_parallel_mesh(strategy: ModelParallelStrategy) -> DeviceMesh:
    """The mesh the modules are sharded over: the strategy's data-parallel dimension.

    Raises:
        ValueError: If the strategy also splits tensors (``tensor_parallel_size > 1``), which
            needs a plan per layer that the Learner cannot know.
    """
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() > 1:
        raise ValueError(
            f"ModelParallelStrategy(tensor_parallel_size={mesh['tensor_parallel'].size()}): a Learner shards its "
            "modules over data-parallel ranks only (FSDP2). Use tensor_parallel_size=1, or strategy='fsdp2'."
        )
    return mesh["data_parallel"]


def check_writes_whole_checkpoints(strategy: Strategy, checkpointing: bool) -> None:
    """Refuse Lightning's own ``ModelParallelStrategy`` where it would write a checkpoint of the Learner.

    Its checkpoints hold slices (a folder of shards, or optimizer states keyed its own way),
    which a Learner cannot check, checksum or restore; ``FSDP2Strategy`` shards alike and
    writes whole checkpoints. Training without checkpoints works under either.

    Raises:
        ValueError: Naming ``"fsdp2"`` and ``enable_checkpointing=False``, if ``checkpointing``.
    """
    if checkpointing and is_sharding_strategy(strategy) and not isinstance(strategy, FSDP2Strategy):
        raise ValueError(
            "Lightning's ModelParallelStrategy writes checkpoints of sharded tensors, which a Learner cannot "
            "restore. Use strategy='fsdp2' (lightning_rl.FSDP2Strategy: the same FSDP2 sharding, with whole "
            "checkpoints that load anywhere), or Trainer(enable_checkpointing=False) to train without checkpoints."
        )


def shard_modules(learner: LightningModule, mesh: DeviceMesh) -> None:
    """Make the Learner's modules one FSDP unit over ``mesh`` and rebuild its optimizers on the slices.

    The weights, optimizer states and learning-rate schedulers the Learner had are kept, and
    weights not sharded yet (all at first, a new module's after ``add_module``) are rank 0's
    on every rank, as under DDP. A collective call: every rank makes it at the same point.
    The modules are rebuilt from their spec when they were sharded before, since an FSDP
    unit's parameters are fixed when it is made.

    Args:
        learner: The Learner whose modules to shard.
        mesh: The data-parallel mesh (``data_parallel_mesh``).
    """
    direct = sorted(learner.optimizer_registry.registered_directly)
    if direct:
        raise ValueError(
            f"cannot shard the modules: optimizers {direct} were registered after build(), and sharding builds "
            "every optimizer again on the slices through configure_optimizers_for_module; register them there"
        )
    current = learner.module
    weights = module_state(current)
    _broadcast_unsharded(current, weights, mesh)
    optimizer_states = learner.optimizer_registry.get_state(include_optimizers=True)
    if module_is_sharded(current):
        # Its random initial weights are replaced below: drawing them must not move the global
        # RNG (a seeded fit then samples alike, sharded or not).
        with torch.random.fork_rng(devices=[]):
            module = MultiRLModuleSpec.from_module(current).build().to(learner.device)
        _copy_flags(current, module)
    else:
        module = current
    load_module_state(module, weights)
    _fully_shard(module, mesh)
    learner._set_module(module)
    learner.step_runner.sharding_mesh = mesh
    learner._rebuild_optimizers(optimizer_states)
    # Building optimizers may set weights (SAC sets log_alpha from initial_alpha): keep the Learner's.
    load_module_state(module, weights)


def _copy_flags(source: nn.Module, target: nn.Module) -> None:
    """What a rebuilt module takes over besides its weights: each parameter's ``requires_grad``
    (a frozen encoder stays frozen) and each submodule's train or eval mode."""
    flags = dict(source.named_parameters())
    for name, param in target.named_parameters():
        param.requires_grad_(flags[name].requires_grad)
    modes = {name: submodule.training for name, submodule in source.named_modules()}
    for name, submodule in target.named_modules():
        submodule.training = modes.get(name, submodule.training)


def _broadcast_unsharded(module: nn.Module, weights: dict[str, torch.Tensor], mesh: DeviceMesh) -> None:
    """Replace, in ``weights``, every tensor that ``module`` does not hold sharded with rank 0's (a collective call).

    As DDP's wrapper does when it is built: every rank starts from rank 0's weights, whatever
    seed each rank built its modules with. At the first sharding that is every weight; after
    ``add_module``, the new module's (and the 0-d parameters and buffers, which FSDP leaves
    whole). Without it each rank would keep its own slice of its own initial weights, and the
    whole parameters FSDP leaves unsharded would differ between ranks for good.
    """
    group = mesh.get_group()
    source = dist.get_global_rank(group, 0)
    current = module.state_dict()
    for name, tensor in weights.items():
        if not is_sharded(current[name]):
            dist.broadcast(tensor, src=source, group=group)


def _fully_shard(module: MultiRLModule, mesh: DeviceMesh) -> None:
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    # FSDP cannot shard 0-d parameters (SAC's log_alpha): they stay whole on every rank, and
    # their gradients are averaged like DDP's (reduce_replicated_gradients).
    scalars = {param for param in module.parameters() if param.dim() == 0}
    fully_shard(module, mesh=mesh, ignored_params=scalars or None)
    module.zero_pass = types.MethodType(_zero_pass, module)
    for method in SHARDED_FORWARD_METHODS:
        register_fsdp_forward_method(module, method)


def reduce_replicated_gradients(params: list[nn.Parameter], mesh: DeviceMesh) -> None:
    """Average the gradients of the trainable parameters FSDP left whole over the ranks of ``mesh`` (one all-reduce).

    Every rank passes the same parameters in the same order (the Learner's registered ones):
    the 0-d parameters of the unit and any parameter outside it (e.g. one the Learner owns).
    A parameter no loss reached on this rank gets a zero gradient first, so every rank
    reduces the same tensors.
    """
    whole_params = [param for param in params if not is_sharded(param) and param.requires_grad]
    for param in whole_params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    grads = [param.grad for param in whole_params]
    if not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, group=mesh.get_group())
    flat /= mesh.size()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def _zero_pass(module: nn.Module, zero: torch.Tensor) -> torch.Tensor:
    """The FSDP unit's zero pass: ``zero`` times every trainable parameter, the weights gathered.

    Run in every minibatch step after the train pass (see ``StepRunner.minibatch_step``):
    added to the loss, every parameter gets a gradient, so every rank reduce-scatters the same
    ones; being an output of the unit, it leads the backward pass to that reduction also on a
    rank without rows (for which it is the step's only pass, and gathers the weights).

    Args:
        zero: A 0-d zero tensor. The pass needs an input: on a GPU, FSDP2 moves the root
            module's inputs to the device and reads the first of them, and a pass without
            any fails there (``IndexError`` in ``_root_pre_forward``).
    """
    return torch.stack([param.sum() for param in module.parameters() if param.requires_grad]).sum() * zero


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 for Learners: ``ModelParallelStrategy`` over all ranks, with checkpoints that load anywhere.

    ``Trainer(strategy="fsdp2")`` (registered under that name when ``lightning_rl.learner`` is
    imported) shards every module over all ranks (``data_parallel_size`` = the number of
    processes, ``tensor_parallel_size=1``), on CPU ranks (gloo) as on GPUs (NCCL).

    Checkpoints hold whole weights and optimizer states in the format a single process
    saves (written by rank 0), so a checkpoint of sharded ranks loads into a Learner in one
    process, into ``Policy.from_checkpoint``, and resumes under DDP or on any number of
    sharded ranks; and theirs resume here. Saving gathers one tensor at a time, kept on rank 0's CPU.

    Args:
        process_group_backend: ``"gloo"``, ``"nccl"``, ...; ``None`` picks the device's default.
        timeout: The collective calls' timeout (Lightning's default if not given).
    """

    def __init__(self, process_group_backend: str | None = None, **kwargs: Any) -> None:
        unknown = set(kwargs) - {"timeout"}
        if unknown:
            raise ValueError(
                f"FSDP2Strategy takes process_group_backend and timeout, not {sorted(unknown)}: it shards over all "
                "ranks and writes whole checkpoints; use ModelParallelStrategy for other layouts"
            )
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
            **kwargs,
        )

    def setup_environment(self) -> None:
        # All processes are data-parallel ranks ("auto" would take the number of nodes).
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @property
    def lightning_restore_optimizer(self) -> bool:
        return True

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole weights on rank 0's CPU, ``{}`` elsewhere (a collective call: every rank gathers)."""
        return self._whole_on_rank_zero(self.lightning_module.state_dict())

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The state as one process saves it (whole moments) on rank 0's CPU, ``{}`` elsewhere (a collective call)."""
        return self._whole_on_rank_zero(getattr(optimizer, "_optimizer", optimizer).state_dict())

    def _whole_on_rank_zero(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with whole tensors on rank 0's CPU, gathered one at a time.

        Only rank 0 writes the file: the other ranks drop each tensor as soon as it is
        gathered, and rank 0 moves it to the CPU, so no rank holds the whole state on its device.
        """
        if self.global_rank == 0:
            return whole_copies(state, then=lambda tensor: tensor.cpu())
        whole_copies(state, then=lambda tensor: None)  # every rank takes part in each gather
        return {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        ParallelStrategy.save_checkpoint(self, checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return ParallelStrategy.load_checkpoint(self, checkpoint_path, weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        load_module_state(self.lightning_module, checkpoint["state_dict"], strict=strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            load_optimizer_state(getattr(optimizer, "_optimizer", optimizer), state)


def register_fsdp2_strategy() -> None:
    """Register ``FSDP2Strategy`` as ``"fsdp2"`` in Lightning's strategy registry (once)."""
    if FSDP2_STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            FSDP2_STRATEGY_NAME,
            FSDP2Strategy,
            description="lightning_rl: FSDP2 over all ranks (CPU or GPU), whole checkpoints",
        )
