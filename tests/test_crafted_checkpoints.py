"""Every way of opening a checkpoint, against checkpoints crafted to run code if anything let them.

A crafted checkpoint loads with ``torch.load(weights_only=True)`` and carries a valid checksum
(an attacker computes it too). It names a module whose import, and a function whose call,
create a marker file (``tests/_code_from_checkpoint.py``). Whatever a load path does with it,
refuse it or load it as data, the marker never appears and the module is never imported.
The CLI's paths are tested in ``test_cli_resume.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import bc_spec, loader_of, make_trainer, random_batch, resealed

from lightning_rl import Learner, LearnerGroup
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.core.checkpoint import CHECKPOINT_KEY, LEARNER_STATE_FILE, with_checksum

MODULE = "_code_from_checkpoint"
CODE = f"{MODULE}.touch_marker"


def _edit_hparams(entry: dict[str, Any]) -> None:
    entry["hparams"]["policies_to_train"] = CODE


def _edit_rule(entry: dict[str, Any]) -> None:
    entry["state"]["should_module_be_updated"] = CODE


def _edit_learner_class(entry: dict[str, Any]) -> None:
    entry["learner_class"] = f"{MODULE}.Learner"


def _edit_module_class(entry: dict[str, Any]) -> None:
    for spec in entry["state"]["module_spec"]["rl_module_specs"].values():
        spec["module_class"] = f"{MODULE}.Module"


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "policies_to_train names a function": _edit_hparams,
    "the state's rule names a function": _edit_rule,
    "the Learner class is in an unloaded module": _edit_learner_class,
    "the RLModule class is in an unloaded module": _edit_module_class,
}


def _fresh() -> BCLearner:
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    return learner


def _restore(path: Path) -> Any:
    learner = _fresh()
    learner.restore_from_path(str(path))
    return learner


def _group_from_checkpoint(path: Path) -> Any:
    group = LearnerGroup.from_checkpoint(path, learner_class=BCLearner, num_learners=0)
    group.update(batch=random_batch(seed=2))
    return group.foreach_learner(lambda learner: learner)[0]


def _group_restore(path: Path) -> Any:
    group = LearnerGroup(_fresh(), num_learners=0)
    group.restore_from_path(path)
    group.update(batch=random_batch(seed=2))
    return group.foreach_learner(lambda learner: learner)[0]


def _trainer_resume(path: Path) -> Any:
    learner = BCLearner(module_spec=bc_spec())
    make_trainer(path.parent / "resume", max_epochs=2).fit(learner, loader_of([random_batch(seed=4)]), ckpt_path=path)
    return learner


LOAD_PATHS: dict[str, Callable[[Path], Any]] = {
    "Learner.from_checkpoint": lambda path: Learner.from_checkpoint(str(path)),
    "BCLearner.load_from_checkpoint": lambda path: BCLearner.load_from_checkpoint(path),
    "Learner.restore_from_path": _restore,
    "LearnerGroup.from_checkpoint": _group_from_checkpoint,
    "LearnerGroup.restore_from_path": _group_restore,
    "Trainer.fit(ckpt_path=...)": _trainer_resume,
}


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "marker"
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARKER", str(path))
    yield path
    assert not path.exists(), "code named by the checkpoint ran"
    assert MODULE not in sys.modules, "the module named by the checkpoint was imported"


def _lightning_checkpoint(directory: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    learner = BCLearner(module_spec=bc_spec())
    trainer = make_trainer(directory / "fit")
    trainer.fit(learner, loader_of([random_batch(seed=1)]))
    path = directory / "crafted.ckpt"
    trainer.save_checkpoint(path)
    content = torch.load(path, weights_only=True)
    content["hyper_parameters"]["policies_to_train"] = CODE
    content["hyper_parameters"]["_instantiator"] = CODE
    content[CHECKPOINT_KEY]["state"].pop("should_module_be_updated", None)
    edit(content[CHECKPOINT_KEY])
    torch.save(resealed(content), path)
    return path


def _learner_directory(directory: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    learner = _fresh()
    learner.update_from_batch(random_batch(seed=1))
    path = Path(learner.save_to_path(str(directory / "crafted")))
    payload = torch.load(path / LEARNER_STATE_FILE, weights_only=True)
    payload["state"].pop("should_module_be_updated", None)
    edit(payload)
    torch.save(with_checksum(payload), path / LEARNER_STATE_FILE)
    return path


@pytest.mark.parametrize("load", LOAD_PATHS)
@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("make", [_lightning_checkpoint, _learner_directory], ids=["Lightning file", "Learner directory"])
def test_no_load_path_imports_or_calls_what_a_crafted_checkpoint_names(make, edit, load, tmp_path, marker):
    if load == "Trainer.fit(ckpt_path=...)" and make is _learner_directory:
        pytest.skip("a Trainer resumes from Lightning checkpoint files only")
    path = make(tmp_path, EDITS[edit])
    try:
        learner = LOAD_PATHS[load](path)
    except ValueError as error:  # refused: the message says what is wrong, in one line
        assert "\n" not in str(error)
        return
    # Loaded as data: the rule stays data and training runs nothing.
    assert not callable(learner._should_module_be_updated)
    learner.update_from_batch(random_batch(seed=3))
