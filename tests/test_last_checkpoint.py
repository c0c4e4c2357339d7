"""Every run writes ``checkpoints/last.ckpt``; a run without a logger writes nothing into the current directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_rl.cli import LightningRLCLI
from lightning_rl.cli.lightning_cli import NO_CHECKPOINT_DIRECTORY

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SAC_PENDULUM = REPO / "examples" / "sac_pendulum.yaml"
PPO_CARTPOLE = REPO / "examples" / "ppo_cartpole.yaml"
MODEL_CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"


def tiny_sac(*extra: str) -> list[str]:
    """Flags that shrink examples/sac_pendulum.yaml to a few seconds: 300 env steps, one 1-episode evaluation."""
    return [
        "--trainer.enable_progress_bar", "false",
        "--data.init_args.max_env_steps", "300",
        "--data.init_args.learning_starts", "100",
        "--data.init_args.rollouts_per_epoch", "300",
        "--data.init_args.evaluation_num_episodes", "1",
        "--data.init_args.evaluation_num_envs", "1",
        "--model.init_args.minibatch_size", "16",
        "--model.init_args.model_config.fcnet_hiddens", "[8]",
        *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("path", [path for path in EXAMPLES if "model" in yaml.safe_load(path.read_text())], ids=str)
def test_every_example_config_writes_last_ckpt(path):
    trainer = yaml.safe_load(path.read_text()).get("trainer") or {}
    assert trainer.get("enable_checkpointing", True) is not False, f"{path.name} turns checkpoints off"
    checkpoints = [
        callback for callback in trainer.get("callbacks") or [] if callback["class_path"].endswith("ModelCheckpoint")
    ]
    # None: the CLI adds ModelCheckpoint(save_last=True) itself. Monitored ones keep the best evaluation and
    # the CLI adds one for last.ckpt (test_cli): their own save_last would make last.ckpt the best state.
    for callback in checkpoints:
        init_args = callback.get("init_args") or {}
        if init_args.get("monitor") is None:
            assert init_args.get("save_last") is True, f"{path.name}: a ModelCheckpoint without save_last"
        else:
            assert not init_args.get("save_last"), f"{path.name}: a monitored ModelCheckpoint with save_last"


def test_fit_of_sac_pendulum_writes_last_ckpt_through_the_cli_default_model_checkpoint(tmp_path):
    # examples/sac_pendulum.yaml adds no ModelCheckpoint (make_offline_datasets.py adds its own).
    assert "ModelCheckpoint" not in SAC_PENDULUM.read_text()
    args = ["fit", "--config", str(SAC_PENDULUM), "--trainer.default_root_dir", str(tmp_path), *tiny_sac()]
    cli = LightningRLCLI(args=args)
    assert cli.trainer.checkpoint_callback.save_last is True
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_enable_checkpointing_false_still_turns_checkpoints_off(tmp_path):
    args = ["--config", str(SAC_PENDULUM), "--trainer.enable_checkpointing", "false", "--trainer.logger", "false"]
    cli = LightningRLCLI(args=[*args, "--trainer.default_root_dir", str(tmp_path), *tiny_sac()], run=False)
    assert cli.trainer.checkpoint_callback is None


def test_a_config_model_checkpoint_is_kept_as_given(tmp_path):
    args = ["--config", str(SAC_PENDULUM), "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_epochs=2"]
    cli = LightningRLCLI(args=[*args, "--trainer.default_root_dir", str(tmp_path), *tiny_sac()], run=False)
    assert len(cli.trainer.checkpoint_callbacks) == 1
    assert cli.trainer.checkpoint_callback.save_last is None  # Lightning's default: what the config says


def test_runs_without_a_logger_write_nothing_into_the_current_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # the second run once stopped at the first one's config.yaml
        cli = LightningRLCLI(args=["fit", "--config", str(SAC_PENDULUM), "--trainer.logger", "false", *tiny_sac()])
        assert cli.trainer.checkpoint_callback is None
        assert NO_CHECKPOINT_DIRECTORY in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_a_logger_drops_the_config_checkpoints_that_have_no_dirpath(tmp_path, monkeypatch):
    # examples/ppo_cartpole.yaml adds a ModelCheckpoint without a dirpath: it would write ./checkpoints.
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "kept"
    args = ["--config", str(PPO_CARTPOLE), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    named = ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={kept}"]
    cli = LightningRLCLI(args=args, run=False)
    assert cli.trainer.checkpoint_callbacks == []
    cli = LightningRLCLI(args=[*args, *named], run=False)
    assert [Path(callback.dirpath) for callback in cli.trainer.checkpoint_callbacks] == [kept]


def test_a_run_without_a_logger_writes_checkpoints_under_the_default_root_dir_the_user_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "root"
    for _ in range(2):
        args = ["fit", "--config", str(SAC_PENDULUM), "--trainer.logger", "false", "--trainer.default_root_dir", str(root)]
        LightningRLCLI(args=[*args, *tiny_sac()])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["root"]
    assert (root / "checkpoints" / "last.ckpt").is_file()
    assert not (root / "config.yaml").exists()  # a run without a logger has no log directory to save it in


@pytest.mark.parametrize("path", [path for path in EXAMPLES if "EarlyStopping" in path.read_text()], ids=str)
def test_every_example_early_stopping_waits_for_an_evaluation(path):
    # Checked at the end of a training epoch, it would raise in a run that ends before its first
    # evaluation (e.g. --trainer.max_steps 2): the monitored eval/ metric does not exist yet.
    callbacks = (yaml.safe_load(path.read_text()).get("trainer") or {}).get("callbacks") or []
    for callback in callbacks:
        if callback["class_path"].endswith("EarlyStopping"):
            assert callback["init_args"]["check_on_train_epoch_end"] is False, path.name


def test_a_fit_that_ends_before_its_first_evaluation_ends_cleanly(tmp_path):
    args = ["fit", "--config", str(PPO_CARTPOLE), "--trainer.default_root_dir", str(tmp_path)]
    cli = LightningRLCLI(args=[*args, "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step >= 1 and "eval/episode_return_mean" not in cli.trainer.callback_metrics
