"""Lightning's per-step hooks: every call when someone listens, none of the dispatch when no one does.

Under ``Trainer.fit`` the Learner backpropagates with ``manual_backward`` and steps the
``LightningOptimizer`` wrappers, which dispatch ``on_before_backward``, ``on_after_backward``
and ``on_before_optimizer_step`` through the strategy and precision plugin. When nothing
overrides those hooks it calls ``backward()`` and the optimizer itself (and still counts
the step in the Trainer's progress). These tests prove the hooks still fire exactly when
something listens, and that both ways give bit-identical weights and optimizer states.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, loader_of, make_trainer, random_train_items, weights
from lightning.pytorch import Callback
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner._lightning_private import step_hooks_have_listeners

NUM_ITEMS, ROWS, MINIBATCH, EPOCHS = 3, 48, 16, 2
STEPS = NUM_ITEMS * EPOCHS * (ROWS // MINIBATCH)  # gradient steps of a fit, one optimizer each


class CountingCallback(Callback):
    """Counts the per-step hooks it overrides; otherwise changes nothing."""

    def __init__(self) -> None:
        self.calls = {"on_before_backward": 0, "on_after_backward": 0, "on_before_optimizer_step": 0}

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.calls["on_before_backward"] += 1

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.calls["on_after_backward"] += 1

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.calls["on_before_optimizer_step"] += 1


class LearnerWithGradientHook(BCLearner):
    """A Learner that reads its gradients in Lightning's own hook, as users of Lightning do."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hook_calls = 0

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        assert all(p.grad is not None for p in self.parameters() if p.requires_grad)
        self.hook_calls += 1


def _fit(tmp_path: Path, learner_cls: type = BCLearner, **trainer_kwargs: Any) -> tuple[BCLearner, Any]:
    torch.manual_seed(7)
    learner = learner_cls(module_spec=bc_spec(), num_epochs=EPOCHS, minibatch_size=MINIBATCH, lr=1e-2, grad_clip=0.5)
    trainer = make_trainer(tmp_path, **trainer_kwargs)
    trainer.fit(learner, loader_of(random_train_items(NUM_ITEMS, ROWS)))
    return learner, trainer


@pytest.fixture
def dispatch_count(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the strategy's backward and optimizer step ran: the dispatch the fast step leaves out."""
    counts = {"backward": 0, "optimizer_step": 0}
    for name in counts:
        original = getattr(Strategy, name)

        def counted(self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Strategy, name, counted)
    return counts


def test_a_listening_callback_gets_every_per_step_hook(tmp_path: Path, dispatch_count: dict[str, int]):
    callback = CountingCallback()
    _fit(tmp_path, callbacks=[callback])
    assert callback.calls == dict.fromkeys(("on_before_backward", "on_after_backward", "on_before_optimizer_step"), STEPS)
    assert dispatch_count == {"backward": STEPS, "optimizer_step": STEPS}


def test_a_learner_that_overrides_a_step_hook_gets_every_call(tmp_path: Path):
    learner, _ = _fit(tmp_path, learner_cls=LearnerWithGradientHook)
    assert learner.hook_calls == STEPS


def test_without_listeners_the_step_skips_the_dispatch_and_still_counts_the_steps(
    tmp_path: Path, dispatch_count: dict[str, int]
):
    _, trainer = _fit(tmp_path)
    assert dispatch_count == {"backward": 0, "optimizer_step": 0}
    # global_step counts optimizer steps in manual optimization: checkpoints and max_steps rely on it.
    assert trainer.global_step == STEPS


def test_the_fast_and_the_hooked_step_are_bit_identical(tmp_path: Path):
    fast, fast_trainer = _fit(tmp_path / "fast")
    hooked, hooked_trainer = _fit(tmp_path / "hooked", callbacks=[CountingCallback()])
    assert_same_tensors(weights(fast), weights(hooked))
    assert_same_tensors(fast.get_state()["optimizer"], hooked.get_state()["optimizer"])
    assert fast_trainer.global_step == hooked_trainer.global_step == STEPS


def test_a_profiler_or_a_precision_plugin_keeps_the_dispatch(tmp_path: Path, dispatch_count: dict[str, int]):
    _fit(tmp_path / "profiled", profiler="simple")
    assert dispatch_count == {"backward": STEPS, "optimizer_step": STEPS}
    _fit(tmp_path / "bf16", precision="bf16-mixed")  # its plugin overrides the backward and step hooks
    assert dispatch_count == {"backward": 2 * STEPS, "optimizer_step": 2 * STEPS}


def test_step_hooks_have_listeners_reads_overrides_of_every_dispatching_class(tmp_path: Path):
    seen: list[bool] = []

    class Probe(Callback):  # overrides no per-step hook, so it is no listener itself
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            seen.append(step_hooks_have_listeners(trainer, pl_module))

    class ScalingPlugin(Precision):
        def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
            return super().pre_backward(tensor, module)

    _fit(tmp_path / "plain", callbacks=[Probe()])
    _fit(tmp_path / "listened", callbacks=[Probe(), CountingCallback()])
    _fit(tmp_path / "plugin", callbacks=[Probe()], plugins=[ScalingPlugin()])
    assert seen == [False] * NUM_ITEMS + [True] * NUM_ITEMS + [True] * NUM_ITEMS

