"""``lightning-rl evaluate``, ``record`` and ``export`` on multi-agent checkpoints (connect four, simple_spread).

evaluate: a module against random, heuristic, itself or another checkpoint, seated in both seats
in turn, wins/draws/losses per seat, reproducible from ``--seed``; a cooperative checkpoint's
agents on their own modules. record: the games as a directory of ``.npz`` files that
``load_multi_agent_dataset`` reads back. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import fit_small_self_play, resealed, usage_error

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from pettingzoo.classic import connect_four_v3  # noqa: E402
from pettingzoo.utils import BaseWrapper  # noqa: E402

from lightning.pytorch import Trainer, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from lightning_rl.algorithms.ppo import PPOLearner  # noqa: E402
from lightning_rl.cli import evaluate_command, export_command, record_command  # noqa: E402
from lightning_rl.core.checkpoint import writer_tag  # noqa: E402
from lightning_rl.data import MultiAgentDataModule  # noqa: E402
from lightning_rl.data.multi_agent_dataset import (  # noqa: E402
    agent_trajectories,
    load_multi_agent_dataset,
    recover_interrupted_write,
    write_multi_agent_dataset,
)
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner  # noqa: E402
from lightning_rl.env.opponents import RandomLegalModule  # noqa: E402
from lightning_rl.policy import Policy  # noqa: E402

CODE_MODULE = "_code_from_checkpoint"


@pytest.fixture(scope="module")
def self_play_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/ppo_connect_four_selfplay.yaml`` shrunk to 192 moves (``_helpers.fit_small_self_play``)."""
    root = tmp_path_factory.mktemp("self_play")
    fit_small_self_play(root)
    return root / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def spread_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """simple_spread (10 steps per episode) with one shared module, ``default_policy``, trained for 60 env steps."""
    seed_everything(0)
    root = tmp_path_factory.mktemp("spread")
    learner = PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=1, minibatch_size=64)
    data = MultiAgentDataModule(
        "mpe2.simple_spread_v3", env_kwargs={"max_cycles": 10}, num_envs=2, rollout_fragment_length=15, seed=7,
        rollouts_per_epoch=2, max_env_steps=60, evaluation_num_episodes=2,
    )  # fmt: skip
    trainer = Trainer(
        accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
        callbacks=[ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)],
    )  # fmt: skip
    trainer.fit(learner, datamodule=data)
    return root / "checkpoints" / "last.ckpt"


def evaluated(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    """``lightning-rl evaluate ARGS --json``: the JSON written and the text printed."""
    path = tmp_path / "stats.json"
    evaluate_command.main([*args, "--json", str(path)])
    return json.loads(path.read_text()), capsys.readouterr().out



def test_evaluate_seats_main_against_random_in_both_seats_reproducibly(self_play_checkpoint, tmp_path, capsys):
    args = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "random"]
    args += ["--num_episodes", "40", "--seed", "3", "--num_envs", "4"]
    stats, out = evaluated(args, tmp_path, capsys)

    assert stats["module_id"] == "main" and stats["opponent"] == "random" and stats["first_seed"] == 3
    assert stats["env"] == "pettingzoo.classic.connect_four_v3" and stats["num_episodes"] == 40
    assert stats["wins"] + stats["draws"] + stats["losses"] == 40
    assert stats["win_rate"] == stats["wins"] / 40 and stats["loss_rate"] == stats["losses"] / 40
    # A barely trained module against random moves: neither side dominates.
    assert 0.2 <= stats["win_rate"] <= 0.8
    seats = stats["seats"]
    assert sorted(seats) == ["player_0", "player_1"]
    assert [seats[agent]["num_episodes"] for agent in ("player_0", "player_1")] == [20, 20]
    assert sum(seat["wins"] for seat in seats.values()) == stats["wins"]
    assert sum(seat["losses"] for seat in seats.values()) == stats["losses"]
    # Connect four pays +1 / -1 (0 for a draw): main's return in a seat is its wins less its losses there.
    for seat in seats.values():
        assert seat["episode_return_mean"] * 20 == pytest.approx(seat["wins"] - seat["losses"])
    assert sorted(stats["agent_episode_return_mean"]) == ["player_0", "player_1"]
    assert stats["module_episode_return_mean"]["main"] == pytest.approx((stats["wins"] - stats["losses"]) / 40)
    assert stats["episode_return_mean"] == 0.0  # zero-sum
    assert f"main: win rate {stats['win_rate']:.3f}" in out and "  as player_1: 20 games" in out

    again, _ = evaluated(args, tmp_path, capsys)
    assert again == stats


def test_evaluate_against_the_heuristic_loses_mostly(self_play_checkpoint, tmp_path, capsys):
    args = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "heuristic"]
    stats, _ = evaluated([*args, "--num_episodes", "20", "--seed", "0"], tmp_path, capsys)
    assert stats["loss_rate"] >= 0.6
    assert [seat["num_episodes"] for seat in stats["seats"].values()] == [10, 10]


def test_evaluate_against_itself_or_its_own_checkpoint_splits_symmetrically(self_play_checkpoint, tmp_path, capsys):
    args = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--num_episodes", "10", "--seed", "0"]
    itself, _ = evaluated([*args, "--opponent", "self"], tmp_path, capsys)
    # Greedy against a copy of itself: the games in one seat are the other seat's games mirrored.
    first, second = itself["seats"]["player_0"], itself["seats"]["player_1"]
    assert (first["wins"], first["draws"], first["losses"]) == (second["losses"], second["draws"], second["wins"])
    assert itself["wins"] == itself["losses"]
    # The same checkpoint as the opponent plays its own "main" (the --module_id): the same games.
    other, _ = evaluated([*args, "--opponent", str(self_play_checkpoint)], tmp_path, capsys)
    assert other["seats"] == itself["seats"] and other["opponent"] == str(self_play_checkpoint)


def test_evaluate_plays_a_cooperative_checkpoint_with_every_agent_on_its_module(spread_checkpoint, tmp_path, capsys):
    stats, out = evaluated(["--ckpt_path", str(spread_checkpoint), "--num_episodes", "3"], tmp_path, capsys)
    agents = stats["agent_episode_return_mean"]
    assert sorted(agents) == ["agent_0", "agent_1", "agent_2"]
    assert stats["episode_return_mean"] == pytest.approx(sum(agents.values()))
    assert list(stats["module_episode_return_mean"]) == ["default_policy"]
    assert stats["episode_len_mean"] == 10  # the run's env_kwargs: max_cycles 10
    assert stats["module_id"] is None and "win_rate" not in stats and "seats" not in stats
    assert "the run's policy mapping 'shared'" in out and "agent_episode_return_mean: agent_0" in out


def test_evaluate_takes_a_pettingzoo_env_from_env_or_config(spread_checkpoint, tmp_path, capsys):
    play = ["--ckpt_path", str(spread_checkpoint), "--num_episodes", "2"]
    stats, out = evaluated([*play, "--env", "mpe2.simple_spread_v3", "--seed", "1"], tmp_path, capsys)
    assert stats["env"] == "mpe2.simple_spread_v3" and "(env from --env)" in out
    assert stats["episode_len_mean"] == 25  # the env's own max_cycles, not the run's env_kwargs
    config = Path(__file__).resolve().parent.parent / "examples" / "ppo_simple_spread.yaml"
    stats, out = evaluated([*play, "--config", str(config)], tmp_path, capsys)
    assert "(env from --config)" in out and stats["episode_len_mean"] == 25
    assert stats["first_seed"] == 5_000_000  # the config's seed_everything 0, held out


def test_evaluate_video_writes_the_first_game_of_the_first_env_copy(
    self_play_checkpoint, spread_checkpoint, tmp_path, capsys
):
    from PIL import Image

    pytest.importorskip("pygame")  # both envs render with it
    for checkpoint, extra, least_frames in (
        (self_play_checkpoint, ["--module_id", "main", "--opponent", "random"], 8),  # a win takes 7 moves or more
        # The reset, then 10 steps (max_cycles 10); mpe2 draws the reset's picture again after the first
        # step, and the GIF shows a picture repeated in a row as one frame.
        (spread_checkpoint, [], 10),
    ):
        video_dir = tmp_path / checkpoint.parent.parent.name
        args = ["--ckpt_path", str(checkpoint), *extra, "--num_episodes", "4", "--num_envs", "2", "--seed", "3"]
        stats, out = evaluated([*args, "--video", "--video_dir", str(video_dir)], tmp_path, capsys)
        gif = video_dir / "evaluation-episode-0.gif"
        assert f"video: {gif} (the first game of env copy 0, seed 3)" in out
        with Image.open(gif) as image:
            assert image.n_frames >= least_frames
        # Recording changes nothing about the games.
        assert evaluated(args, tmp_path, capsys)[0] == stats


def test_the_frame_recorder_renders_the_first_episode_alone_in_either_pettingzoo_api():
    import mpe2.simple_spread_v3

    from lightning_rl.env.frame_recorder import RecordedFrames
    from lightning_rl.env.pettingzoo_frames import record_first_episode
    from lightning_rl.env.pettingzoo_stepper import PettingZooStepper

    for make in (
        lambda: mpe2.simple_spread_v3.parallel_env(max_cycles=5, render_mode="rgb_array"),
        lambda: connect_four_v3.env(render_mode="rgb_array"),
    ):
        recorded = RecordedFrames()
        stepper = PettingZooStepper(record_first_episode(make(), recorded))
        rng = np.random.default_rng(0)
        steps = []
        for episode in range(2):
            observations, done, count = stepper.reset(seed=episode), False, 0
            while not done:
                actions = {}
                for agent, observation in observations.items():
                    space = stepper.env.action_space(agent)
                    mask = observation.get("action_mask") if isinstance(observation, dict) else None
                    actions[agent] = int(rng.choice(np.flatnonzero(mask))) if mask is not None else space.sample()
                result = stepper.step(actions)
                observations, done, count = result.observations, result.done, count + 1
            steps.append(count)
            if episode == 0:
                first = len(recorded.frames)
        stepper.close()
        # A frame after the reset and one after every step of the first episode (for an AEC env also
        # the steps that retire the done agents), none of the second; each [H, W, 3] uint8.
        assert first == len(recorded.frames) >= steps[0] + 1
        assert all(frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3 for frame in recorded.frames)
    assert recorded.fps == 2  # connect four's render_fps


def test_a_video_needs_an_rgb_array_render_mode():
    from lightning_rl.cli._command_line import CommandError
    from lightning_rl.cli.multi_agent_matches import PettingZooSource
    from lightning_rl.env.frame_recorder import RecordedFrames

    source = PettingZooSource("mpe2.simple_spread_v3", {"render_mode": "human"}, "--env", 0, "shared")
    with pytest.raises(CommandError, match="--video records rgb_array frames, but the env's env_kwargs set "
                       "render_mode='human'"):  # fmt: skip
        source.make_runner(1, 0, RecordedFrames())


def _single_agent_looking(self_play_checkpoint: Path, tmp_path: Path) -> Path:
    """The self-play checkpoint with the data-module settings of a single-agent run."""
    checkpoint = torch.load(self_play_checkpoint, weights_only=True)
    del checkpoint["MultiAgentDataModule"]
    checkpoint["datamodule_hyper_parameters"] = {"_class_path": "lightning_rl.data.OnPolicyDataModule", "env": "X"}
    crafted = tmp_path / "single.ckpt"
    torch.save(resealed(checkpoint), crafted)
    return crafted


def test_evaluate_bad_input_is_one_line(self_play_checkpoint, spread_checkpoint, tmp_path, capsys):
    play = ["--ckpt_path", str(self_play_checkpoint), "--num_episodes", "2"]
    cases = [
        ([*play, "--module_id", "nope", "--opponent", "random"], "has no module 'nope'; it holds ['main', 'fixed_random', 'fixed_heuristic', 'main_v0']"),
        ([*play, "--opponent", "random"], "holds 4 modules ['main', 'fixed_random', 'fixed_heuristic', 'main_v0']; pass --module_id"),
        ([*play, "--module_id", "main", "--opponent", "rando"], "--opponent rando: expected one of ['random', "),
        (
            [*play, "--module_id", "main", "--opponent", str(spread_checkpoint)],
            "module 'default_policy' has the observation space Box",
        ),
        (play, "maps pettingzoo.classic.connect_four_v3's agents to ['default_policy'], but it holds"),
        (
            ["--ckpt_path", str(spread_checkpoint), "--opponent", "heuristic"],
            "--opponent heuristic plays connect four only, not simple_spread_v3",
        ),
        (
            ["--ckpt_path", str(_single_agent_looking(self_play_checkpoint, tmp_path)), "--module_id", "main",
             "--opponent", "random", "--env", "CartPole-v1"],
            "--opponent plays multi-agent checkpoints (a MultiAgentDataModule run), and single-agent ones whose env "
            "is lightning_rl.env.against_opponent.AgainstOpponentEnv; this run's env is CartPole-v1",
        ),
    ]
    for args, message in cases:
        assert message in usage_error(evaluate_command.main, args, capsys), args


def test_evaluate_never_imports_an_env_a_checkpoint_names(self_play_checkpoint, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    monkeypatch.setenv("LIGHTNING_RL_TEST_MARKER", str(marker))
    checkpoint = torch.load(self_play_checkpoint, weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["env"] = f"{CODE_MODULE}.touch_marker"
    crafted = tmp_path / "crafted.ckpt"
    torch.save(resealed(checkpoint), crafted)

    args = ["--ckpt_path", str(crafted), "--module_id", "main", "--opponent", "random"]
    error = usage_error(evaluate_command.main, args, capsys)
    assert "is neither a PettingZoo registry id nor a module of PettingZoo's or mpe2's envs" in error
    assert CODE_MODULE not in sys.modules and not marker.exists()


def test_record_writes_games_that_load_back_with_seats_masks_and_returns(self_play_checkpoint, tmp_path, capsys):
    output = tmp_path / "games"
    args = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "random"]
    args += ["--num_episodes", "4", "--seed", "5", "--output", str(output)]
    record_command.main(args)
    assert f"wrote {output}: 4 episodes" in capsys.readouterr().out

    dataset = load_multi_agent_dataset(output)
    assert dataset.metadata["opponent"] == "random" and dataset.metadata["first_seed"] == 5
    assert dataset.metadata["possible_agents"] == ["player_0", "player_1"]
    assert dataset.observation_spaces["player_0"]["observation"].shape == (6, 7, 2)
    seats = []
    for episode in dataset.episodes:
        assert sorted(episode.agents) == ["player_0", "player_1"]
        assert sorted(t.module_id for t in episode.agents.values()) == ["main", "opponent"]
        seats.append(next(agent for agent, t in episode.agents.items() if t.module_id == "main"))
        for agent, trajectory in episode.agents.items():
            steps = len(trajectory.actions)
            assert trajectory.observations.shape == (steps + 1, 6, 7, 2) and trajectory.action_masks.shape == (steps, 7)
            assert trajectory.action_masks[np.arange(steps), trajectory.actions].all()  # legal moves only
            assert trajectory.terminations[-1] and not trajectory.terminations[:-1].any()
            assert episode.metadata["agent_returns"][agent] == float(trajectory.rewards.sum())
    assert sorted(seats) == ["player_0", "player_0", "player_1", "player_1"]

    error = usage_error(record_command.main, args, capsys)
    assert f"{output} exists; pass --overwrite to replace it" in error
    record_command.main([*args, "--overwrite", "--num_episodes", "2"])
    assert len(load_multi_agent_dataset(output).episodes) == 2


def test_record_random_fraction_plays_that_share_of_the_games_first_with_random_players(
    self_play_checkpoint, tmp_path, capsys
):
    output = tmp_path / "mixed"
    args = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "heuristic"]
    args += ["--num_episodes", "6", "--random_fraction", "0.5", "--seed", "5", "--output", str(output)]
    record_command.main(args)
    told = capsys.readouterr().out
    assert "6 games of pettingzoo.classic.connect_four_v3: 3 with random actions, then greedy" in told
    dataset = load_multi_agent_dataset(output)
    assert dataset.metadata["num_random_episodes"] == 3 and len(dataset.episodes) == 6
    # The main player's moves: legal in every game; in the first three, not all its greedy policy's.
    policy = Policy.from_checkpoint(self_play_checkpoint, module_id="main")
    agrees = []
    for episode in dataset.episodes:
        main = next(trajectory for trajectory in episode.agents.values() if trajectory.module_id == "main")
        steps = len(main.actions)
        assert main.action_masks[np.arange(steps), main.actions].all()
        observations = {"observation": main.observations[:steps], "action_mask": main.action_masks}
        agrees.append(bool((policy.act(observations, deterministic=True) == main.actions).all()))
    assert agrees[3:] == [True, True, True] and not all(agrees[:3])


def test_record_bad_input_is_one_line(self_play_checkpoint, tmp_path, capsys):
    play = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "random"]
    cases = [
        ([*play, "--dataset_id", "c4/x-v0"], "Minari has no multi-agent format: pass --output DIR"),
        (play, "--output DIR is required"),
        (
            ["--ckpt_path", str(_single_agent_looking(self_play_checkpoint, tmp_path)), "--output", str(tmp_path)],
            "--output records multi-agent checkpoints",
        ),
    ]
    for args, message in cases:
        assert message in usage_error(record_command.main, args, capsys), args


def test_the_dataset_round_trips_every_array_of_the_episodes_played(tmp_path):
    runner = MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=2, seed=0, policy_mapping_fn="shared")
    try:
        spaces = {agent: runner.observation_space(agent) for agent in runner.possible_agents}
        actions = {agent: runner.action_space(agent) for agent in runner.possible_agents}
        player = RandomLegalModule(spaces["player_0"], actions["player_0"], model_config={"seed": 0})
        episodes = runner.sample_episodes(player, num_episodes=3)
    finally:
        runner.close()
    write_multi_agent_dataset(
        tmp_path / "d", episodes, observation_spaces=spaces, action_spaces=actions, info={"env": "connect four"}
    )
    dataset = load_multi_agent_dataset(tmp_path / "d")
    assert dataset.metadata["env"] == "connect four" and dataset.action_spaces == actions
    for episode, loaded in zip(episodes, dataset.episodes):
        assert loaded.metadata["id"] == episode.id_ and loaded.metadata["env_steps"] == episode.env_steps()
        for agent, expected in agent_trajectories(episode).items():
            got = loaded.agents[agent]
            assert got.module_id == expected.module_id == "default_policy"
            for name in ("observations", "action_masks", "actions", "rewards", "terminations", "truncations"):
                np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))
                assert getattr(got, name).dtype == getattr(expected, name).dtype

    spaces_of = {"observation_spaces": spaces, "action_spaces": actions}
    with pytest.raises(ValueError, match=r"info may not set \['episodes'\], which the format itself writes"):
        write_multi_agent_dataset(tmp_path / "e", episodes, **spaces_of, info={"episodes": []})
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="is not a multi-agent dataset .metadata.json missing.: not replaced"):
        write_multi_agent_dataset(tmp_path / "mine", episodes, **spaces_of, info={}, overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["d", "mine"]  # no staging directory is left


def test_export_names_the_modules_of_a_multi_module_checkpoint(self_play_checkpoint, tmp_path, capsys):
    args = ["--ckpt_path", str(self_play_checkpoint), "--format", "torch", "--output", str(tmp_path / "p.pt2")]
    error = usage_error(export_command.main, [*args, "--module_id", "nope"], capsys)
    assert "has no module 'nope'; it holds ['main', 'fixed_random', 'fixed_heuristic', 'main_v0']" in error


def _dead_writer_tag(prefix: str) -> str:
    """``writer_tag(prefix)`` with the id of a process that has exited (a killed writer's)."""
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return writer_tag(prefix).replace(f".{os.getpid()}.", f".{int(exited.stdout)}.")


@pytest.mark.parametrize("killed", ["while staging", "between the renames", "before removing the old one"])
def test_a_write_killed_at_any_point_is_finished_or_undone_by_the_next_run(killed, tmp_path):
    # A writer killed between its two renames left the path without a dataset, the old one hidden.
    target, marker = tmp_path / "games", "old"
    target.mkdir()
    (target / "metadata.json").write_text(marker)
    stage = tmp_path / f"{_dead_writer_tag('.lightning_rl-writing-')}games"
    replaced = tmp_path / f"{_dead_writer_tag('.lightning_rl-replaced-')}games"
    other = tmp_path / f"{_dead_writer_tag('.lightning_rl-writing-')}other"  # another dataset's: left alone
    for directory in (stage, other):
        directory.mkdir()
        (directory / "episode_000000.npz").write_bytes(b"")
    if killed != "while staging":  # metadata.json is the staging directory's last file
        (stage / "metadata.json").write_text("new")
        target.rename(replaced)
        marker = "new"
    if killed == "before removing the old one":
        stage.rename(target)

    done = recover_interrupted_write(target)

    assert (target / "metadata.json").read_text() == marker, done
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["games", other.name]), done


class _SigtermAfterGames(BaseWrapper):
    """Connect four that sends this process SIGTERM at the reset after ``$STOP_AFTER_GAMES`` games (a scheduler's stop)."""

    def __init__(self, env) -> None:
        super().__init__(env)
        self.stop_after, self.resets = int(os.environ["STOP_AFTER_GAMES"]), 0

    def reset(self, seed=None, options=None):
        self.resets += 1  # the first reset starts the first game
        if self.resets == self.stop_after + 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().reset(seed=seed, options=options)


def stopped_connect_four() -> BaseWrapper:
    return _SigtermAfterGames(connect_four_v3.env())


def test_record_stopped_by_sigterm_writes_the_games_that_ended(self_play_checkpoint, tmp_path, capsys):
    # The games were played in one runner call: a scheduler's SIGTERM (or Ctrl-C) wrote nothing.
    play = ["--ckpt_path", str(self_play_checkpoint), "--module_id", "main", "--opponent", "random"]
    play += ["--seed", "5", "--num_envs", "1"]
    stopped_games = tmp_path / "stopped"
    command = [sys.executable, "-m", "lightning_rl", "record", *play, "--num_episodes", "20"]
    command += ["--env", "test_multi_agent_cli.stopped_connect_four", "--output", str(stopped_games)]
    tests = Path(__file__).resolve().parent
    pythonpath = os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")])
    stopped = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": pythonpath, "STOP_AFTER_GAMES": "5", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "stopped by SIGTERM after 5 of 20 games: writing them" in stopped.stdout
    assert f"wrote {stopped_games}: 5 episodes" in stopped.stdout
    dataset = load_multi_agent_dataset(stopped_games)
    assert dataset.metadata["num_episodes"] == 5 and dataset.metadata["num_episodes_requested"] == 20
    assert dataset.metadata["stopped_by"] == "SIGTERM"
    assert [path.name for path in tmp_path.iterdir()] == ["stopped"]  # no staging directory is left

    # They are the first 5 games of an unstopped recording: same seeds, main in each seat in turn.
    whole_games = tmp_path / "whole"
    record_command.main([*play, "--num_episodes", "5", "--output", str(whole_games)])
    whole = load_multi_agent_dataset(whole_games)
    assert whole.metadata["stopped_by"] is None
    for got, expected in zip(dataset.episodes, whole.episodes, strict=True):
        assert got.metadata["agent_modules"] == expected.metadata["agent_modules"]
        for agent, trajectory in expected.agents.items():
            np.testing.assert_array_equal(got.agents[agent].actions, trajectory.actions)
    seats = [next(a for a, m in e.metadata["agent_modules"].items() if m == "main") for e in dataset.episodes]
    assert seats == ["player_0", "player_1", "player_0", "player_1", "player_0"]
