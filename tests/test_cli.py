"""The lightning-rl command: fit from the example config, print_config, validate a checkpoint, bad values, the progress bar, the logger."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from lightning_rl.callbacks import EnvStepProgressBar
from lightning_rl.cli import LightningRLCLI, main, misplaced_data_argument_hint
from lightning_rl.learner.tensorboard_logger import HParamsTensorBoardLogger

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = str(REPO / "examples" / "ppo_cartpole.yaml")
PENDULUM = str(REPO / "examples" / "ppo_pendulum.yaml")


def quick(tmp_path: Path, *extra: str) -> list[str]:
    """Flags that shrink an example run to a few seconds inside ``tmp_path``."""
    return [
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
        "--data.init_args.max_env_steps", "512",
        "--data.init_args.rollouts_per_epoch", "1",
        "--data.init_args.evaluation_num_episodes", "2",
        "--model.init_args.num_epochs", "1",
        *extra,
    ]  # fmt: skip


def test_fit_from_the_example_config_trains_logs_and_checkpoints(tmp_path):
    cli = LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    assert cli.datamodule.num_env_steps_sampled_lifetime == 512
    assert "eval/episode_return_mean" in cli.trainer.callback_metrics
    version = tmp_path / "lightning_logs" / "version_0"
    assert list(version.glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert (version / "checkpoints" / "last.ckpt").exists()
    assert (version / "config.yaml").exists()


def test_last_ckpt_is_the_latest_state_whatever_the_best_checkpoints_monitor(tmp_path, capsys):
    # From Lightning 2.6 on, a monitored ModelCheckpoint(save_last=True) writes last.ckpt only when its metric
    # improves: the examples' last.ckpt was their best evaluation's state, and a fit resumed from it lost the
    # training after it. Here the monitored metric improves only once (the first epoch).
    callback = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {"monitor": "epoch", "mode": "min", "save_last": True}}  # fmt: skip
    config = tmp_path / "best_is_first.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"callbacks": [callback]}}))
    cli = LightningRLCLI(args=["fit", "--config", CARTPOLE, "--config", str(config), *quick(tmp_path)])
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["epoch=0-env_steps=256.ckpt", "last.ckpt"]
    last = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] == cli.trainer.global_step > 0
    assert "last.ckpt, the latest state to resume from, is written at every epoch end" in capsys.readouterr().err

    # The examples keep their best evaluation and need no save_last: fit writes last.ckpt all the same, silently.
    cli = LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path / "example")])
    last = torch.load(tmp_path / "example/lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] == cli.trainer.global_step
    assert "last.ckpt" not in capsys.readouterr().err


def test_validate_evaluates_a_saved_checkpoint(tmp_path):
    LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    cli = LightningRLCLI(args=["validate", "--config", CARTPOLE, *quick(tmp_path), "--ckpt_path", str(checkpoint)])
    assert cli.trainer.callback_metrics["eval/num_episodes"] == 2
    assert cli.trainer.callback_metrics["eval/episode_return_mean"] >= 8


def test_print_config_shows_every_hyperparameter_of_model_and_data(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CARTPOLE, "--print_config"])
    assert exit_.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    model = config["model"]["init_args"]
    assert config["model"]["class_path"] == "lightning_rl.algorithms.ppo.PPOLearner"
    assert model["gamma"] == 0.98 and model["gae_lambda"] == 0.8
    # Learner arguments inherited through **kwargs are settable too.
    assert "grad_clip_by" in model and "torch_compile" in model
    assert config["data"]["init_args"]["num_envs"] == 8


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--data.init_args.env", "NoSuchEnv-v0"], "Unknown env id 'NoSuchEnv-v0'"),
        (["--data.init_args.num_envs", "-2"], "num_envs must be an int >= 1"),
        (["--model.init_args.minibatch_size", "100000"], "minibatch_size=100000 is larger than the data module's train batch of 256"),
        (["--model.init_args.gamma", "1.5"], "gamma must be in"),
        (["--model.init_args.model_config", "{fcnet_hidens: [8]}"], "invalid configuration: PPOModule: unknown model_config key 'fcnet_hidens'; did you mean 'fcnet_hiddens'?"),
    ],
)
def test_bad_config_values_fail_at_start_with_a_message_naming_them(tmp_path, flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path), *flags])
    assert exit_info.value.code != 0
    error = capsys.readouterr().err
    assert message in error
    assert "Given value" not in error  # the constructor's message alone, not the parser's dump of every value
    assert not (tmp_path / "lightning_logs").exists()  # nothing ran


def test_the_examples_are_valid_configs(capsys):
    # Every example in this process (the command's entry point, main(), prints a config in the
    # test above): a process per example costs its imports each time, several seconds apiece.
    # tune_*.yaml are lightning-rl tune's files (tests/test_tune.py), not training configs.
    examples = [path for path in Path(CARTPOLE).parent.glob("*.yaml") if not path.name.startswith("tune_")]
    for path in sorted(str(path) for path in examples):
        with pytest.raises(SystemExit) as exit_info:
            LightningRLCLI(args=["fit", "--config", path, "--print_config"])
        assert exit_info.value.code in (0, None), f"{path}: {capsys.readouterr().err}"
        assert "class_path" in capsys.readouterr().out, path


def test_the_gpu_lane_runs_every_example_config():
    # tests/test_gpu.py shrinks each example for its GPU run: a new example needs its entry there.
    from test_gpu import CONFIGS

    examples = {
        path.name for path in Path(CARTPOLE).parent.glob("*.yaml") if "model" in yaml.safe_load(path.read_text())
    }
    assert examples == set(CONFIGS)


@pytest.mark.parametrize(
    "example,data_class,message",
    [
        ("dqn_cartpole.yaml", "lightning_rl.data.EpisodeDataModule",
         "replay_buffer_capacity is an OffPolicyDataModule argument: use lightning_rl.data.OffPolicyDataModule"),
        ("ppo_cartpole.yaml", "lightning_rl.data.OffPolicyDataModule",
         "rollout_fragment_length is an OnPolicyDataModule argument: use lightning_rl.data.OnPolicyDataModule"),
    ],
)  # fmt: skip
def test_a_config_with_the_wrong_data_module_says_which_one_takes_its_arguments(
    tmp_path, example, data_class, message, capsys
):
    config = yaml.safe_load((REPO / "examples" / example).read_text())
    config["data"]["class_path"] = data_class
    path = tmp_path / "wrong_data_module.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(SystemExit) as exit_info:
        LightningRLCLI(args=["fit", "--config", str(path), "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lightning_logs").exists()  # nothing ran


def test_the_examples_use_the_on_policy_or_off_policy_data_module_their_algorithm_needs():
    for name, data_class in [
        ("ppo_cartpole.yaml", "OnPolicyDataModule"), ("ppo_pendulum.yaml", "OnPolicyDataModule"),
        ("dqn_cartpole.yaml", "OffPolicyDataModule"), ("sac_pendulum.yaml", "OffPolicyDataModule"),
    ]:  # fmt: skip
        config = yaml.safe_load((REPO / "examples" / name).read_text())
        assert config["data"]["class_path"] == f"lightning_rl.data.{data_class}", name


def test_the_hint_is_only_for_data_module_arguments_the_chosen_class_does_not_take():
    rejected = (
        'Parser key "data":\n  Problem with given class_path \'x.OnPolicyDataModule\':\n'
        "    Option 'train_freq' is not accepted"
    )
    assert misplaced_data_argument_hint(rejected) == (
        "train_freq is an OffPolicyDataModule argument: use lightning_rl.data.OffPolicyDataModule"
    )
    assert misplaced_data_argument_hint(rejected.replace('"data"', '"model"')) is None
    assert misplaced_data_argument_hint(rejected.replace("train_freq", "some_other_option")) is None
    assert misplaced_data_argument_hint('Parser key "data":\n  train_freq must be an int >= 1') is None


def test_fit_shows_the_env_step_progress_bar_without_an_epoch_total(tmp_path, capsys):
    # Lightning's own choice with rich installed, RichProgressBar, read "Epoch 0/-2" for max_epochs: -1.
    args = [*quick(tmp_path), "--trainer.enable_progress_bar", "true"]
    cli = LightningRLCLI(args=["fit", "--config", CARTPOLE, *args])
    assert type(cli.trainer.progress_bar_callback) is EnvStepProgressBar
    assert cli.trainer.max_epochs == -1
    bar = capsys.readouterr().out
    assert "Epoch 0" in bar and "/-" not in bar
    assert "env_steps=512" in bar


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--trainer.callbacks+=RichProgressBar"], RichProgressBar),
        (["--trainer.callbacks+=TQDMProgressBar", "--trainer.callbacks.refresh_rate=5"], TQDMProgressBar),
        (["--trainer.enable_progress_bar", "false"], type(None)),
    ],
    ids=["rich", "tqdm", "off"],
)
def test_a_progress_bar_the_user_chose_or_turned_off_is_kept(tmp_path, flags, expected):
    args = ["--config", CARTPOLE, "--trainer.default_root_dir", str(tmp_path), *flags]
    cli = LightningRLCLI(args=args, run=False)
    assert type(cli.trainer.progress_bar_callback) is expected
    assert not any(isinstance(callback, EnvStepProgressBar) for callback in cli.trainer.callbacks)


def test_fit_logs_hp_metric_only_from_evaluations_and_lists_the_run_in_the_hparams_dashboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = LightningRLCLI(args=["fit", "--config", CARTPOLE, *quick(tmp_path)])
    assert type(cli.trainer.logger) is HParamsTensorBoardLogger
    events = EventAccumulator(str(tmp_path / "lightning_logs" / "version_0"))
    events.Reload()
    # Lightning's TensorBoardLogger logged hp_metric = -1 at step 0 before any evaluation.
    hp_metric = [(event.step, event.value) for event in events.Scalars("hp_metric")]
    evaluations = [(event.step, event.value) for event in events.Scalars("eval/episode_return_mean")]
    assert hp_metric and [step for step, _ in hp_metric] == [step for step, _ in evaluations]
    assert all(value >= 8 for _, value in hp_metric)  # CartPole returns, no -1
    # The HParams summary, which lists the run in the dashboard, is written all the same.
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")


def test_fit_keeps_a_logger_the_user_chose(tmp_path):
    args = ["--config", CARTPOLE, "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "CSVLogger"]
    cli = LightningRLCLI(args=[*args, "--trainer.logger.save_dir", str(tmp_path)], run=False)
    assert type(cli.trainer.logger) is CSVLogger
