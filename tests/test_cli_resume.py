"""``lightning-rl ... --ckpt_path``: the user's settings win, each change is reported, nothing in the checkpoint runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import pytest
import torch
import yaml
from _helpers import resealed
from test_cli import CARTPOLE, REPO, quick

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.cli import LightningRLCLI
from lightning_rl.cli.resume import holds_only_data, plan_resume
from lightning_rl.core.checkpoint import CHECKPOINT_KEY, CHECKSUM_KEY

MARKER_MODULE = "_code_from_checkpoint"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a short PPO fit with num_epochs=2 and gamma=0.9 (the example says 20 and 0.98)."""
    root = tmp_path_factory.mktemp("fit")
    LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(root), "--model.init_args.num_epochs", "2", "--model.init_args.gamma", "0.9"])
    return root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def _config_without(tmp_path: Path, *keys: str) -> str:
    """The CartPole example with the given model init_args left out (so they fall to the checkpoint)."""
    config = yaml.safe_load(Path(CARTPOLE).read_text())
    for key in keys:
        config["model"]["init_args"].pop(key)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def _crafted(checkpoint: Path, path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``checkpoint`` edited by ``edit`` and checksummed again, as an attacker would."""
    content = torch.load(checkpoint, weights_only=True)
    edit(content)
    torch.save(resealed(content), path)
    return path


class _NoRun(LightningRLCLI):
    """Parses and builds everything, then stops before the subcommand runs."""

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def test_resume_uses_the_flags_given_on_the_command_line_and_reports_each_change(tmp_path, checkpoint, capsys):
    cli = LightningRLCLI(args=[
        "fit", "--config", CARTPOLE, *quick(tmp_path, "--model.init_args.lr", "0.0", "--model.init_args.num_epochs", "3"),
        "--data.init_args.max_env_steps", "1024", "--ckpt_path", str(checkpoint),
    ])  # fmt: skip
    assert cli.model.hparams.lr == 0.0 and cli.model.hparams.num_epochs == 3
    assert all(group["lr"] == 0.0 for group in cli.trainer.optimizers[0].param_groups)  # what ran, not just what was recorded
    messages = capsys.readouterr().err
    assert f"{checkpoint}: lr: [[0.0, 0.001], [100000.0, 0.0]] -> 0.0 (as given)" in messages
    assert f"{checkpoint}: num_epochs: 2 -> 3 (as given)" in messages
    recorded = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert recorded["model"]["init_args"]["lr"] == 0.0 and recorded["model"]["init_args"]["num_epochs"] == 3


def test_resume_takes_the_settings_the_config_leaves_out_from_the_checkpoint(tmp_path, checkpoint, capsys):
    config = _config_without(tmp_path, "gamma", "num_epochs")
    cli = _NoRun(args=["fit", "--config", config, *quick(tmp_path), "--ckpt_path", str(checkpoint)])
    assert cli.model.hparams.gamma == 0.9  # the checkpoint's; the default is 0.99
    # quick() gives num_epochs=1 on the command line, which wins over the checkpoint's 2.
    assert cli.model.hparams.num_epochs == 1
    assert "settings from the checkpoint that your config and flags leave out: gamma" in capsys.readouterr().err


def test_a_checkpoint_cannot_make_training_import_or_call_a_function(tmp_path, checkpoint, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARKER", str(marker))

    def edit(content: dict[str, Any]) -> None:
        content["hyper_parameters"]["policies_to_train"] = f"{MARKER_MODULE}.touch_marker"
        content["hyper_parameters"]["_instantiator"] = f"{MARKER_MODULE}.touch_marker"
        content[CHECKPOINT_KEY]["state"].pop("should_module_be_updated", None)

    evil = _crafted(checkpoint, tmp_path / "evil.ckpt", edit)
    for subcommand in ("fit", "validate"):
        cli = LightningRLCLI(args=[
            subcommand, "--config", CARTPOLE, *quick(tmp_path / subcommand), "--data.init_args.max_env_steps", "1024",
            "--ckpt_path", str(evil),
        ])  # fmt: skip
        assert cli.model.should_module_be_updated("default_policy")
    assert not marker.exists()
    assert MARKER_MODULE not in sys.modules


def test_a_checkpoint_env_or_wrapper_path_is_never_imported_on_resume(tmp_path, checkpoint, monkeypatch):
    # Env strings may name a module to import ("module:EnvId") or a factory: a checkpoint's
    # data-module settings are never used, so the env comes from the config alone.
    marker = tmp_path / "marker"
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARKER", str(marker))

    def edit(content: dict[str, Any]) -> None:
        data = content["datamodule_hyper_parameters"]
        data["env"] = f"{MARKER_MODULE}.touch_marker"
        data["wrappers"] = [f"{MARKER_MODULE}.touch_marker"]
        data["_class_path"] = data["_instantiator"] = f"{MARKER_MODULE}.touch_marker"

    evil = _crafted(checkpoint, tmp_path / "evil.ckpt", edit)
    cli = LightningRLCLI(args=[
        "fit", "--config", CARTPOLE, *quick(tmp_path), "--data.init_args.max_env_steps", "1024", "--ckpt_path", str(evil),
    ])  # fmt: skip
    assert cli.datamodule.env == "CartPole-v1" and cli.datamodule.num_env_steps_sampled_lifetime == 1024
    assert not marker.exists()
    assert MARKER_MODULE not in sys.modules


def test_a_checkpoint_naming_an_unloaded_learner_class_is_refused_without_importing_it(tmp_path, checkpoint, capsys):

    def edit(content: dict[str, Any]) -> None:
        content["hyper_parameters"]["_class_path"] = f"{MARKER_MODULE}.Learner"
        content[CHECKPOINT_KEY]["learner_class"] = f"{MARKER_MODULE}.Learner"

    evil = _crafted(checkpoint, tmp_path / "evil.ckpt", edit)
    with pytest.raises(SystemExit):
        LightningRLCLI(args=["validate", "--config", CARTPOLE, *quick(tmp_path), "--ckpt_path", str(evil)])
    assert f"wrong algorithm: it was written by {MARKER_MODULE}.Learner" in capsys.readouterr().err
    assert MARKER_MODULE not in sys.modules
    assert not (tmp_path / "lightning_logs").exists()


def test_a_checkpoint_of_another_algorithm_is_a_usage_error_naming_both(tmp_path, checkpoint, capsys):
    dqn = str(REPO / "examples" / "dqn_cartpole.yaml")
    with pytest.raises(SystemExit):
        LightningRLCLI(args=["fit", "--config", dqn, "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", str(checkpoint)])
    error = capsys.readouterr().err
    assert "wrong algorithm: it was written by lightning_rl.algorithms.ppo.PPOLearner" in error and "DQNLearner" in error
    assert not (tmp_path / "lightning_logs").exists()


def test_a_missing_ckpt_path_is_a_usage_error_before_any_directory_is_created(tmp_path, capsys):
    with pytest.raises(SystemExit):
        LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path), "--ckpt_path", str(tmp_path / "nope.ckpt")])
    assert "nope.ckpt: no such file" in capsys.readouterr().err
    assert not (tmp_path / "lightning_logs").exists()


def test_two_runs_in_one_root_directory_get_their_own_version_directories(tmp_path):
    first = _NoRun(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    second = _NoRun(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    assert first.trainer.log_dir != second.trainer.log_dir
    assert {Path(first.trainer.log_dir).name, Path(second.trainer.log_dir).name} == {"version_0", "version_1"}


@pytest.mark.parametrize(
    "annotation,is_data",
    [
        (int, True), (Optional[float], True), (Literal["value", "norm"], True), (dict[str, Any], True),
        (Sequence[Sequence[float]], True), (list[str] | None, True),
        (Callable[[str], bool], False), (Sequence[str] | Callable[[str], bool], False), (PPOLearner, False),
        (type, False), (list[Callable[[], None]], False), (object, False),
    ],
)  # fmt: skip
def test_only_arguments_whose_type_holds_nothing_but_data_can_come_from_a_checkpoint(annotation, is_data):
    assert holds_only_data(annotation) is is_data


def test_plan_resume_keeps_given_settings_adopts_left_out_data_and_never_adopts_callable_typed_ones():
    saved = {"lr": 1e-3, "gamma": 0.9, "num_epochs": 2, "policies_to_train": ["a"], "_class_path": "x.Y", "gone": 1}
    current = {"lr": 0.0, "gamma": 0.99, "num_epochs": 2, "policies_to_train": None}
    plan = plan_resume(PPOLearner, saved, current, given={"lr", "num_epochs"})
    assert plan.adopted == {"gamma": 0.9}
    assert plan.changed == [("lr", 1e-3, 0.0)]
    assert plan.not_adopted == [("policies_to_train", ["a"], None)]


def test_the_cli_writes_checkpoints_whole_and_checksummed(checkpoint):
    # AtomicCheckpointIO is installed by default: its files carry the whole-file checksum.
    content = torch.load(checkpoint, weights_only=True)
    assert CHECKSUM_KEY in content
    assert not list(checkpoint.parent.glob(".*"))  # no temporary files left behind


def test_a_new_run_removes_what_killed_saves_left_in_earlier_version_directories(tmp_path):
    from test_checkpoint_files import _orphan_name

    earlier = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    earlier.mkdir(parents=True)
    orphan = _orphan_name(earlier)
    orphan.write_bytes(b"half a checkpoint")
    (earlier / "last.ckpt").write_bytes(b"not touched")
    _NoRun(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    assert not orphan.exists() and (earlier / "last.ckpt").read_bytes() == b"not touched"
