"""Config errors of ``fit`` and ``validate`` are one or two lines and a pointer to ``--help`` (issue 37).

Each case runs the command in this process and reads its stderr: at most three lines, the bad
key and the closest valid names or the expected type, no usage block and no union-type dump.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_rl.cli import main
from lightning_rl.cli.config_errors import describe_type

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = REPO / "examples" / "ppo_cartpole.yaml"


def run_error(capsys, *args: str) -> str:
    """Run ``lightning-rl`` with ``args``; the stderr of its usage error (status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, error
    for dump in ("Union", "NoneType", "usage:", "Given value", "Traceback"):
        assert dump not in error, error
    return error


def edited_config(tmp_path: Path, edit) -> str:
    """The example config with ``edit`` applied to its dict, written to a file in ``tmp_path``."""
    config = yaml.safe_load(CARTPOLE.read_text())
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_a_key_typo_in_yaml_names_the_key_and_suggests_the_argument(tmp_path, capsys):
    def typo(config):
        config["model"]["init_args"]["gama"] = config["model"]["init_args"].pop("gamma")

    error = run_error(capsys, "fit", "--config", edited_config(tmp_path, typo))
    assert "model.init_args.gama: PPOLearner has no argument 'gama'; did you mean 'gamma'?" in error
    assert "see lightning-rl fit --model.help PPOLearner" in error


def test_an_unknown_flag_suggests_the_argument_it_abbreviates(capsys):
    error = run_error(capsys, "fit", "--config", str(CARTPOLE), "--model.init_args.learning_rate", "3e-4")
    assert "model.init_args.learning_rate: PPOLearner has no argument 'learning_rate'; did you mean 'lr'?" in error


def test_an_unknown_data_argument_suggests_the_data_modules_argument(capsys):
    error = run_error(capsys, "validate", "--config", str(CARTPOLE), "--data.init_args.num_env", "3")
    assert "data.init_args.num_env: OnPolicyDataModule has no argument 'num_env'; did you mean 'num_envs'" in error
    assert error.startswith("lightning-rl validate: error:")


def test_a_wrong_type_flag_names_the_expected_type_and_the_value(capsys):
    error = run_error(capsys, "fit", "--config", str(CARTPOLE), "--model.init_args.minibatch_size", "256.5")
    assert "model.init_args.minibatch_size: expected an int or None, got 256.5" in error


def test_a_wrong_type_in_yaml_names_the_expected_type_and_the_value(tmp_path, capsys):
    def wrong(config):
        config["model"]["init_args"]["minibatch_size"] = 256.5

    error = run_error(capsys, "fit", "--config", edited_config(tmp_path, wrong))
    assert "model.init_args.minibatch_size: expected an int or None, got 256.5" in error


def test_a_wrong_trainer_type_names_the_expected_type(capsys):
    error = run_error(capsys, "fit", "--config", str(CARTPOLE), "--trainer.max_epochs", "3.5")
    assert "trainer.max_epochs: expected an int or None, got 3.5" in error
    assert "see lightning-rl fit --help" in error


def test_an_unknown_trainer_key_in_yaml_suggests_the_trainer_argument(tmp_path, capsys):
    def typo(config):
        config["trainer"]["max_epoch"] = config["trainer"].pop("max_epochs")

    error = run_error(capsys, "fit", "--config", edited_config(tmp_path, typo))
    assert "unknown key 'trainer.max_epoch'; did you mean 'trainer.max_epochs'" in error


def test_a_callbacks_argument_typo_names_the_callback_and_suggests_the_argument(tmp_path, capsys):
    def typo(config):
        early_stopping = config["trainer"]["callbacks"][0]["init_args"]
        early_stopping["monitr"] = early_stopping.pop("monitor")

    error = run_error(capsys, "fit", "--config", edited_config(tmp_path, typo))
    assert "trainer.callbacks: EarlyStopping has no argument 'monitr'; did you mean 'monitor'?" in error


def test_a_mistyped_class_name_suggests_the_classes_of_that_section(capsys):
    error = run_error(capsys, "fit", "--config", str(CARTPOLE), "--data", "OfPolicyDataModule")
    assert "data: expected a LightningDataModule or None, got OfPolicyDataModule; did you mean 'OffPolicyDataModule'" in error


def test_a_flag_that_prefixes_another_is_an_unknown_key_not_an_abbreviation(capsys):
    # argparse's abbreviations took --trainer.max_epoch for --trainer.max_epochs and trained.
    error = run_error(capsys, "fit", "--config", str(CARTPOLE), "--trainer.max_epoch", "3")
    assert "unknown key 'trainer.max_epoch'; did you mean 'trainer.max_epochs'" in error


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    lines = CARTPOLE.read_text().splitlines()
    number = next(index for index, line in enumerate(lines, 1) if line.strip().startswith("gamma:"))
    lines[number - 1] = lines[number - 1].replace("0.98", "[0.98")
    path.write_text("\n".join(lines) + "\n")
    error = run_error(capsys, "fit", "--config", str(path))
    assert f"{path}, line {number + 1}: YAML syntax error" in error
    assert "<unicode string>" not in error


def test_describe_type_reads_unions_literals_and_generics():
    from typing import Literal

    assert describe_type(int | None) == "an int or None"
    assert describe_type(Literal["value", "norm"]) == "one of 'value', 'norm'"
    assert describe_type(float) == "a float"
    assert describe_type(list[int]) == "a list[int]"
