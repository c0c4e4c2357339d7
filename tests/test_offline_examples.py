"""The offline example configs run from the command line on the datasets they name.

Each dataset is made with ``lightning-rl record`` (random actions: enough rows to train on,
quickly) under the id the config names, in a tmp ``MINARI_DATASETS_PATH``; each config then
fits a few gradient steps and one evaluation episode. ``tests/test_record.py`` runs the
script that makes the real datasets (``examples/make_offline_datasets.py --quick``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _helpers import usage_error

from lightning_rl.cli import evaluate_command, record_command
from lightning_rl.cli.lightning_cli import LightningRLCLI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONFIGS = {
    "bc_cartpole.yaml": ("cartpole/ppo-expert-v0", "CartPole-v1"),
    "marwil_cartpole.yaml": ("cartpole/mixed-v0", "CartPole-v1"),
    "cql_pendulum.yaml": ("pendulum/sac-medium-v0", "Pendulum-v1"),
    "iql_pendulum.yaml": ("pendulum/sac-medium-v0", "Pendulum-v1"),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_an_offline_example_config_fits_from_the_command_line(config, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset_id, env = CONFIGS[config]
    record_command.main(
        ["--env", env, "--random_fraction", "1", "--num_episodes", "4", "--dataset_id", dataset_id, "--seed", "0"]
    )
    cli = LightningRLCLI(
        args=[
            "fit",
            "--config",
            str(EXAMPLES / config),
            "--trainer.max_epochs=1",
            "--trainer.logger=false",
            "--trainer.callbacks=[]",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--model.model_config.fcnet_hiddens=[8]",
            "--data.batch_size=16",
            "--data.updates_per_epoch=3",
            "--data.evaluation_num_episodes=1",
        ]
    )
    assert cli.datamodule.hparams.dataset_id == dataset_id
    assert cli.model.weights_seq_no == 3
    assert cli.trainer.callback_metrics["eval/num_episodes"] == 1


def test_a_config_naming_the_offline_data_module_takes_none_of_the_default_data_modules_settings(capsys):
    """Lightning's CLI keeps a replaced class's init_args that the new class also takes: none may carry over."""

    from lightning_rl.cli import main as cli_main
    from lightning_rl.data import OfflineDataModule

    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", str(EXAMPLES / "bc_cartpole.yaml"), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]
    defaults = {name: value for name, value in OfflineDataModule.__init__.__kwdefaults__.items()}
    given = {"dataset_id", "batch_size", "updates_per_epoch", "evaluation_num_episodes"}
    assert {name: value for name, value in printed.items() if name not in given} == {
        name: value for name, value in defaults.items() if name not in given
    }


def test_an_offline_example_configs_checkpoint_is_named_by_the_dataset_rows_and_evaluates_in_its_env(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset_id, env = CONFIGS["bc_cartpole.yaml"]
    record_command.main(["--env", env, "--random_fraction", "1", "--num_episodes", "4", "--dataset_id", dataset_id])
    LightningRLCLI(
        args=[
            "fit",
            "--config",
            str(EXAMPLES / "bc_cartpole.yaml"),
            "--trainer.max_epochs=1",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--model.model_config.fcnet_hiddens=[8]",
            "--data.batch_size=16",
            "--data.updates_per_epoch=3",
            "--data.evaluation_num_episodes=1",
        ]
    )
    # 3 gradient steps of 16 rows: Lightning would have named it step=48.
    names = sorted(path.name for path in (tmp_path / "checkpoints").glob("*.ckpt"))
    assert names == ["epoch=0-dataset_rows=48.ckpt", "last.ckpt"]

    # `lightning-rl evaluate` finds the env as the data module does: the dataset's, else --env.
    last = str(tmp_path / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    evaluate_command.main(["--ckpt_path", last, "--num_episodes", "1"])
    assert f"CartPole-v1 (env from the checkpoint's dataset {dataset_id}): 1 greedy episodes" in capsys.readouterr().out
    config = tmp_path / "offline.yaml"
    data = {"dataset_id": dataset_id, "evaluation_env": "CartPole-v1"}
    data["evaluation_env_kwargs"] = {"max_episode_steps": 7}
    section = {"class_path": "lightning_rl.data.OfflineDataModule", "init_args": data}
    config.write_text(yaml.safe_dump({"data": section}))
    stats = tmp_path / "s.json"
    evaluate_command.main(["--ckpt_path", last, "--num_episodes", "1", "--config", str(config), "--json", str(stats)])
    assert "CartPole-v1 (env from --config's evaluation_env)" in capsys.readouterr().out
    assert json.loads(stats.read_text())["episode_len_max"] <= 7  # its kwargs too
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "elsewhere"))
    error = usage_error(evaluate_command.main, ["--ckpt_path", last, "--num_episodes", "1"], capsys)
    assert f"last.ckpt: pass --env ID; without it the env is the one dataset '{dataset_id}' was recorded in" in error
    assert "is not a local Minari dataset" in error
