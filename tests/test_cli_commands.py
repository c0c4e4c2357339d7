"""The lightning-rl command: its subcommands, help, env ids and factories, short class names, a clean run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from _helpers import bc_spec
from _registered_envs import EPISODE_STEPS, NAMESPACED_ID
from test_cli import CARTPOLE, REPO, quick

import lightning_rl.cli.lightning_cli as lightning_cli
from lightning_rl.cli import _NOT_OFFERED, SUBCOMMANDS, main
from lightning_rl.cli.help_cache import HelpCache
from lightning_rl.cli.lightning_cli import TRAINER_SUBCOMMANDS, LightningRLCLI
from lightning_rl.data import OnPolicyDataModule
from lightning_rl.env.env_factory import resolve_env
from lightning_rl.env.env_runner import EnvRunner

TESTS = Path(__file__).resolve().parent
# Optional packages that only some features need (ONNX export, Minari datasets, PettingZoo envs,
# MuJoCo envs, rendering, the SB3 baseline, Optuna), measured at 10-230 ms of import each beside torch
# and Lightning on a 2-core machine: none of them may load on the way to a PPO fit's first steps.
OPTIONAL_HEAVY_IMPORTS = (
    "onnx", "onnxruntime", "onnxscript", "minari", "h5py", "pettingzoo", "mujoco", "pygame", "imageio",
    "stable_baselines3", "optuna",
)  # fmt: skip
# Subprocesses import this checkout and the tests' env module, on one intra-op thread.
PRELUDE = "import torch; torch.set_num_threads(1); "


def run_python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this checkout and tests/ on the path."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), **env}
    environment.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment
    )


# ---------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------


def test_top_level_help_lists_the_subcommands_without_loading_torch_or_lightning(tmp_path):
    result = run_python(
        "import sys; from lightning_rl.cli import main; main(['--help']); "
        "print(sorted(name for name in ('torch', 'lightning') if name in sys.modules))",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    for name in ("fit", "validate", "evaluate", "export", "record", "tune"):
        assert f"\n  {name} " in result.stdout
    assert "test" not in result.stdout.split("options:")[0] and "predict" not in result.stdout
    assert result.stdout.rstrip().endswith("[]"), "--help imported torch or Lightning"


@pytest.mark.parametrize("command,advice", [("test", "lightning-rl evaluate"), ("predict", "lightning_rl.Policy")])
def test_test_and_predict_are_refused_with_what_to_use_instead(command, advice, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--config", CARTPOLE])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"'{command}' is not offered" in error and advice in error
    # Lightning's CLI itself no longer offers them either.
    assert set(LightningRLCLI.subcommands()) == set(TRAINER_SUBCOMMANDS) == {"fit", "validate"}


def test_an_unknown_subcommand_is_a_usage_error_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["valdiate"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "unknown subcommand 'valdiate'" in error and "did you mean 'validate'?" in error


def test_the_training_tutorial_names_the_subcommands_the_command_offers():
    text = (REPO / "docs" / "tutorials" / "train.md").read_text()
    sentence = re.search(r"`lightning-rl` has (\w+) subcommands:(.*?)\.\s+Lightning's", text, re.S)
    assert sentence, "docs/tutorials/train.md no longer says how many subcommands lightning-rl has"
    count, names = sentence.group(1), re.findall(r"`([\w-]+)`", sentence.group(2))
    numbers = ("zero one two three four five six seven eight nine ten eleven twelve").split()
    assert names == list(SUBCOMMANDS), "train.md lists other subcommands than lightning_rl.cli.SUBCOMMANDS"
    assert numbers.index(count) == len(SUBCOMMANDS), f"train.md says {count} subcommands"
    for name in _NOT_OFFERED:  # and says which of Lightning's are not offered
        assert f"`{name}`" in text[sentence.end() :].split("\n\n")[0]


@pytest.mark.parametrize(
    "command,args",
    [
        ("evaluate", ["--ckpt_path", "last.ckpt", "--num_episodes", "3"]),
        ("export", ["--ckpt_path", "last.ckpt", "--format", "onnx", "--output", "policy.onnx"]),
        ("record", ["--ckpt_path", "last.ckpt", "--num_episodes", "3", "--dataset_id", "cartpole/test-v0"]),
        ("tune", ["--config", "tune.yaml", "--n_trials", "3"]),
    ],
)
def test_evaluate_and_export_run_their_own_module_with_the_remaining_arguments(
    command, args, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "last.ckpt").touch()
    received = []
    module = types.ModuleType(f"lightning_rl.cli.{command}_command")
    module.main = received.append
    monkeypatch.setitem(sys.modules, module.__name__, module)
    main([command, *args])
    assert received == [args]
    assert set(SUBCOMMANDS) == {"fit", "validate", "evaluate", "export", "record", "tune"}


@pytest.mark.parametrize(
    "args,answer",
    [
        (["evaluate", "--help"], "usage: lightning-rl evaluate"),
        (["export", "--help"], "usage: lightning-rl export"),
        (["record", "--help"], "usage: lightning-rl record"),
        (["evaluate", "--num_episodes", "3"], "the following arguments are required: --ckpt_path"),
        (["export", "--ckpt_path", "missing.ckpt", "--format", "onnx", "--output", "p.onnx"], "missing.ckpt: no such"),
        (["record", "--dataset_id", "a/b-v0", "--num_episodes", "0"], "expected an int >= 1, got 0"),
    ],
)
def test_help_and_usage_errors_of_the_checkpoint_commands_answer_without_loading_torch_or_lightning(
    args, answer, tmp_path
):
    result = run_python(
        "import sys\nfrom lightning_rl.cli import main\ntry:\n"
        f"    main({args!r})\n"
        "finally:\n    print(sorted(name for name in ('torch', 'lightning') if name in sys.modules))",
        tmp_path,
    )
    assert answer in result.stdout + result.stderr
    assert result.returncode == (0 if "--help" in args else 2), result.stderr
    assert result.stdout.rstrip().endswith("[]"), "the command imported torch or Lightning before parsing"


def test_the_export_parser_offers_the_formats_export_policy_writes():
    from lightning_rl.cli.command_parsers import EXPORT_FORMATS
    from lightning_rl.policy.export import EXPORT_FORMATS as WRITTEN

    assert EXPORT_FORMATS == WRITTEN


# ---------------------------------------------------------------------------------------------
# Help: cached, and short class names
# ---------------------------------------------------------------------------------------------


def test_fit_help_is_answered_from_the_cache_that_the_first_call_writes(tmp_path):
    code = (
        "import sys; from lightning_rl.cli import main\n"
        "try:\n    main(['fit', '--help'])\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
        "print('LIGHTNING LOADED' if 'lightning' in sys.modules else 'NO LIGHTNING', file=sys.stderr)"
    )
    environment = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "100"}
    first = run_python(code, tmp_path, **environment)
    second = run_python(code, tmp_path, **environment)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "--model.init_args" in first.stdout or "--model CONFIG" in first.stdout
    assert first.stdout == second.stdout
    assert "LIGHTNING LOADED" in first.stderr and "NO LIGHTNING" in second.stderr


def test_the_help_cache_holds_only_help_that_depends_on_installed_code_and_is_dropped_when_the_key_changes(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    not_cached = (
        ["fit"],
        ["fit", "--config", "x.yaml", "--help"],
        ["x", "-h"],
        ["fit", "--model.help", "my_package.MyLearner"],  # the user's code: not in the key
        ["fit", "--model.help", "PPOLearner", "--seed_everything", "1"],
        ["fit", "--model.help", "../PPOLearner"],
        ["fit", "--model", "PPOLearner"],
    )
    for args in not_cached:
        assert HelpCache.for_args(args, ("fit", "validate")) is None, args
    cache = HelpCache.for_args(["fit", "-h"], ("fit", "validate"))
    assert cache is not None and cache.read() is None
    cache.write("usage: lightning-rl fit ...\n")
    assert HelpCache.for_args(["fit", "--help"], ("fit", "validate")).read() == "usage: lightning-rl fit ...\n"
    assert HelpCache.for_args(["validate", "--help"], ("fit", "validate")).read() is None
    # A class's help has a file of its own, per flag and class name.
    model_help = HelpCache.for_args(["fit", "--model.help", "PPOLearner"], ("fit", "validate"))
    assert model_help is not None and model_help.read() is None
    model_help.write("usage: PPOLearner ...\n")
    assert HelpCache.for_args(["fit", "--model.help", "PPOLearner"], ("fit", "validate")).read() == "usage: PPOLearner ...\n"
    for args in (["fit", "--model.help", "DQNLearner"], ["fit", "--data.help", "PPOLearner"], ["validate", "--model.help", "PPOLearner"]):
        assert HelpCache.for_args(args, ("fit", "validate")).read() is None, args
    assert HelpCache.for_args(["fit", "--help"], ("fit", "validate")).read() == "usage: lightning-rl fit ...\n"
    dotted = HelpCache.for_args(["fit", "--data.help", "lightning_rl.data.OffPolicyDataModule"], ("fit", "validate"))
    assert dotted is not None
    # jsonargparse reads JSONARGPARSE_* variables when it builds the parser: another value, another help.
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true")
    assert HelpCache.for_args(["fit", "--help"], ("fit", "validate")).read() is None


@pytest.mark.parametrize(
    "flag,name,argument",
    [("--model.help", "PPOLearner", "--model.clip_param"), ("--data.help", "OffPolicyDataModule", "--data.train_freq")],
)
def test_help_of_a_class_by_its_short_name_is_built_once_then_read_from_the_cache(
    flag, name, argument, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a cache of this test's own
    with pytest.raises(SystemExit) as exit_:
        main(["fit", flag, name])
    assert exit_.value.code == 0
    built = capsys.readouterr().out
    assert argument in built

    def not_built_again(*args, **kwargs):
        raise AssertionError("the class's help was built again instead of read from the cache")

    monkeypatch.setattr(lightning_cli, "LightningRLCLI", not_built_again)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", flag, name])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == built


def test_a_config_names_classes_by_short_name_and_the_env_by_a_factory_path(tmp_path):
    config = yaml.safe_load(Path(CARTPOLE).read_text())
    config["model"]["class_path"] = "PPOLearner"
    config["data"]["class_path"] = "OnPolicyDataModule"
    config["data"]["init_args"]["env"] = "_registered_envs.make_short_cartpole"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = LightningRLCLI(args=["fit", "--config", str(path), *quick(tmp_path)])
    assert type(cli.model).__name__ == "PPOLearner" and type(cli.datamodule).__name__ == "OnPolicyDataModule"
    # The factory's episodes end after EPISODE_STEPS steps; CartPole-v1's own limit is 500.
    assert 0 < cli.trainer.callback_metrics["eval/episode_return_mean"] <= EPISODE_STEPS
    recorded = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert recorded["data"]["init_args"]["env"] == "_registered_envs.make_short_cartpole"


# ---------------------------------------------------------------------------------------------
# Env ids and factories
# ---------------------------------------------------------------------------------------------


def test_a_namespaced_id_given_as_module_colon_id_on_the_command_line_reaches_the_data_module(tmp_path):
    env = f"_registered_envs:{NAMESPACED_ID}"

    class NoRun(LightningRLCLI):
        def _run_subcommand(self, subcommand: str) -> None:
            pass

    cli = NoRun(args=["fit", "--config", CARTPOLE, *quick(tmp_path), "--data.init_args.env", env])
    assert cli.datamodule.env == env and cli.datamodule.hparams.env == env


@pytest.mark.parametrize(
    "env",
    [NAMESPACED_ID, f"_registered_envs:{NAMESPACED_ID}", "_registered_envs.make_short_cartpole"],
)
def test_a_namespaced_id_and_a_factory_path_build_the_env_they_name(env):
    import _registered_envs  # noqa: F401  (registers NAMESPACED_ID, as importing a user's package would)

    OnPolicyDataModule(env, num_envs=1)  # accepted by the data module, as from Python
    with EnvRunner(env, num_envs=2, rollout_fragment_length=8, seed=0) as runner:
        spec = bc_spec()
        episodes = runner.sample_episodes(spec.build(), 2)
    assert all(len(episode) <= EPISODE_STEPS for episode in episodes)


def test_a_factory_path_is_called_with_env_kwargs():
    env = "_registered_envs.make_short_cartpole"
    with EnvRunner(env, env_kwargs={"max_episode_steps": 5}, num_envs=1, rollout_fragment_length=8, seed=0) as runner:
        episodes = runner.sample_episodes(bc_spec().build(), 2)
    assert all(len(episode) <= 5 for episode in episodes)


@pytest.mark.parametrize(
    "env,message",
    [
        ("CartPol-v1", "Unknown env id 'CartPol-v1': it is not in gymnasium's registry; did you mean ['CartPole-v1'"),
        ("NoSuchNamespace/Env-v0", "name the package first: 'package:NoSuchNamespace/Env-v0'"),
        ("no_such_module:Env-v0", "Unknown env 'no_such_module:Env-v0': cannot import module 'no_such_module'"),
        ("_registered_envs:Missing-v0", "Unknown env id '_registered_envs:Missing-v0'"),
        ("_registered_envs:make_short_cartpole", "write '_registered_envs.make_short_cartpole'"),
        ("_registered_envs.missing", "module '_registered_envs' has no 'missing' to use as an env factory"),
        ("_registered_envs.NOT_A_FACTORY", "'_registered_envs.NOT_A_FACTORY' is a int, not a callable"),
    ],
)
def test_resolve_env_names_what_is_wrong(env, message):
    with pytest.raises(ValueError) as error:
        resolve_env(env)
    assert message in str(error.value)


def test_resolve_env_returns_ids_as_given_and_factories_as_callables():
    from _registered_envs import make_short_cartpole

    assert resolve_env("CartPole-v1") == "CartPole-v1"
    assert resolve_env(f"_registered_envs:{NAMESPACED_ID}") == f"_registered_envs:{NAMESPACED_ID}"
    assert resolve_env("_registered_envs.make_short_cartpole") is make_short_cartpole


def test_an_unknown_env_id_fails_before_anything_runs_with_a_message_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", CARTPOLE, *quick(tmp_path), "--data.init_args.env", "CartPol-v1"])
    assert exit_.value.code == 2
    assert "Unknown env id 'CartPol-v1'" in capsys.readouterr().err
    assert not (tmp_path / "lightning_logs").exists()


# ---------------------------------------------------------------------------------------------
# A clean run
# ---------------------------------------------------------------------------------------------


def test_a_clean_fit_of_the_example_prints_no_warning_and_loads_no_optional_heavy_package(tmp_path):
    """In a fresh process: the package, every public name, every subpackage and a fit of the
    example print no warning and load none of the optional features' packages.

    The start-up costs of ``lightning-rl fit`` are imports; this fails when an eager import of
    an optional feature's package comes back (a timing assertion would be flaky, this is not).
    One process for both checks: each fresh process spends ~10 s importing torch and Lightning.
    """
    args = ["fit", "--config", CARTPOLE, "--trainer.default_root_dir", str(tmp_path)]
    args += ["--trainer.enable_progress_bar", "false", "--data.init_args.max_env_steps", "512"]
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import lightning_rl\n"
        "for name in lightning_rl.__all__: getattr(lightning_rl, name)\n"
        "for module in pkgutil.iter_modules(lightning_rl.__path__):\n"
        "    if module.ispkg: importlib.import_module(f'lightning_rl.{module.name}')\n"
        f"from lightning_rl.cli import main; main({args!r})\n"
        f"print(json.dumps(sorted(name for name in {OPTIONAL_HEAVY_IMPORTS!r} if name in sys.modules)))"
    )
    result = run_python(PRELUDE + code, tmp_path)
    assert result.returncode == 0, result.stderr
    noisy = [line for line in (result.stderr + result.stdout).splitlines() if "warn" in line.lower()]
    assert noisy == []
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").exists()
    assert json.loads(result.stdout.splitlines()[-1]) == [], "imported on the start-up path"
