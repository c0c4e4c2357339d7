"""One gradient step of a Learner: losses, backward pass, clipping, optimizer steps.

``GradientStepMixin`` holds RLlib's gradient hooks in the order ``_minibatch_step`` calls
them on every minibatch: ``compute_losses`` (which calls ``compute_loss_for_module`` per
module), ``compute_gradients``, ``postprocess_gradients`` (``postprocess_gradients_for_module``
per module: clipping) and ``apply_gradients``. A Learner subclass overrides any of them.

The mixin is one part of ``Learner``, which inherits it: it uses the Learner's modules,
optimizer registry (``learner/optimizers.py``), metrics and Trainer plumbing. Its code is
the per-step hot path, so it reads the registry's tables directly and builds no more dicts
than each hook returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.learner.data_parallel import is_wrapped_in_ddp, unused_parameter_anchor
from lightning_rl.learner.optimizers import clip_gradients
from lightning_rl.learner.result_keys import NUM_NON_FINITE_UPDATES_SKIPPED, TOTAL_LOSS_KEY

if TYPE_CHECKING:
    from lightning_rl.learner.learner import LearnerConfig


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
        backpropagates with ``manual_backward``; under DDP the loss also touches every
        parameter (``data_parallel.unused_parameter_anchor``), so no rank's backward waits.
        """
        registry = self._optimizer_registry
        registry.clear_grads()
        total = loss_per_module.get(ALL_MODULES)
        if total is None and loss_per_module:
            total = _sum(loss_per_module.values())
        trainer = self._running_trainer()
        if trainer is not None and is_wrapped_in_ddp(trainer.strategy):
            anchor = unused_parameter_anchor(self)
            total = anchor if total is None else total + anchor
        if isinstance(total, torch.Tensor) and total.requires_grad:
            self.manual_backward(total) if trainer is not None else total.backward()
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
        cannot poison the weights or the optimizer's moments. Under DDP, a module that no
        rank has rows of in this update does not step: its gradients are zeros.
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
        # One device sync for all optimizers; the check itself is cheaper on Python floats.
        for (module_id, optimizer), norm in zip(to_step, torch.stack(norms).tolist()):
            if math.isfinite(norm):
                self._step(optimizer, under_trainer)
            else:
                skipped = (module_id, NUM_NON_FINITE_UPDATES_SKIPPED)
                self.metrics.log_value(skipped, 1, reduce="sum", clear_on_reduce=True)

    def _step(self, optimizer: Optimizer, under_trainer: bool) -> None:
        if under_trainer:
            # Lightning's wrapper runs the strategy's and precision plugin's step logic.
            if optimizer not in self._optimizer_wrappers:  # apply_gradients called outside an update
                self._optimizer_wrappers = self._lightning_optimizer_map()
            self._optimizer_wrappers[optimizer].step()
        else:
            optimizer.step()

    def _minibatch_step(self, minibatch: MultiModuleBatch) -> None:
        """One gradient step: forward, losses, backward, clip, optimizer steps, loss logging."""
        # A data-parallel rank without rows in this step still backpropagates (zeros), in step with the others.
        fwd_out = self._forward_train_fn(minibatch) if minibatch else {}
        loss_per_module = dict(self.compute_losses(fwd_out=fwd_out, batch=minibatch))
        if ALL_MODULES not in loss_per_module and loss_per_module:
            loss_per_module[ALL_MODULES] = _sum(loss_per_module.values())
        gradients = self.compute_gradients(loss_per_module)
        gradients = self.postprocess_gradients(gradients)
        self.apply_gradients(gradients)
        for module_id, loss in loss_per_module.items():
            self.metrics.log_value((module_id, TOTAL_LOSS_KEY), loss, window=math.inf, clear_on_reduce=True)


def _sum(values: Any) -> torch.Tensor:
    """Sum of tensors; a single tensor is returned as it is (no extra op, no copy)."""
    values = list(values)
    return values[0] if len(values) == 1 else torch.stack(values).sum()
