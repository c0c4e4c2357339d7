"""Save/load contract of every algorithm (one row each in ``tests/_algorithms.py``).

As Stable-Baselines3's ``tests/test_save_load.py`` does for its algorithms, every row must:

* come back identical from ``save_to_path`` through ``restore_from_path`` and through
  ``from_checkpoint`` (its own class's and the base ``Learner``'s): weights (target networks
  and buffers included), optimizer states, ``weights_seq_no``, and the results and weights of
  the next update on the same data with the same seed;
* load the Lightning checkpoint that ``lightning-rl fit`` wrote, with ``from_checkpoint``,
  with ``restore_from_path`` and with ``torch.load(weights_only=True)``;
* resume under ``Trainer.fit(ckpt_path=...)`` with its counters going on, and train N + M
  items in one fit exactly as N items and a resumed fit of M more;
* train the same items to the same weights standalone and under ``Trainer.fit``.

"The same data" are fixed train items (``AlgorithmRow.make_items``), and torch is seeded
with each item's env-step count before its update, in and out of a Trainer. A data module
cannot give two runs the same data across a resume: a resumed run resets its envs (the env
state is not in the checkpoint), so the N + M equality is checked on fixed items for every
row, and resuming with a real data module checks the counters.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from _algorithms import ITEM_ENV_STEPS, ROWS, AlgorithmRow, item_seed, update_standalone
from _helpers import assert_same, loader_of, make_trainer
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl import Learner
from lightning_rl.cli import LightningRLCLI
from lightning_rl.core.train_item import TrainItem

INIT_SEED, OTHER_SEED = 0, 123
# Fixed items: trained before a save (or before a checkpoint), and after it.
ITEMS_BEFORE, ITEMS_AFTER = 2, 2

pytestmark = pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])


# ---- Helpers ----------------------------------------------------------------------------


def fresh_learner(row: AlgorithmRow, seed: int = INIT_SEED) -> Learner:
    """A built Learner whose initial weights depend on ``seed`` alone."""
    torch.manual_seed(seed)
    learner = row.make_learner()
    learner.build()
    return learner


def trained_learner(row: AlgorithmRow, items: list[TrainItem]) -> Learner:
    learner = fresh_learner(row)
    for item in items:
        update_standalone(learner, item)
    return learner


def learner_state(learner: Learner) -> dict[str, Any]:
    """What must survive a save and load: all module state, optimizer states, the step count."""
    return {
        "module": {name: value.detach().clone() for name, value in learner.module.state_dict().items()},
        "optimizers": {
            name: copy.deepcopy(optimizer.state_dict()) for name, optimizer in learner.get_optimizers_for_module()
        },
        "weights_seq_no": learner.weights_seq_no,
    }


def assert_same_learner(actual: Learner, expected: Learner) -> None:
    assert type(actual) is type(expected)
    assert_same(learner_state(actual), learner_state(expected))


def assert_same_next_update(learners: list[Learner], item: TrainItem) -> None:
    """Each learner trains on its own copy of ``item``: all give the same results and weights."""
    results = [update_standalone(learner, copy.deepcopy(item)) for learner in learners]
    for learner, result in zip(learners[1:], results[1:]):
        assert_same(result, results[0], "results")
        assert_same_learner(learner, learners[0])


class SeedEachItem(Callback):
    """Seeds torch before each fixed item's update, as ``update_standalone`` does."""

    def on_train_batch_start(self, trainer: Trainer, pl_module: Learner, batch: TrainItem, batch_idx: int) -> None:
        torch.manual_seed(item_seed(batch))


class RecordResults(Callback):
    """The results of every update of a fit."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Learner, outputs: Any, batch: TrainItem, batch_idx: int
    ) -> None:
        self.results.append(outputs["results"])


class StateAtTrainStart(Callback):
    """The Learner's and data module's counters once a fit has restored its checkpoint."""

    def on_train_start(self, trainer: Trainer, pl_module: Learner) -> None:
        self.weights_seq_no = pl_module.weights_seq_no
        self.env_steps = trainer.datamodule.num_env_steps_sampled_lifetime


def fit_items(learner: Learner, items: list[TrainItem], tmp_path: Path, **trainer_kwargs: Any) -> RecordResults:
    """``Trainer.fit`` on fixed items (one epoch of them unless ``max_epochs`` says otherwise)."""
    record = RecordResults()
    callbacks = [SeedEachItem(), record, *trainer_kwargs.pop("callbacks", [])]
    make_trainer(tmp_path, callbacks=callbacks, **trainer_kwargs).fit(learner, train_dataloaders=loader_of(items))
    return record


def last_checkpoint(directory: Path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=directory, save_last=True)


# ---- save_to_path, restore_from_path, from_checkpoint -----------------------------------


def test_save_to_path_then_restore_from_path_gives_an_identical_learner(row: AlgorithmRow, tmp_path: Path):
    items = row.make_items(ITEMS_BEFORE + 1)
    learner = trained_learner(row, items[:ITEMS_BEFORE])
    assert learner.weights_seq_no == ITEMS_BEFORE * row.steps_per_item
    path = learner.save_to_path(str(tmp_path / "learner"))

    restored = fresh_learner(row, seed=OTHER_SEED)
    restored.restore_from_path(path)
    assert_same_learner(restored, learner)
    assert_same_next_update([learner, restored], items[ITEMS_BEFORE])


@pytest.mark.parametrize("loader", ["own class", "Learner"])
def test_save_to_path_then_from_checkpoint_gives_an_identical_learner(row: AlgorithmRow, loader: str, tmp_path: Path):
    items = row.make_items(ITEMS_BEFORE + 1)
    learner = trained_learner(row, items[:ITEMS_BEFORE])
    path = learner.save_to_path(str(tmp_path / "learner"))

    torch.manual_seed(OTHER_SEED)  # the checkpoint, not the generator, must decide the weights
    loaded = (row.learner_class if loader == "own class" else Learner).from_checkpoint(path)
    assert_same_learner(loaded, learner)
    assert_same_next_update([learner, loaded], items[ITEMS_BEFORE])


# ---- Checkpoints written by the command line --------------------------------------------


def fit_from_the_command_line(row: AlgorithmRow, tmp_path: Path) -> tuple[Learner, Path]:
    """``lightning-rl fit`` of ``ITEMS_BEFORE`` train items, saving ``last.ckpt``; the fitted Learner and that file."""
    config = {
        "seed_everything": INIT_SEED,
        "trainer": {
            "max_epochs": -1,  # the data module's max_env_steps ends the run
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "default_root_dir": str(tmp_path),
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": str(tmp_path / "checkpoints"), "save_last": True},
                }
            ],
        },
        "model": row.cli_model(),
        "data": row.cli_data(rollouts_per_epoch=ITEMS_BEFORE, max_env_steps=ITEMS_BEFORE * ITEM_ENV_STEPS),
    }
    path = tmp_path / "given.yaml"  # the CLI writes what ran to config.yaml beside it
    path.write_text(yaml.safe_dump(config))
    cli = LightningRLCLI(args=["fit", "--config", str(path)])
    return cli.model, tmp_path / "checkpoints" / "last.ckpt"


def test_a_checkpoint_written_by_the_command_line_loads_every_way(row: AlgorithmRow, tmp_path: Path):
    fitted, checkpoint = fit_from_the_command_line(row, tmp_path)
    assert fitted.weights_seq_no == ITEMS_BEFORE * row.steps_per_item

    content = torch.load(checkpoint, map_location="cpu", weights_only=True)  # plain data only
    assert "lightning_rl" in content and content["state_dict"]

    loaded = [loader.from_checkpoint(str(checkpoint)) for loader in (row.learner_class, Learner)]
    for learner in loaded:
        assert type(learner) is row.learner_class
        assert_same(learner_state(learner), learner_state(fitted))

    restored = fresh_learner(row, seed=OTHER_SEED)
    restored.restore_from_path(str(checkpoint))
    assert_same(learner_state(restored), learner_state(fitted))
    assert_same_next_update([*loaded, restored, fitted], row.make_items(1)[0])


# ---- Resuming a fit ----------------------------------------------------------------------


def test_a_resumed_fit_continues_the_step_and_env_step_counters(row: AlgorithmRow, tmp_path: Path):
    steps_before = ITEMS_BEFORE * ITEM_ENV_STEPS
    steps_after = ITEMS_AFTER * ITEM_ENV_STEPS
    first = fresh_learner(row)
    data = row.make_data(rollouts_per_epoch=ITEMS_BEFORE, max_env_steps=steps_before)
    make_trainer(tmp_path, max_epochs=-1, enable_checkpointing=True, callbacks=[last_checkpoint(tmp_path)]).fit(
        first, datamodule=data
    )
    assert data.num_env_steps_sampled_lifetime == steps_before
    assert first.weights_seq_no == ITEMS_BEFORE * row.steps_per_item

    resumed, at_start = row.make_learner(), StateAtTrainStart()
    data = row.make_data(rollouts_per_epoch=ITEMS_AFTER, max_env_steps=steps_before + steps_after)
    make_trainer(tmp_path, max_epochs=-1, callbacks=[at_start]).fit(
        resumed, datamodule=data, ckpt_path=str(tmp_path / "last.ckpt")
    )
    assert (at_start.weights_seq_no, at_start.env_steps) == (first.weights_seq_no, steps_before)
    assert data.num_env_steps_sampled_lifetime == steps_before + steps_after
    assert resumed.weights_seq_no == (ITEMS_BEFORE + ITEMS_AFTER) * row.steps_per_item


def test_n_plus_m_items_in_one_fit_equal_n_items_then_a_resumed_fit_of_m(row: AlgorithmRow, tmp_path: Path):
    items = row.make_items(ITEMS_BEFORE + ITEMS_AFTER)
    straight = fresh_learner(row)
    straight_results = fit_items(straight, copy.deepcopy(items), tmp_path / "straight").results

    # One deepcopy for both fits: off-policy items share one replay buffer, which goes on sampling.
    split_items = copy.deepcopy(items)
    first = fresh_learner(row)
    checkpoints = tmp_path / "checkpoints"
    first_results = fit_items(
        first, split_items[:ITEMS_BEFORE], tmp_path, enable_checkpointing=True, callbacks=[last_checkpoint(checkpoints)]
    ).results
    torch.manual_seed(OTHER_SEED)
    resumed = row.make_learner()  # unbuilt: the checkpoint builds it
    record = RecordResults()
    make_trainer(tmp_path, max_epochs=2, callbacks=[SeedEachItem(), record]).fit(
        resumed, train_dataloaders=loader_of(split_items[ITEMS_BEFORE:]), ckpt_path=str(checkpoints / "last.ckpt")
    )
    assert_same(first_results + record.results, straight_results, "results")
    assert_same_learner(resumed, straight)


# ---- Standalone and under Trainer.fit ---------------------------------------------------


def test_standalone_updates_and_trainer_fit_train_the_same_items_to_the_same_weights(
    row: AlgorithmRow, tmp_path: Path
):
    items = row.make_items(ITEMS_BEFORE + ITEMS_AFTER)
    standalone = fresh_learner(row)
    standalone_results = [update_standalone(standalone, item) for item in copy.deepcopy(items)]

    fitted = fresh_learner(row)
    fit_results = fit_items(fitted, copy.deepcopy(items), tmp_path).results
    assert_same(fit_results, standalone_results, "results")
    assert_same_learner(fitted, standalone)
