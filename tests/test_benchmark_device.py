"""``--device`` of ``benchmarks/off_policy.py``, ``ppo_cartpole.py`` and ``profile_step.py`` (and their children)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
REPO_ROOT = BENCHMARKS.parent


@pytest.fixture
def children(import_benchmark):
    return import_benchmark("_children")


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
@pytest.mark.parametrize("script", ["off_policy.py", "ppo_cartpole.py", "profile_step.py", "handwritten_ppo.py"])
def test_device_cuda_without_cuda_fails_with_one_line(script: str):
    result = _run(script, "--device", "cuda")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "--device cuda: CUDA is not available here (torch.cuda.is_available() is False); use --device cpu"
    ]


def test_ours_runs_on_the_trainer_of_the_device_asked_for(children):
    assert children.trainer_device_args("cuda") == ["--trainer.accelerator", "gpu", "--trainer.devices", "1"]
    # Explicit on the CPU too: the Trainer's default accelerator ("auto") would take a GPU where there is one.
    assert children.trainer_device_args("cpu") == ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]


def test_every_child_gets_the_device(children):
    off_policy = importlib.import_module("off_policy")
    for variant in ("ours", "handwritten", "sb3"):
        command = off_policy.child_command("dqn", variant, 0, 100, "examples/dqn_cartpole.yaml", "{}", 1, "cuda")
        assert command[command.index("--device") + 1] == "cuda", variant
    ppo_cartpole = importlib.import_module("ppo_cartpole")
    args = ppo_cartpole.parse_args(["--device", "cpu"])
    for variant in ("ours", "handwritten", "sb3"):
        command = ppo_cartpole.child_command(variant, 0, args)
        assert command[command.index("--device") + 1] == "cpu", variant


def test_the_handwritten_dqn_trains_on_the_cpu_device_and_reports_cpu_time(import_benchmark, monkeypatch, capsys):
    off_policy = import_benchmark("off_policy")
    monkeypatch.setattr(sys, "argv", ["off_policy.py", "--algo", "dqn", "--print-hparams", "--max-env-steps", "600"])
    off_policy.main()  # in this process: the JSON the children get
    data = json.loads(capsys.readouterr().out)
    data["data"].update(learning_starts=100, train_freq=64)
    result = _run(
        "handwritten_dqn.py", "--hparams", json.dumps(data), "--max-env-steps", "300", "--device", "cpu", timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    end = next(line for line in result.stdout.splitlines() if line.startswith("TRAINING_END"))
    fields = dict(token.split("=") for token in end.split()[1:])
    assert int(fields["env_steps"]) >= 300 and float(fields["cpu_s"]) > 0
