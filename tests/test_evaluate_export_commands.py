"""``lightning-rl evaluate`` and ``lightning-rl export``, called as their ``main(args)`` functions.

evaluate: greedy episodes through ``Policy.act`` on held-out seeds, statistics printed and
written as JSON, a video of the first episode, the env from ``--env``, ``--config`` or the
checkpoint (never imported from it). export: ONNX and torch files. Bad input of either: one
line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import PIL.Image
import pytest
import torch
import yaml
from _algorithms import ROWS
from _helpers import resealed, usage_error
from _policy_common import fit_from_the_command_line, observations, run_export

from lightning_rl import Policy
from lightning_rl.cli import evaluate_command, export_command
from lightning_rl.cli.evaluate_command import HELD_OUT_SEED_OFFSET

PPO = next(row for row in ROWS if row.name == "PPO")
SAC = next(row for row in ROWS if row.name == "SAC")
MODULE = "_code_from_checkpoint"


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint ``lightning-rl fit`` wrote for PPO on CartPole-v1 (data seed 0)."""
    return fit_from_the_command_line(PPO, tmp_path_factory.mktemp("fit") / "run")[1]


@pytest.fixture(scope="module")
def learner_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SAC ``save_to_path`` directory: weights, no data-module settings."""
    learner = SAC.make_learner()
    learner.build()
    return Path(learner.save_to_path(str(tmp_path_factory.mktemp("saved") / "sac")))


def played_returns(policy: Policy, env_id: str, seeds: range) -> list[float]:
    """Each seed's greedy episode return, played here by hand, one episode after the other."""
    env = gym.make(env_id)
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns



@pytest.mark.parametrize("seed, num_envs", [(None, 2), (11, 1)])
def test_evaluate_plays_greedy_episodes_on_held_out_seeds_and_reports_them(
    cli_checkpoint, seed, num_envs, tmp_path, capsys
):
    args = ["--ckpt_path", str(cli_checkpoint), "--num_episodes", "3", "--json", str(tmp_path / "stats.json")]
    args += ["--num_envs", str(num_envs)] + ([] if seed is None else ["--seed", str(seed)])
    evaluate_command.main(args)

    first = HELD_OUT_SEED_OFFSET if seed is None else seed  # the run's data seed is 0
    returns = played_returns(Policy.from_checkpoint(cli_checkpoint), "CartPole-v1", range(first, first + 3))
    out = capsys.readouterr().out
    assert f"CartPole-v1 (env from the checkpoint): 3 greedy episodes, seeds {first}..{first + 2}" in out
    assert f"episode_return: mean {np.mean(returns):.3f} std {np.std(returns):.3f}" in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["first_seed"] == first and stats["num_episodes"] == 3
    assert (stats["episode_return_min"], stats["episode_return_max"]) == (min(returns), max(returns))
    assert stats["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert stats["episode_len_mean"] == pytest.approx(np.mean(returns))  # CartPole: one reward per step


def test_evaluate_records_the_first_episode_as_a_video(cli_checkpoint, tmp_path, capsys):
    video_dir = tmp_path / "videos"
    stats_file = tmp_path / "stats.json"
    evaluate_command.main(
        ["--ckpt_path", str(cli_checkpoint), "--num_episodes", "1", "--video", "--video_dir", str(video_dir),
         "--json", str(stats_file)]
    )  # fmt: skip
    videos = sorted(video_dir.iterdir())
    assert [video.name for video in videos] == ["evaluation-episode-0.gif"]
    episode_len = json.loads(stats_file.read_text())["episode_len_mean"]
    with PIL.Image.open(videos[0]) as gif:
        assert gif.size == (600, 400)
        play_ms = 0
        for index in range(gif.n_frames):
            gif.seek(index)
            play_ms += gif.info["duration"]
    # The whole episode at CartPole's 50 frames per second: its reset frame and one per step
    # (identical frames in a row are merged into one shown as long).
    assert play_ms == (episode_len + 1) * 20
    assert f"video: {videos[0]}" in capsys.readouterr().out


def test_evaluate_takes_the_env_from_env_or_config_when_the_checkpoint_names_none(learner_directory, tmp_path, capsys):
    error = usage_error(evaluate_command.main, ["--ckpt_path", str(learner_directory), "--num_episodes", "1"], capsys)
    assert "holds no data-module settings naming an env; pass --env ID or --config your_config.yaml" in error

    evaluate_command.main(["--ckpt_path", str(learner_directory), "--num_episodes", "2", "--env", "Pendulum-v1"])
    assert f"Pendulum-v1 (env from --env): 2 greedy episodes, seeds {HELD_OUT_SEED_OFFSET}.." in capsys.readouterr().out

    config = tmp_path / "sac.yaml"
    data = {"class_path": "lightning_rl.data.OffPolicyDataModule", "init_args": {"env": "Pendulum-v1", "seed": 3}}
    config.write_text(yaml.safe_dump({"data": data}))
    evaluate_command.main(["--ckpt_path", str(learner_directory), "--num_episodes", "1", "--config", str(config)])
    first = HELD_OUT_SEED_OFFSET + 3
    assert f"Pendulum-v1 (env from --config): 1 greedy episodes, seeds {first}..{first}" in capsys.readouterr().out

    # The data section's init_args without a class_path (LightningCLI's default class), and none at all.
    config.write_text(yaml.safe_dump({"data": {"init_args": {"env": "Pendulum-v1"}}}))
    evaluate_command.main(["--ckpt_path", str(learner_directory), "--num_episodes", "1", "--config", str(config)])
    out = capsys.readouterr().out
    assert "Pendulum-v1 (env from --config)" in out and "these seeds may have been trained on" in out
    config.write_text(
        yaml.safe_dump({"data": {"class_path": "lightning_rl.data.OnPolicyDataModule", "init_args": None}})
    )
    error = usage_error(evaluate_command.main, ["--ckpt_path", str(learner_directory), "--config", str(config)], capsys)
    assert "its data section names no env id" in error


def test_evaluate_refuses_a_negative_seed(learner_directory, capsys):
    args = ["--ckpt_path", str(learner_directory), "--env", "Pendulum-v1", "--seed", "-1"]
    assert "expected an int >= 0, got -1" in usage_error(evaluate_command.main, args, capsys)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            {"env": f"{MODULE}:Evil-v0"},
            f"its env '{MODULE}:Evil-v0' is not a registered gymnasium id that needs no import",
        ),
        ({"wrappers": [f"{MODULE}.Wrapper"]}, "its env has wrappers, which would have to be imported"),
    ],
    ids=["module:Id", "wrappers"],
)
def test_evaluate_never_imports_what_a_checkpoint_names(cli_checkpoint, edit, message, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARKER", str(marker))
    checkpoint = torch.load(cli_checkpoint, weights_only=True)
    checkpoint["datamodule_hyper_parameters"].update(edit)
    crafted = tmp_path / "crafted.ckpt"
    torch.save(resealed(checkpoint), crafted)

    error = usage_error(evaluate_command.main, ["--ckpt_path", str(crafted), "--num_episodes", "1"], capsys)
    assert message in error and "pass --env ID or --config" in error
    assert MODULE not in sys.modules and not marker.exists()


def test_evaluate_refuses_an_env_whose_spaces_do_not_fit_the_policy(cli_checkpoint, capsys):
    args = ["--ckpt_path", str(cli_checkpoint), "--num_episodes", "1", "--env", "Pendulum-v1"]
    assert "wrong env: Pendulum-v1's observation space is Box" in usage_error(evaluate_command.main, args, capsys)


@pytest.mark.parametrize("export_format, suffix", [("onnx", ".onnx"), ("torch", ".pt2")])
def test_export_writes_a_file_that_acts_as_the_policy(cli_checkpoint, export_format, suffix, tmp_path, capsys):
    output = tmp_path / f"policy{suffix}"
    export_command.main(["--ckpt_path", str(cli_checkpoint), "--format", export_format, "--output", str(output)])
    assert f"wrote {output} ({export_format}): PPOModule" in capsys.readouterr().out

    policy = Policy.from_checkpoint(cli_checkpoint)
    obs = observations(policy.observation_space, 100)
    np.testing.assert_array_equal(run_export(output, obs), policy.act(obs))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--ckpt_path": "missing.ckpt"}, "argument --ckpt_path: missing.ckpt: no such file or directory"),
        ({"--format": "tflite"}, "argument --format: invalid choice: 'tflite'"),
        ({"--output": "missing/policy.onnx"}, "the directory missing does not exist"),
        ({"--module_id": "nobody"}, "has no module 'nobody'; it holds ['default_policy']"),
    ],
    ids=["missing checkpoint", "unknown format", "missing output directory", "unknown module"],
)
def test_export_bad_input_is_one_line_and_exit_status_2(cli_checkpoint, change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = {"--ckpt_path": str(cli_checkpoint), "--format": "onnx", "--output": "policy.onnx", **change}
    error = usage_error(export_command.main, [word for pair in args.items() for word in pair], capsys)
    assert error.startswith("lightning-rl export: error: ") and message in error
    assert not (tmp_path / "policy.onnx").exists()


def test_evaluate_takes_seed_everything_when_the_data_module_has_no_seed(cli_checkpoint, tmp_path, capsys):
    # A data module with seed: null draws its seed from the generator seed_everything seeds.
    checkpoint = torch.load(cli_checkpoint, weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["seed"] = None
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    crafted = run / "checkpoints" / "last.ckpt"
    torch.save(resealed(checkpoint), crafted)
    args = ["--ckpt_path", str(crafted), "--num_episodes", "1"]

    # No seed anywhere: the note.
    evaluate_command.main(args)
    out = capsys.readouterr().out
    assert f"seeds {HELD_OUT_SEED_OFFSET}..{HELD_OUT_SEED_OFFSET}" in out and "the run's seed is unknown" in out

    # The config.yaml that fit saved beside checkpoints/, and then a --config, each with seed_everything.
    (run / "config.yaml").write_text(yaml.safe_dump({"seed_everything": 0, "data": {"init_args": {"seed": None}}}))
    evaluate_command.main(args)
    out = capsys.readouterr().out
    assert f"seeds {HELD_OUT_SEED_OFFSET}..{HELD_OUT_SEED_OFFSET}" in out and "seed is unknown" not in out
    config = tmp_path / "given.yaml"
    config.write_text(yaml.safe_dump({"seed_everything": 7, "data": {"init_args": {"env": "CartPole-v1"}}}))
    evaluate_command.main([*args, "--config", str(config)])
    out = capsys.readouterr().out
    assert f"seeds {HELD_OUT_SEED_OFFSET + 7}..{HELD_OUT_SEED_OFFSET + 7}" in out and "seed is unknown" not in out
