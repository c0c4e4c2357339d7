"""``--threads``: fit and validate run torch with one intra-op thread unless told otherwise (``cli/threads.py``).

Both ranks of a command-line DDP fit getting the chosen count: test_ddp_fit.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from lightning_rl.cli import LightningRLCLI, main
from lightning_rl.cli.threads import apply_threads, chosen_threads

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = str(REPO / "examples" / "ppo_cartpole.yaml")


class ThreadsAtFitStart(Callback):
    """Records torch's intra-op thread count and ``OMP_NUM_THREADS`` when the fit starts."""

    def __init__(self) -> None:
        self.seen: tuple[int, str | None] | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.seen = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))


@pytest.fixture
def threads_restored(monkeypatch):
    """Start each test at 3 threads with no OMP_NUM_THREADS; restore both afterwards."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(3)
    yield monkeypatch
    torch.set_num_threads(before)


def fit_threads(tmp_path: Path, *flags: str) -> tuple[int, str | None]:
    """Run a tiny CLI fit; the thread count and OMP_NUM_THREADS its fit started with."""
    probe = ThreadsAtFitStart()
    LightningRLCLI(
        args=[
            "fit", "--config", CARTPOLE,
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false",
            "--trainer.logger", "false",
            "--data.init_args.max_env_steps", "128",
            "--data.init_args.rollouts_per_epoch", "1",
            "--data.init_args.evaluation_num_episodes", "1",
            "--model.init_args.num_epochs", "1",
            *flags,
        ],  # fmt: skip
        trainer_defaults={"callbacks": [probe]},
        save_config_callback=None,
    )
    assert probe.seen is not None, "the fit did not start"
    return probe.seen


def test_fit_runs_with_one_thread_by_default(tmp_path, threads_restored):
    assert fit_threads(tmp_path) == (1, "1")


def test_threads_flag_sets_the_count(tmp_path, threads_restored):
    assert fit_threads(tmp_path, "--threads", "2") == (2, "2")


def test_threads_zero_leaves_torch_default(tmp_path, threads_restored):
    assert fit_threads(tmp_path, "--threads", "0") == (3, None)


def test_omp_num_threads_in_the_environment_is_left_to_torch(tmp_path, threads_restored):
    threads_restored.setenv("OMP_NUM_THREADS", "2")
    assert fit_threads(tmp_path) == (3, "2")  # torch read it at import; the CLI does not touch it


def test_threads_flag_wins_over_omp_num_threads(tmp_path, threads_restored):
    threads_restored.setenv("OMP_NUM_THREADS", "4")
    assert fit_threads(tmp_path, "--threads", "2") == (2, "2")


def test_negative_threads_is_a_usage_error(tmp_path, threads_restored, capsys):
    with pytest.raises(SystemExit) as exit_:
        fit_threads(tmp_path, "--threads", "-1")
    assert exit_.value.code == 2
    assert "threads" in capsys.readouterr().err
    assert torch.get_num_threads() == 3


def test_chosen_threads_rules():
    assert chosen_threads(None, {}) == 1
    assert chosen_threads(None, {"OMP_NUM_THREADS": "8"}) is None
    assert chosen_threads(0, {}) is None
    assert chosen_threads(5, {"OMP_NUM_THREADS": "8"}) == 5
    with pytest.raises(ValueError):
        chosen_threads(-1, {})
    environ: dict[str, str] = {}
    before = torch.get_num_threads()
    try:
        assert apply_threads(None, environ) == 1
        assert environ == {"OMP_NUM_THREADS": "1"}
    finally:
        torch.set_num_threads(before)


def test_a_subprocess_fit_gets_one_thread_without_omp_num_threads(tmp_path):
    """From the command line, in a fresh process where torch starts at one thread per core."""
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO), environment.get("PYTHONPATH", "")])
    code = (
        "import sys, torch; from lightning_rl.cli import main; "
        "from lightning_rl.cli import lightning_cli as m; "
        "m.LightningRLCLI.instantiate_classes = lambda self: (print('THREADS', torch.get_num_threads()), sys.exit(0)); "
        "main(sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "fit", "--config", CARTPOLE, "--trainer.default_root_dir", str(tmp_path)],
        capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert "THREADS 1" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_help_says_the_default_and_how_to_change_it(subcommand, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the help is made, not read from a cache
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_:
        main([subcommand, "--help"])
    assert exit_.value.code in (0, None)
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--threads THREADS" in help_text
    assert "Default: 1" in help_text and "OMP_NUM_THREADS" in help_text and "0 leaves torch's own default" in help_text


@pytest.mark.parametrize("command", ["evaluate", "record"])
def test_evaluate_and_record_take_threads_too(command):
    module = __import__(f"lightning_rl.cli.{command}_command", fromlist=["build_parser"])
    help_text = " ".join(module.build_parser().format_help().split())
    assert "--threads THREADS" in help_text and "Default: 1" in help_text
