"""Which files of ``lightning_rl/learner/`` one PPO train item passes through, in order.

A newcomer reading how a train item becomes an update follows the calls; this counts the
files those calls enter. It fits PPO on CartPole for a few items under ``Trainer.fit`` and,
around one train item (``on_train_batch_start`` to ``on_train_batch_end``), records every
Python call whose code lives in ``lightning_rl/learner/``: the files in the order first entered,
and how often the path enters each (a call from another file of the package, or from outside
it, counts as an entry). The item traced is a middle one, whose logs Lightning does not write,
and the epoch's last, whose logs it writes.

Run::

    python benchmarks/learner_path.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.data import OnPolicyDataModule

LEARNER_DIR = str(Path(__import__("lightning_rl.learner").learner.__file__).parent)


class _TraceItems(L.Callback):
    """Records the learner/ files entered during chosen train items."""

    def __init__(self, items: dict[int, str]) -> None:
        self.items = items
        self.paths: dict[str, list[str]] = {}
        self._current: list[str] | None = None
        self._last_file: str | None = None

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        file = frame.f_code.co_filename
        inside = file.startswith(LEARNER_DIR)
        if inside and file != self._last_file:
            self._current.append(file[len(LEARNER_DIR) + 1 :])
        self._last_file = file if inside else None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx in self.items:
            self._current, self._last_file = [], None
            sys.setprofile(self._profile)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx in self.items:
            sys.setprofile(None)
            self.paths[self.items[batch_idx]] = self._current


def main() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0)
    rollouts = 4
    tracer = _TraceItems({1: "an item whose logs are not written", rollouts - 1: "the epoch's last item (logs written)"})
    learner = PPOLearner(num_epochs=2, minibatch_size=64)
    data = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=64, rollouts_per_epoch=rollouts, seed=0)
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[tracer],
    )
    trainer.fit(learner, datamodule=data)
    for name, path in tracer.paths.items():
        entries = Counter(path)
        print(f"{name}: {len(entries)} files of lightning_rl/learner/")
        for file in dict.fromkeys(path):
            print(f"  {file:<22} entered {entries[file]}x")


if __name__ == "__main__":
    main()
