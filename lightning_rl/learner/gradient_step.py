"""One gradient step of a Learner: losses, backward pass, clipping, optimizer steps.

``GradientStepMixin`` holds RLlib's gradient hooks in the order ``_minibatch_step`` calls
them on every minibatch: ``compute_losses`` (which calls ``compute_loss_for_module`` per
module), ``compute_gradients``, ``postprocess_gradients`` (``postprocess_gradients_for_module``
per module: clipping) and ``apply_gradients``. A Learner subclass overrides any of them.

An optimizer whose gradients are not finite skips its step; ``NonFiniteSteps`` counts such
skips in a row, and ``_minibatch_step`` stops training with a ``FloatingPointError`` once an
optimizer has skipped ``max_consecutive_non_finite_steps`` steps in a row.

The mixin is one part of ``Learner``, which inherits it: it uses the Learner's modules,
optimizer registry (``learner/optimizers.py``), metrics and Trainer plumbing. Its code is
the per-step hot path, so it reads the registry's tables directly and builds no more dicts
than each hook returns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from lightning_rl.core.batch import MultiModuleBatch, num_rows
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.learner._lightning_private import step_without_dispatch
from lightning_rl.learner.data_parallel import is_wrapped_in_ddp, unused_parameter_anchor
from lightning_rl.learner.optimizers import clip_gradients
from lightning_rl.learner.result_keys import NUM_NON_FINITE_UPDATES_SKIPPED, TOTAL_LOSS_KEY
from lightning_rl.learner.sharding import reduce_replicated_gradients

if TYPE_CHECKING:
    from lightning_rl.learner.learner import LearnerConfig


@dataclasses.dataclass
class NonFiniteSteps:
    """Optimizer steps skipped for non-finite gradients: the Learner's running count, not its state.

    ``apply_gradients`` fills it and ``_minibatch_step`` reads it. The counts live for one
    run and are not saved with the Learner: a skipped step leaves the weights as they were,
    so a checkpoint holds finite weights, and a run resumed from it (often with a lower
    learning rate or cleaner data) starts counting afresh.

    Attributes:
        in_a_row: Steps each optimizer skipped since it last stepped (optimizers with none are absent).
        all_skipped: Whether every optimizer the last minibatch step tried to step was skipped.
        over_limit: ``(module_id, optimizer, in_a_row)`` for each optimizer that reached its
            module's ``max_consecutive_non_finite_steps`` in the last minibatch step.
    """

    in_a_row: dict[Optimizer, int] = dataclasses.field(default_factory=dict)
    all_skipped: bool = False
    over_limit: list[tuple[str, Optimizer, int]] = dataclasses.field(default_factory=list)


class GradientStepMixin:
    """The Learner's gradient hooks and its one-minibatch step (a part of ``Learner``)."""

    def compute_losses(self, *, fwd_out: dict[str, Any], batch: MultiModuleBatch) -> dict[str, torch.Tensor]:
        """The loss of every module in ``fwd_out``; override for losses that span modules.

        Returns:
            ``{module_id: scalar loss}``; an ``ALL_MODULES`` entry, if present, is the loss
            that is backpropagated, otherwise the sum of the module losses is.
        """
        return {
            module_id: self.compute_loss_for_module(
                module_id=module_id,
                config=self.config_for_module(module_id),
                batch=batch[module_id],
                fwd_out=module_fwd_out,
            )
            for module_id, module_fwd_out in fwd_out.items()
        }

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, torch.Tensor], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """The scalar loss of one module on one minibatch. Subclasses implement it.

        Log extra values with ``self.metrics.log_value((module_id, "name"), tensor, window=math.inf,
        clear_on_reduce=True)`` (the mean over the update; the default is RLlib's EMA).

        Args:
            module_id: The module.
            config: Its hyperparameters.
            batch: Its minibatch, ``{column: Tensor[B, ...]}``.
            fwd_out: The output of its ``forward_train`` on ``batch``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss_for_module (or compute_losses)")

    def compute_gradients(self, loss_per_module: Mapping[str, torch.Tensor], **kwargs: Any) -> dict[Any, torch.Tensor]:
        """Backpropagate the total loss; return ``{param_ref: gradient}``.

        The registered parameters' gradients are reset first. Under a running Trainer this
        backpropagates with ``manual_backward`` (plain ``backward()`` when nothing listens to
        Lightning's per-step hooks: ``_lightning_private.step_hooks_have_listeners``); under
        DDP the loss also touches every parameter (``data_parallel.unused_parameter_anchor``),
        so no rank's backward waits. With sharded modules (FSDP2) it adds the anchor of this
        step's sharded pass (``_sharded_forward_train``) instead, and afterwards averages the
        gradients of the parameters FSDP left whole (``sharding.reduce_replicated_gradients``).
        """
        registry = self._optimizer_registry
        registry.clear_grads()
        total = loss_per_module.get(ALL_MODULES)
        if total is None and loss_per_module:
            total = _sum(loss_per_module.values())
        trainer = self._running_trainer()
        anchor = None
        if self._sharding_mesh is not None:
            anchor, self._step_anchor = self._step_anchor, None
        elif trainer is not None and is_wrapped_in_ddp(trainer.strategy):
            anchor = unused_parameter_anchor(self)
        if anchor is not None:
            total = anchor if total is None else total + anchor
        if isinstance(total, torch.Tensor) and total.requires_grad:
            # Lightning's manual_backward adds only its hooks' dispatch when no one listens to them.
            self.manual_backward(total) if trainer is not None and self._dispatch_step_hooks else total.backward()
        if self._sharding_mesh is not None:
            reduce_replicated_gradients(list(registry.params.values()), self._sharding_mesh)
        return {ref: param.grad for ref, param in registry.params.items() if param.grad is not None}

    def postprocess_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Post-process (clip) the gradients of every module's optimizers.

        Calls ``postprocess_gradients_for_module`` with each module's gradients; gradients
        of no registered optimizer pass unchanged.
        """
        processed = dict(gradients_dict)
        for module_id in self._optimizer_registry.by_module:
            module_gradients = {}
            for _, optimizer in self.get_optimizers_for_module(module_id):
                module_gradients.update(self.filter_param_dict_for_optimizer(gradients_dict, optimizer))
            processed.update(
                self.postprocess_gradients_for_module(
                    module_id=module_id,
                    config=self.config_for_module(module_id),
                    module_gradients_dict=module_gradients,
                )
            )
        return processed

    def postprocess_gradients_for_module(
        self, *, module_id: str, config: LearnerConfig, module_gradients_dict: dict[Any, torch.Tensor]
    ) -> dict[Any, torch.Tensor]:
        """Clip one module's gradients, optimizer by optimizer, and log their global norms.

        Each optimizer clips at its own threshold when it was registered with one, else at
        the module's ``grad_clip``.

        The norm logged as ``gradients_{optimizer_name}_global_norm`` is taken before clipping.
        """
        registry = self._optimizer_registry
        for optimizer_name, optimizer in self.get_optimizers_for_module(module_id):
            gradients = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            if not gradients:
                continue
            grad_clip = registry.grad_clip.get(optimizer, config.grad_clip)
            global_norm = clip_gradients(gradients, grad_clip=grad_clip, grad_clip_by=config.grad_clip_by)
            key = (module_id, f"gradients_{optimizer_name}_global_norm")
            self.metrics.log_value(key, global_norm, window=math.inf, clear_on_reduce=True)
            registry.measured_norms[optimizer] = global_norm
        return module_gradients_dict

    def apply_gradients(self, gradients_dict: Mapping[Any, torch.Tensor]) -> None:
        """Step the optimizers of every module that should be updated, with these gradients.

        An optimizer whose gradients hold a NaN or infinity (before any clipping) does not
        step (counted in the results as ``num_non_finite_updates_skipped``), so one bad batch
        cannot poison the weights or the optimizer's moments; the steps it skips in a row are
        counted towards ``max_consecutive_non_finite_steps``. Under DDP the gradients are
        averaged over the ranks before this runs, so every rank steps or skips alike. A module
        that no rank has rows of in this update does not step: its gradients are zeros.
        """
        in_update = self._modules_in_update
        module_ids = []
        for module_id in self._optimizer_registry.by_module:
            if module_id != ALL_MODULES and not self.should_module_be_updated(module_id):
                continue
            if module_id != ALL_MODULES and in_update is not None and module_id not in in_update:
                continue  # its gradients are zeros from other ranks' steps, not its own data
            module_ids.append(module_id)
        to_step, norms = self._optimizer_registry.attach_gradients(gradients_dict, module_ids)
        if not to_step:
            return
        under_trainer = self._is_running_under_trainer()
        any_stepped = False
        # One device sync for all optimizers; the check itself is cheaper on Python floats.
        for (module_id, optimizer), norm in zip(to_step, torch.stack(norms).tolist()):
            if math.isfinite(norm):
                self._step(optimizer, under_trainer)
                self._non_finite_steps.in_a_row.pop(optimizer, None)
                any_stepped = True
            else:
                self._skip_non_finite_step(module_id, optimizer)
        self._non_finite_steps.all_skipped = not any_stepped

    def _skip_non_finite_step(self, module_id: str, optimizer: Optimizer) -> None:
        """Count a skipped step of ``optimizer``; note it if its module's limit of skips in a row is reached."""
        self.metrics.log_value((module_id, NUM_NON_FINITE_UPDATES_SKIPPED), 1, reduce="sum", clear_on_reduce=True)
        counts = self._non_finite_steps
        in_a_row = counts.in_a_row[optimizer] = counts.in_a_row.get(optimizer, 0) + 1
        limit = self.config_for_module(module_id).max_consecutive_non_finite_steps
        if limit is not None and in_a_row >= limit:
            counts.over_limit.append((module_id, optimizer, in_a_row))

    def _step(self, optimizer: Optimizer, under_trainer: bool) -> None:
        if under_trainer:
            # Lightning's wrapper runs the strategy's and precision plugin's step logic and counts the step.
            if optimizer not in self._optimizer_wrappers:  # apply_gradients called outside an update
                self._attach_trainer_step()
            wrapper = self._optimizer_wrappers[optimizer]
            wrapper.step() if self._dispatch_step_hooks else step_without_dispatch(wrapper)
        else:
            optimizer.step()

    def _minibatch_step(self, minibatch: MultiModuleBatch) -> bool:
        """One gradient step: forward, losses, backward, clip, optimizer steps, loss logging.

        Returns:
            Whether it changed any weights: ``False`` when every optimizer it was to step
            skipped its step for non-finite gradients.

        Raises:
            FloatingPointError: When an optimizer has now skipped its module's
                ``max_consecutive_non_finite_steps`` steps in a row.
        """
        if self._sharding_mesh is not None:
            fwd_out, self._step_anchor = self._sharded_forward_train(minibatch)
        else:
            # A data-parallel rank without rows in this step still backpropagates (zeros), in step with the others.
            fwd_out = self._forward_train_fn(minibatch) if minibatch else {}
        loss_per_module = dict(self.compute_losses(fwd_out=fwd_out, batch=minibatch))
        if ALL_MODULES not in loss_per_module and loss_per_module:
            loss_per_module[ALL_MODULES] = _sum(loss_per_module.values())
        gradients = self.compute_gradients(loss_per_module)
        gradients = self.postprocess_gradients(gradients)
        # An apply_gradients override that does not call super() leaves every step counted as a change.
        self._non_finite_steps.all_skipped = False
        self.apply_gradients(gradients)
        for module_id, loss in loss_per_module.items():
            self.metrics.log_value((module_id, TOTAL_LOSS_KEY), loss, window=math.inf, clear_on_reduce=True)
        if self._non_finite_steps.over_limit:
            raise FloatingPointError(self._too_many_non_finite_steps_message(loss_per_module))
        return not self._non_finite_steps.all_skipped

    def _sharded_forward_train(self, minibatch: MultiModuleBatch) -> tuple[dict[str, Any], torch.Tensor]:
        """The train pass of sharded modules, and the anchor that keeps every rank's collectives in step.

        All modules are one FSDP unit, so any pass of it gathers the same weights: the modules
        this rank has rows of run (none, on a rank without rows). Then the unit's zero pass
        (gathering nothing more where the weights are gathered already) returns zero times
        every parameter: added to the loss, it gives every parameter a gradient, so every rank
        reduces the same ones, and as an output of the unit it starts FSDP's reduction after
        the backward pass on every rank, whatever the loss made of the other outputs.

        Returns:
            The outputs (what ``compute_losses`` gets) and the anchor to add to the
            backpropagated loss.
        """
        has_rows = any(num_rows(batch) > 0 for batch in minibatch.values())
        fwd_out = self._forward_train_fn(minibatch) if has_rows else {}
        return fwd_out, self._module.zero_pass()

    def _too_many_non_finite_steps_message(self, loss_per_module: Mapping[str, torch.Tensor]) -> str:
        """What stopped training: which optimizers skipped how many steps, and whether their loss was finite."""
        over_limit, self._non_finite_steps.over_limit = self._non_finite_steps.over_limit, []
        where = " on this rank" if self._is_data_parallel() else ""
        lines = []
        for module_id, optimizer, in_a_row in over_limit:
            name = next(n for n, o in self.get_optimizers_for_module(module_id) if o is optimizer)
            loss = loss_per_module.get(module_id, loss_per_module.get(ALL_MODULES))
            if loss is not None and not bool(torch.isfinite(loss.detach()).all()):
                what = f"its loss was {loss.detach().float().mean().item()}{where}"
            else:
                what = f"its loss was finite{where}, its gradients were not"
            lines.append(f"module {module_id!r}, optimizer {name!r}: {in_a_row} steps in a row skipped; {what}")
        return (
            "training stopped: gradients held NaN or infinity in too many consecutive steps, so the weights "
            "stopped changing (max_consecutive_non_finite_steps reached):\n  "
            + "\n  ".join(lines)
            + "\nLook for NaN/inf in the data (rewards, observations) and in the loss; a lower lr or grad_clip "
            "helps against exploding gradients. max_consecutive_non_finite_steps=None turns this check off."
        )


def _sum(values: Any) -> torch.Tensor:
    """Sum of tensors; a single tensor is returned as it is (no extra op, no copy)."""
    values = list(values)
    return values[0] if len(values) == 1 else torch.stack(values).sum()
