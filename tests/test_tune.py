"""lightning-rl tune: the tune file's checks, pruning at env steps, a tiny study end to end, and resuming after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from _process_tree import descendants, still_running
from _slow_trials import HANG_VARIABLE
from lightning.pytorch import Trainer
from test_cli import CARTPOLE, REPO

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.callbacks.optuna_trials import PRUNED_AT_ATTR, require_optuna
from lightning_rl.callbacks.pruning import OptunaPruning
from lightning_rl.cli import main
from lightning_rl.cli.lightning_cli import LightningRLCLI
from lightning_rl.cli.tune_command import BEST_CONFIG_FILE
from lightning_rl.cli.tune_settings import read_tune_file
from lightning_rl.data import OnPolicyDataModule

EXAMPLE = REPO / "examples" / "tune_ppo_cartpole.yaml"
# Each trial: one 256-env-step rollout, one evaluation of 2 episodes (a fit of ~5 s, mostly imports).
TINY_TRIAL = {
    "data.init_args.max_env_steps": 256,
    "data.init_args.rollouts_per_epoch": 1,
    "data.init_args.evaluation_num_episodes": 2,
    "model.init_args.num_epochs": 1,
    "trainer.enable_progress_bar": False,
}
SEARCH_SPACE = {
    "model.init_args.lr": {"type": "float", "low": 1.0e-4, "high": 3.0e-3, "log": True},
    "model.init_args.minibatch_size": {"type": "categorical", "choices": [64, 128]},
}


def tune_file(tmp_path: Path, **content) -> Path:
    """A tune file over the PPO CartPole example with a tiny trial; ``content`` replaces its top-level keys."""
    path = tmp_path / "tune.yaml"
    default = {
        "config": CARTPOLE,
        "output_dir": str(tmp_path / "out"),
        "search_space": SEARCH_SPACE,
        "trial": TINY_TRIAL,
        "study": {"n_trials": 2, "n_jobs": 1, "seed": 0, "pruner": "none"},
    }
    path.write_text(yaml.safe_dump({**default, **content}))
    return path


def tune_error(path: Path, capsys) -> str:
    """The one line ``lightning-rl tune --config path`` ends with (status 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--config", str(path)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


# ---------------------------------------------------------------------------------------------
# The tune file
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,expected",
    [
        ({"serch_space": SEARCH_SPACE}, "serch_space: unknown key; did you mean search_space?"),
        (
            {"search_space": {"model.init_args.learning_rate": {"type": "float", "low": 0.1, "high": 1}}},
            "search_space: model.init_args.learning_rate: not a key of the training config (set it there or under "
            "trial: to search it); did you mean model.init_args.lr?",
        ),
        (
            {"search_space": {"trainer.max_epochs": {"type": "int", "low": 1, "high": 2}}},
            "only the training config's model and data sections",
        ),
        (
            {"search_space": {"model.init_args.gamma": {"type": "float", "low": 0.99, "high": 0.9}}},
            "model.init_args.gamma: low (0.99) is above high (0.9)",
        ),
        (
            {"search_space": {"model.init_args.gamma": {"type": "float", "low": 0.0, "high": 0.9, "log": True}}},
            "log: a log scale needs low > 0",
        ),
        (
            {"search_space": {"model.init_args.num_epochs": {"type": "int", "low": 1.5, "high": 3}}},
            "num_epochs: low: expected a finite int",
        ),
        (
            {"search_space": {"model.init_args.gamma": {"type": "float", "low": 0.9, "hi": 0.99}}},
            "gamma: hi: unknown key; did you mean high?",
        ),
        ({"search_space": {"model.init_args.gamma": {"type": "uniform"}}}, "type: expected one of float, int, categorical"),
        (
            {"search_space": {"model.init_args.minibatch_size": {"type": "categorical", "choices": []}}},
            "choices: expected a non-empty list",
        ),
        ({"study": {"pruner": "medain"}}, "study: pruner: expected one of median, successive_halving, none"),
        ({"study": {"n_trial": 3}}, "study: n_trial: unknown key; did you mean n_trials?"),
        ({"study": {"n_jobs": 0}}, "study: n_jobs: expected an int >= 1"),
        ({"study": {"storage": "postgresql://host/db"}}, "study: storage: expected a SQLite file"),
        ({"study": {"pruner": "median", "pruner_args": {"n_warmup": 3}}}, "pruner_args of the median pruner"),
        ({"config": "no_such_config.yaml"}, "cannot read the training config"),
    ],
)
def test_a_bad_tune_file_is_one_line_naming_the_key(tmp_path, capsys, content, expected):
    error = tune_error(tune_file(tmp_path, **content), capsys)
    assert error.startswith("lightning-rl tune: error: ") and expected in error, error
    assert not (tmp_path / "out" / "study.db").exists()


def test_a_search_key_must_be_in_the_training_config_or_set_under_trial(tmp_path, capsys):
    # The example's model_config has no vf_share_layers: searching it needs trial: to set it first.
    key = "model.init_args.model_config.vf_share_layers"
    space = {key: {"type": "categorical", "choices": [True, False]}}
    error = tune_error(tune_file(tmp_path, search_space=space), capsys)
    assert f"{key}: not a key of the training config (set it there or under trial: to search it)" in error
    path = tune_file(tmp_path, search_space=space, trial={**TINY_TRIAL, key: False})
    assert read_tune_file(path).search_space[0].choices == (True, False)


def test_without_optuna_the_command_says_which_extra_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lightning-rl\[tune\]'"):
        require_optuna()
    error = tune_error(tune_file(tmp_path), capsys)
    assert "pip install 'lightning-rl[tune]'" in error


def test_the_example_tune_file_is_valid(tmp_path):
    settings = read_tune_file(EXAMPLE, output_dir=tmp_path)
    assert [p.key.rsplit(".", 1)[-1] for p in settings.search_space] == [
        "lr", "gamma", "gae_lambda", "num_epochs", "minibatch_size",
    ]  # fmt: skip
    assert settings.trial_overrides == {"data.init_args.max_env_steps": 30000}
    assert (settings.study.n_trials, settings.study.n_jobs, settings.study.sampler) == (20, 2, "tpe")
    assert settings.study.storage == f"sqlite:///{tmp_path.resolve() / 'study.db'}"


# ---------------------------------------------------------------------------------------------
# Pruning at env steps
# ---------------------------------------------------------------------------------------------


def test_the_pruning_callback_reports_at_env_steps_and_stops_a_pruned_fit():
    # Pruned at the first evaluation past 500 env steps whose return is below 1000 (every one).
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=1000.0, n_warmup_steps=500))
    trial = study.ask()
    pruning = OptunaPruning(trial)
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=64, rollouts_per_epoch=1, max_env_steps=2048,
        evaluation_num_episodes=2,
    )  # fmt: skip
    trainer = Trainer(
        max_epochs=-1, callbacks=[pruning], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=1, minibatch_size=64), datamodule=data)
    reported = study.get_trials()[0].intermediate_values
    # One report per evaluation, keyed by env steps (128 per rollout), not by epoch.
    assert list(reported) == [128, 256, 384, 512]
    assert pruning.pruned_at == 512 and data.num_env_steps_sampled_lifetime == 512  # stopped there, not at 2048
    with pytest.raises(optuna.TrialPruned):
        pruning.check_pruned()


def _fit_with_stored_trial_pruning(rank: int, world_size: int, storage: str) -> dict:
    from lightning.pytorch import Trainer

    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.callbacks.pruning import StoredTrialPruning
    from lightning_rl.data import OnPolicyDataModule

    pruning = StoredTrialPruning(storage, "ddp", trial_number=1, pruner="median", pruner_args={"n_startup_trials": 1})
    # Per rank: 2 envs x 32 steps; 128 env steps per rollout over both ranks, an evaluation after each.
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=32, rollouts_per_epoch=1, max_env_steps=1024,
        evaluation_num_episodes=2,
    )  # fmt: skip
    trainer = Trainer(
        strategy="ddp", devices=world_size, accelerator="cpu", max_epochs=-1, callbacks=[pruning], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=1, minibatch_size=32), datamodule=data)
    return {"pruned_at": pruning.pruned_at, "env_steps": data.num_env_steps_sampled_lifetime, "has_trial": pruning.trial is not None}


def test_under_ddp_rank_0_reports_and_every_rank_stops_when_pruned(tmp_path):
    from ranks import run_on_ranks

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="ddp", storage=storage, direction="maximize")
    # A finished trial far above anything 128 env steps reach: the median pruner prunes at the first report.
    study.add_trial(optuna.trial.create_trial(value=500.0, intermediate_values={128: 500.0, 256: 500.0}))
    study.ask()  # trial 1, running: the fit's
    results = run_on_ranks(_fit_with_stored_trial_pruning, storage)
    assert [result["pruned_at"] for result in results] == [128, 128]
    assert [result["env_steps"] for result in results] == [128, 128]  # both stopped after the first evaluation
    assert [result["has_trial"] for result in results] == [True, False]  # only rank 0 opened the storage
    trial = study.get_trials()[1]
    assert list(trial.intermediate_values) == [128] and trial.user_attrs[PRUNED_AT_ATTR] == 128


# ---------------------------------------------------------------------------------------------
# A study end to end, and resuming one after kill -9
# ---------------------------------------------------------------------------------------------


def test_a_tiny_study_writes_trial_runs_and_a_best_config_that_fit_accepts(tmp_path, capsys):
    main(["tune", "--config", str(tune_file(tmp_path))])
    out = capsys.readouterr().out
    output = tmp_path / "out"
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{output / 'study.db'}")
    trials = study.get_trials()
    assert [trial.state.name for trial in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:
        assert list(trial.intermediate_values) == [256]  # reported at the env-step count
        assert trial.value == trial.intermediate_values[256]
        assert list((output / f"trial_{trial.number}" / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    best = study.best_trial
    assert f"best trial {best.number}" in out and str(output / BEST_CONFIG_FILE) in out
    config = yaml.safe_load((output / BEST_CONFIG_FILE).read_text())
    assert config["model"]["init_args"]["lr"] == best.params["model.init_args.lr"]
    assert config["data"]["init_args"]["max_env_steps"] == 256
    callbacks = [callback["class_path"] for callback in config["trainer"]["callbacks"]]
    assert not any("Pruning" in path for path in callbacks) and "default_root_dir" not in config["trainer"]
    # `lightning-rl fit --config best_config.yaml` takes it as it is.
    with pytest.raises(SystemExit) as exit_:
        LightningRLCLI(args=["fit", "--config", str(output / BEST_CONFIG_FILE), "--print_config"])
    assert exit_.value.code in (0, None)
    assert "lr: " in capsys.readouterr().out
    # Running it again finds the study finished, and runs nothing.
    main(["tune", "--config", str(tune_file(tmp_path))])
    assert "already has 2 finished trials" in capsys.readouterr().out
    assert len(study.get_trials()) == 2


def test_a_ddp_trial_runs_its_second_rank_with_the_fit_command_line_and_one_thread_per_rank(tmp_path, monkeypatch):
    """A trial is forked, not started as ``python -m lightning_rl fit``, yet runs as that command would.

    Lightning's DDP relaunch of rank 1 works, and both ranks compute on one thread (the forked
    rank 0's torch was loaded by the fork server, without the trial's ``OMP_NUM_THREADS``).
    """
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), str(REPO)]))  # rank 1 finds the probe
    trial = {
        **TINY_TRIAL, "trainer.strategy": "ddp", "trainer.devices": 2, "trainer.accelerator": "cpu",
        "trainer.callbacks": [{"class_path": "_thread_probe.PrintThreads"}],
    }  # fmt: skip
    study_settings = {"n_trials": 1, "n_jobs": 1, "seed": 0, "pruner": "none"}
    main(["tune", "--config", str(tune_file(tmp_path, trial=trial, study=study_settings))])
    output = tmp_path / "out"
    log = (output / "trial_0" / "fit.log").read_text()
    assert "All distributed processes registered. Starting with 2 processes" in log, log[-3000:]
    assert "RANK 0 THREADS 1 OMP 1" in log and "RANK 1 THREADS 1 OMP 1" in log, log[-3000:]
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{output / 'study.db'}")
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE"], log[-3000:]


def _tune_process(path: Path, tmp_path: Path, **variables: str) -> subprocess.Popen:
    paths = os.pathsep.join([str(REPO), str(REPO / "tests")])
    environment = {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1", **variables}
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_rl", "tune", "--config", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, cwd=tmp_path,
    )  # fmt: skip


def _writes_its_output_to(pid: int, path: Path) -> bool:
    """Whether process ``pid``'s stdout is the file ``path`` (a trial's fit writes to its fit.log)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1") == str(path)
    except OSError:
        return False


def test_a_study_killed_with_kill_9_resumes_without_losing_or_repeating_finished_trials(
    tmp_path, monkeypatch, capsys
):
    # The first command's trials after trial_0 hang until killed; the second command's run. The
    # first is a process of its own, to be killed; the second runs in this one (a fresh command
    # process would only add its imports).
    trial = {**TINY_TRIAL, "trainer.callbacks": [{"class_path": "_slow_trials.HangAfterTheFirstTrial"}]}
    path = tune_file(tmp_path, trial=trial, study={"n_trials": 3, "n_jobs": 1, "seed": 0, "pruner": "none"})
    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    first = _tune_process(path, tmp_path, **{HANG_VARIABLE: "1"})
    # Kill it once a trial has finished and the next one is running.
    deadline = time.monotonic() + 120
    states: list[str] = []
    while time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.5)
        # Read the storage only once the command has made it (a reader would make its tables too).
        if not (tmp_path / "out" / "trial_0").exists():
            continue
        states = [t.state.name for t in optuna.load_study(study_name="tune", storage=storage).get_trials()]
        if states[:1] == ["COMPLETE"] and states[-1] == "RUNNING":
            break
    if first.poll() is not None:
        pytest.fail(f"the study ended before it was killed: {first.communicate()[0]}")
    assert states[:1] == ["COMPLETE"] and states[-1] == "RUNNING", states
    # The running trial's fit is a process below the command, writing its fit.log (once started).
    fit_log = tmp_path / "out" / f"trial_{len(states) - 1}" / "fit.log"
    below = descendants(first.pid)
    while not any(_writes_its_output_to(pid, fit_log) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.2)
        below = descendants(first.pid)
    assert any(_writes_its_output_to(pid, fit_log) for pid in below), f"no process writes {fit_log}"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    before = optuna.load_study(study_name="tune", storage=storage).get_trials()
    finished_before = {t.number: (t.value, t.params) for t in before if t.state.name == "COMPLETE"}
    interrupted = [t for t in before if t.state.name == "RUNNING"]
    assert len(interrupted) == 1
    assert fit_log.parent.name == f"trial_{interrupted[0].number}"
    # That fit, and every other process the command started, died with it (Linux:
    # PR_SET_PDEATHSIG; the fit's parent is the fork server, which ends with the command).
    deadline = time.monotonic() + 10
    while still_running(below) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = still_running(below)
    for pid in left:  # the hung fit would otherwise sleep on after a failure
        os.kill(pid, signal.SIGKILL)
    assert not left

    monkeypatch.chdir(tmp_path)
    main(["tune", "--config", str(path)])
    output = capsys.readouterr().out
    assert f"trial {interrupted[0].number} was interrupted" in output
    after = optuna.load_study(study_name="tune", storage=storage).get_trials()
    complete = {t.number: (t.value, t.params) for t in after if t.state.name == "COMPLETE"}
    # The finished trials are kept as they were, none run again; the study ends with n_trials finished.
    assert {n: complete[n] for n in finished_before} == finished_before
    assert len(complete) == 3
    assert after[interrupted[0].number].state.name == "FAIL"
    retried = [t for t in after if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert len(retried) == 1 and retried[0].params == interrupted[0].params and retried[0].state.name == "COMPLETE"
    assert (tmp_path / "out" / BEST_CONFIG_FILE).exists()


def test_trials_whose_fit_fails_are_failed_and_the_study_stops_after_three_in_a_row(tmp_path, capsys):
    # A minibatch larger than the 256-step rollout: every fit stops with a usage error.
    space = {"model.init_args.minibatch_size": {"type": "categorical", "choices": [512]}}
    error = tune_error(tune_file(tmp_path, search_space=space), capsys)
    assert "3 trials failed in a row; see their fit.log" in error
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")
    assert [trial.state.name for trial in study.get_trials()] == ["FAIL"] * 3
    assert "minibatch_size" in (tmp_path / "out" / "trial_0" / "fit.log").read_text()
