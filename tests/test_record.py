"""Recording Minari datasets: the writer, ``lightning-rl record``, the ``RecordEpisodes`` callback and the example script.

Every test writes under its own ``MINARI_DATASETS_PATH`` (a tmp dir) and downloads nothing.
A dataset is checked by reading it back with ``minari.load_dataset``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
import yaml
from _algorithms import ROWS
from _helpers import load_example
from lightning.pytorch import Trainer

from lightning_rl import Policy
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.algorithms.sac import SACLearner
from lightning_rl.callbacks import RecordEpisodes
from lightning_rl.cli import main as cli_main
from lightning_rl.cli import record_command
from lightning_rl.cli.evaluate_command import HELD_OUT_SEED_OFFSET
from lightning_rl.data import OfflineDataModule, OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.data.minari_writer import registered_env_spec, write_minari_dataset
from lightning_rl.data.rank_stats import NUM_EPISODES_LIFETIME
from lightning_rl.env.episode import SingleAgentEpisode

REPOSITORY = Path(__file__).resolve().parents[1]
PPO = next(row for row in ROWS if row.name == "PPO")
# CartPole ends (terminates) once the pole leans past 12 degrees or the cart leaves [-2.4, 2.4].
CARTPOLE_ANGLE_LIMIT = 12 * 2 * np.pi / 360


@pytest.fixture(autouse=True)
def datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari_datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def play_random_episodes(env: gym.Env, seeds: list[int]) -> list[SingleAgentEpisode]:
    env.action_space.seed(0)
    episodes = []
    for seed in seeds:
        episode = SingleAgentEpisode()
        obs, _ = env.reset(seed=seed)
        episode.add_env_reset(obs)
        while not episode.is_done:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            episode.add_env_step(obs, action, reward, terminated=terminated, truncated=truncated)
        episodes.append(episode.to_numpy())
    return episodes


def assert_same_episodes(dataset: minari.MinariDataset, episodes: list[SingleAgentEpisode]) -> None:
    """Every column of every episode, as written."""
    stored = list(dataset.iterate_episodes())
    assert [len(episode.rewards) for episode in stored] == [len(episode) for episode in episodes]
    for read, written in zip(stored, episodes):
        np.testing.assert_array_equal(read.observations, written.observations)  # the final one included
        np.testing.assert_array_equal(read.actions, written.actions)
        np.testing.assert_allclose(read.rewards, written.rewards)
        assert not read.terminations[:-1].any() and not read.truncations[:-1].any()
        assert (bool(read.terminations[-1]), bool(read.truncations[-1])) == (
            written.is_terminated,
            written.is_truncated,
        )


def usage_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``lightning-rl record`` prints for bad input (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        record_command.main(args)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("lightning-rl record: error: "), error
    return error


@pytest.fixture(scope="module")
def ppo_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two untrained PPO CartPole policies of different weights, as ``save_to_path`` directories (no env saved)."""
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        learner = PPO.make_learner()
        learner.build()
        paths.append(Path(learner.save_to_path(str(tmp_path_factory.mktemp("ppo") / f"policy{seed}"))))
    return paths


# ---------------------------------------------------------------------------------------------
# The writer
# ---------------------------------------------------------------------------------------------


def test_a_written_dataset_round_trips_through_minari_with_every_column():
    # A time limit of 12 steps: random CartPole episodes both terminate and get truncated.
    env = gym.make("CartPole-v1", max_episode_steps=12)
    episodes = play_random_episodes(env, list(range(8)))
    assert {episode.is_terminated for episode in episodes} == {True, False}
    spec = registered_env_spec("CartPole-v1", {"max_episode_steps": 12, "sutton_barto_reward": True})
    write_minari_dataset(
        "cartpole/round-trip-v0",
        episodes,
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_spec=spec,
        algorithm_name="random",
        description="random CartPole episodes",
    )
    dataset = minari.load_dataset("cartpole/round-trip-v0")
    assert_same_episodes(dataset, episodes)
    assert dataset.total_episodes == 8 and dataset.total_steps == sum(len(episode) for episode in episodes)
    assert dataset.observation_space == env.observation_space and dataset.action_space == env.action_space
    assert dataset.spec.env_spec.id == "CartPole-v1"
    assert dataset.storage.metadata["algorithm_name"] == "random"
    # The env rebuilds from the registry with the run's settings: the time limit and the env's keyword.
    recovered = dataset.recover_environment()
    assert recovered.spec.max_episode_steps == 12 and recovered.unwrapped._sutton_barto_reward


def test_an_env_without_a_registered_id_is_stored_as_spaces_only():
    env = gym.make("Pendulum-v1")
    episodes = play_random_episodes(env, [0])
    assert registered_env_spec(lambda: gym.make("Pendulum-v1")) is None
    assert registered_env_spec("Pendulum-v1", wrappers=["gymnasium.wrappers.ClipReward"]) is None
    assert registered_env_spec("no.such.factory") is None
    write_minari_dataset(
        "pendulum/spaces-v0", episodes, observation_space=env.observation_space, action_space=env.action_space
    )
    dataset = minari.load_dataset("pendulum/spaces-v0")
    assert dataset.spec.env_spec is None
    assert dataset.observation_space == env.observation_space
    assert_same_episodes(dataset, episodes)


def test_an_existing_dataset_is_kept_unless_overwrite_then_replaced_whole(datasets_root):
    env = gym.make("CartPole-v1")
    first, second = play_random_episodes(env, [0, 1]), play_random_episodes(env, [2])
    spaces = dict(observation_space=env.observation_space, action_space=env.action_space)
    write_minari_dataset("cartpole/kept-v0", first, **spaces)
    with pytest.raises(ValueError, match="exists already.*overwrite"):
        write_minari_dataset("cartpole/kept-v0", second, **spaces)
    assert_same_episodes(minari.load_dataset("cartpole/kept-v0"), first)
    # A failure while writing the new dataset leaves the old one as it was.
    with pytest.raises(ValueError, match="not a whole episode"):
        write_minari_dataset("cartpole/kept-v0", [first[0][:3]], overwrite=True, **spaces)
    assert_same_episodes(minari.load_dataset("cartpole/kept-v0"), first)
    write_minari_dataset("cartpole/kept-v0", second, overwrite=True, **spaces)
    assert_same_episodes(minari.load_dataset("cartpole/kept-v0"), second)
    # Nothing is left beside the datasets.
    assert sorted(path.name for path in (datasets_root / "cartpole").iterdir()) == [
        "kept-v0",
        "namespace_metadata.json",
    ]
    assert list(minari.list_local_datasets()) == ["cartpole/kept-v0"]


def test_the_writer_refuses_malformed_ids_and_running_episodes():
    env = gym.make("CartPole-v1")
    episodes = play_random_episodes(env, [0])
    spaces = dict(observation_space=env.observation_space, action_space=env.action_space)
    for dataset_id in ("cartpole/no-version", "bad id-v0"):
        with pytest.raises(ValueError, match="malformed"):
            write_minari_dataset(dataset_id, episodes, **spaces)
    running = SingleAgentEpisode(
        observations=episodes[0].observations[:3], actions=episodes[0].actions[:2], rewards=[1, 1]
    )
    with pytest.raises(ValueError, match="still running"):
        write_minari_dataset("cartpole/running-v0", [running], **spaces)
    with pytest.raises(ValueError, match="no episodes"):
        write_minari_dataset("cartpole/empty-v0", [], **spaces)


# ---------------------------------------------------------------------------------------------
# lightning-rl record
# ---------------------------------------------------------------------------------------------


def greedy(path: Path) -> Policy:
    return Policy.from_checkpoint(path)


def test_record_plays_greedy_episodes_on_held_out_seeds(ppo_checkpoints, capsys):
    cli_main(
        ["record", "--env", "CartPole-v1", "--ckpt_path", str(ppo_checkpoints[0]), "--num_episodes", "5"]
        + ["--num_envs", "2", "--dataset_id", "cartpole/greedy-v0"]
    )
    output = capsys.readouterr().out
    assert f"5 episodes, seeds {HELD_OUT_SEED_OFFSET}..{HELD_OUT_SEED_OFFSET + 4}" in output
    assert "(greedy): 5 episodes" in output and "wrote cartpole/greedy-v0: 5 episodes" in output
    dataset = minari.load_dataset("cartpole/greedy-v0")
    policy = greedy(ppo_checkpoints[0])
    env = gym.make("CartPole-v1")
    for index, episode in enumerate(dataset.iterate_episodes()):
        # The episode of seed S + i, step by step; every action is the policy's greedy one.
        obs, _ = env.reset(seed=HELD_OUT_SEED_OFFSET + index)
        np.testing.assert_array_equal(episode.observations[0], obs)
        np.testing.assert_array_equal(episode.actions, policy.act(episode.observations[:-1]))
        for step, action in enumerate(episode.actions):
            obs, reward, terminated, truncated, _ = env.step(action)
            np.testing.assert_array_equal(episode.observations[step + 1], obs)
            assert (episode.terminations[step], episode.truncations[step]) == (terminated, truncated)
        final = episode.observations[-1]  # the true final one: past a limit
        assert episode.terminations[-1] and (abs(final[2]) > CARTPOLE_ANGLE_LIMIT or abs(final[0]) > 2.4)
    assert dataset.spec.env_spec.id == "CartPole-v1"


def test_record_explore_samples_actions_repeatably(ppo_checkpoints):
    common = ["--env", "CartPole-v1", "--ckpt_path", str(ppo_checkpoints[0]), "--num_episodes", "6", "--seed", "3"]
    for dataset_id in ("cartpole/explore-v0", "cartpole/explore-v1"):
        record_command.main([*common, "--explore", "--dataset_id", dataset_id])
    record_command.main([*common, "--dataset_id", "cartpole/greedy-v0"])
    explored = list(minari.load_dataset("cartpole/explore-v0").iterate_episodes())
    again = list(minari.load_dataset("cartpole/explore-v1").iterate_episodes())
    greedy_actions = greedy(ppo_checkpoints[0]).act(np.concatenate([e.observations[:-1] for e in explored]))
    explored_actions = np.concatenate([episode.actions for episode in explored])
    # An untrained policy is near 50/50: sampling departs from the greedy action often.
    assert (explored_actions != greedy_actions).mean() > 0.2
    for first, second in zip(explored, again):
        np.testing.assert_array_equal(first.actions, second.actions)
    assert [len(e.rewards) for e in minari.load_dataset("cartpole/greedy-v0").iterate_episodes()] != [
        len(e.rewards) for e in explored
    ]


def test_record_mixes_random_episodes_and_several_policies(ppo_checkpoints, capsys):
    first, second = (str(path) for path in ppo_checkpoints)
    record_command.main(
        ["--env", "CartPole-v1", "--ckpt_path", first, "--ckpt_path", second, "--random_fraction", "0.4"]
        + ["--num_episodes", "10", "--num_envs", "3", "--dataset_id", "cartpole/mixed-v0"]
    )
    output = capsys.readouterr().out
    assert "  random: 4 episodes" in output
    assert f"  {first} (greedy): 3 episodes" in output and f"  {second} (greedy): 3 episodes" in output
    episodes = list(minari.load_dataset("cartpole/mixed-v0").iterate_episodes())
    assert len(episodes) == 10
    # Random episodes first, then each policy's share in the order given.
    for episode in episodes[4:7]:
        np.testing.assert_array_equal(episode.actions, greedy(ppo_checkpoints[0]).act(episode.observations[:-1]))
    for episode in episodes[7:]:
        np.testing.assert_array_equal(episode.actions, greedy(ppo_checkpoints[1]).act(episode.observations[:-1]))
    random_actions = np.concatenate([episode.actions for episode in episodes[:4]])
    random_obs = np.concatenate([episode.observations[:-1] for episode in episodes[:4]])
    assert (random_actions != greedy(ppo_checkpoints[0]).act(random_obs)).any()


def test_record_random_only_needs_no_checkpoint_and_takes_the_env_from_a_config(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": {"init_args": {"env": "Pendulum-v1", "seed": 7}}}))
    record_command.main(
        ["--config", str(config), "--random_fraction", "1", "--num_episodes", "3", "--dataset_id", "pendulum/random-v0"]
    )
    assert f"seeds {7 + HELD_OUT_SEED_OFFSET}.." in capsys.readouterr().out
    dataset = minari.load_dataset("pendulum/random-v0")
    assert dataset.total_episodes == 3 and dataset.total_steps == 600
    episode = next(iter(dataset.iterate_episodes()))
    assert episode.truncations[-1] and not episode.terminations.any()  # Pendulum's 200-step time limit


def test_record_random_episodes_on_a_masked_env_play_only_legal_moves():
    pytest.importorskip("pettingzoo")
    env = "lightning_rl.env.against_opponent.AgainstOpponentEnv"  # connect four: an illegal move loses at once
    record_command.main(
        ["--env", env, "--random_fraction", "1", "--num_episodes", "12", "--dataset_id", "c4/random-v0"]
    )
    episodes = list(minari.load_dataset("c4/random-v0").iterate_episodes())
    assert len(episodes) == 12
    for episode in episodes:
        masks = episode.observations["action_mask"][:-1]  # the final observation is never acted on
        assert masks[np.arange(len(episode.actions)), episode.actions].all()
        assert len(set(episode.actions.tolist())) > 1  # random, not the first legal column every time


def test_record_refuses_an_existing_dataset_without_overwrite(ppo_checkpoints, capsys):
    args = ["--env", "CartPole-v1", "--random_fraction", "1", "--dataset_id", "cartpole/random-v0"]
    record_command.main([*args, "--num_episodes", "2"])
    capsys.readouterr()
    assert "exists already" in usage_error([*args, "--num_episodes", "3"], capsys)
    assert minari.load_dataset("cartpole/random-v0").total_episodes == 2
    record_command.main([*args, "--num_episodes", "3", "--overwrite"])
    assert minari.load_dataset("cartpole/random-v0").total_episodes == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPole-v1", "--dataset_id", "cartpole/x"], "dataset id 'cartpole/x' is malformed"),
        (["--env", "CartPole-v1", "--dataset_id", "cartpole/x-v0"], "--ckpt_path is required"),
        (["--random_fraction", "1", "--dataset_id", "cartpole/x-v0"], "random episodes need an env"),
        (["--random_fraction", "1.5", "--dataset_id", "cartpole/x-v0"], "expected a fraction in [0, 1], got 1.5"),
        (["--ckpt_path", "missing.ckpt", "--dataset_id", "cartpole/x-v0"], "missing.ckpt: no such file"),
        (["--ckpt_path", "{0}", "--dataset_id", "cartpole/x-v0"], "holds no data-module settings naming an env"),
        (["--ckpt_path", "{0}", "--env", "Pendulum-v1", "--dataset_id", "pendulum/x-v0"], "wrong env: Pendulum-v1's"),
        (["--ckpt_path", "{0}", "--ckpt_path", "{1}", "--num_episodes", "1", "--env", "CartPole-v1"], "1 policy epis"),
    ],
)
def test_record_bad_input_is_one_line_and_exit_status_2(ppo_checkpoints, args, message, capsys):
    args = [arg.format(*ppo_checkpoints) for arg in args]
    if "--dataset_id" not in args:
        args += ["--dataset_id", "cartpole/x-v0"]
    assert message in usage_error(args, capsys)
    assert not minari.list_local_datasets()


# ---------------------------------------------------------------------------------------------
# The RecordEpisodes callback
# ---------------------------------------------------------------------------------------------


def fit(learner, datamodule, callback: RecordEpisodes) -> None:
    trainer = Trainer(
        max_epochs=-1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(learner, datamodule=datamodule)


def test_the_callback_records_every_complete_training_episode_of_a_sac_fit():
    torch.manual_seed(0)
    datamodule = OffPolicyDataModule(
        "Pendulum-v1", num_envs=2, train_freq=50, learning_starts=100, max_env_steps=900, seed=0
    )
    callback = RecordEpisodes("pendulum/sac-replay-v0")
    fit(SACLearner(minibatch_size=16, model_config={"fcnet_hiddens": [8]}), datamodule, callback)
    dataset = minari.load_dataset("pendulum/sac-replay-v0")
    # 900 env steps on 2 envs: two whole 200-step episodes each; the 50 steps of the third are left out.
    assert dataset.total_episodes == 4 == datamodule.sampling.state_dict()[NUM_EPISODES_LIFETIME]
    assert_same_episodes(dataset, callback.episodes)
    env = gym.make("Pendulum-v1")
    for episode in dataset.iterate_episodes():
        assert len(episode.rewards) == 200 and episode.truncations[-1] and not episode.terminations.any()
        # The env's own values, step after step: each transition follows Pendulum's dynamics.
        env.reset()
        for step, action in enumerate(episode.actions):
            cos, sin, speed = episode.observations[step]
            env.unwrapped.state = np.array([np.arctan2(sin, cos), speed], dtype=np.float64)
            obs, reward, *_ = env.step(action)
            np.testing.assert_allclose(episode.observations[step + 1], obs, atol=1e-4)
            np.testing.assert_allclose(episode.rewards[step], reward, rtol=1e-4, atol=1e-4)
    assert dataset.spec.env_spec.id == "Pendulum-v1" and dataset.storage.metadata["algorithm_name"] == "SACLearner"


def test_the_callback_records_terminated_episodes_of_a_ppo_fit_whole():
    torch.manual_seed(0)
    datamodule = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=16, max_env_steps=320, seed=1)
    callback = RecordEpisodes("cartpole/ppo-replay-v0", description="a test")
    fit(PPOLearner(minibatch_size=32, num_epochs=1, model_config={"fcnet_hiddens": [8]}), datamodule, callback)
    dataset = minari.load_dataset("cartpole/ppo-replay-v0")
    # Episodes longer than a 16-step rollout were joined from their chunks.
    assert dataset.total_episodes == datamodule.sampling.state_dict()[NUM_EPISODES_LIFETIME] > 5
    assert max(len(episode.rewards) for episode in dataset.iterate_episodes()) > 16
    for episode in dataset.iterate_episodes():
        assert np.all(np.abs(episode.observations[0]) <= 0.05)  # a reset observation
        final = episode.observations[-1]  # the true final one, past a limit (not the next reset's)
        assert episode.terminations[-1] and (abs(final[2]) > CARTPOLE_ANGLE_LIMIT or abs(final[0]) > 2.4)
    assert dataset.storage.metadata["description"] == "a test"


def test_the_callback_refuses_normalized_runs_and_existing_ids_before_training(datasets_root):
    learner = PPOLearner(minibatch_size=32, num_epochs=1, model_config={"fcnet_hiddens": [8]})
    normalized = OnPolicyDataModule("CartPole-v1", rollout_fragment_length=16, normalize_observations=True)
    with pytest.raises(ValueError, match="normalized ones \\(normalize_observations\\)"):
        fit(learner, normalized, RecordEpisodes("cartpole/normalized-v0"))
    (datasets_root / "cartpole" / "taken-v0").mkdir(parents=True)
    with pytest.raises(ValueError, match="exists already"):
        fit(learner, OnPolicyDataModule("CartPole-v1", rollout_fragment_length=16), RecordEpisodes("cartpole/taken-v0"))
    assert learner.global_step == 0


def test_the_callback_refuses_an_offline_fit_which_samples_no_training_episodes():
    record_command.main(
        ["--env", "CartPole-v1", "--random_fraction", "1", "--num_episodes", "2", "--dataset_id", "cartpole/random-v0"]
    )
    learner = BCLearner(model_config={"fcnet_hiddens": [8]})
    with pytest.raises(ValueError, match="the fit's data module is OfflineDataModule"):
        fit(learner, OfflineDataModule("cartpole/random-v0", batch_size=8), RecordEpisodes("cartpole/copy-v0"))
    assert learner.weights_seq_no == 0


def test_the_callback_is_set_from_the_command_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            ["fit", "--config", str(REPOSITORY / "examples/sac_pendulum.yaml"), "--print_config"]
            + ["--trainer.callbacks+=lightning_rl.callbacks.RecordEpisodes"]
            + ["--trainer.callbacks.dataset_id=pendulum/sac-medium-replay-v0", "--trainer.callbacks.overwrite=true"]
        )
    assert exit_info.value.code in (0, None)
    callbacks = yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]
    assert callbacks[-1] == {
        "class_path": "lightning_rl.callbacks.RecordEpisodes",
        "init_args": {
            "dataset_id": "pendulum/sac-medium-replay-v0",
            "overwrite": True,
            "description": None,
            "algorithm_name": None,
        },
    }


# ---------------------------------------------------------------------------------------------
# examples/make_offline_datasets.py
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_make_offline_datasets_quick_makes_the_four_datasets(tmp_path, datasets_root, monkeypatch, capsys):
    # In this process (the script runs its commands in its own): its chdir and variables are undone after.
    monkeypatch.chdir(REPOSITORY)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    arguments = ["--quick", "--out", str(datasets_root), "--runs", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", ["make_offline_datasets.py", *arguments])
    load_example("make_offline_datasets").main()
    out = capsys.readouterr().out
    # Two fits (one records through the callback), three records.
    assert out.count("$ lightning-rl ") == 5
    # Then one line per dataset: its size, mean return and fingerprint.
    assert re.search(r"^cartpole/mixed-v0: 48 episodes, return mean [-.0-9]+, fingerprint [0-9a-f]{12}$", out, re.M)
    assert len(re.findall(r", fingerprint [0-9a-f]{12}$", out, re.M)) == 4
    assert sorted(minari.list_local_datasets()) == [
        "cartpole/mixed-v0",
        "cartpole/ppo-expert-v0",
        "pendulum/sac-medium-replay-v0",
        "pendulum/sac-medium-v0",
    ]
    assert minari.load_dataset("cartpole/mixed-v0").total_episodes == 48


def test_make_offline_datasets_starts_again_under_the_reproducible_kernels_once(monkeypatch, capsys):
    script = load_example("make_offline_datasets")
    started = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append((argv, env))
        raise SystemExit  # execve does not return: this process would end here

    monkeypatch.setattr(script.os, "execve", execve)
    monkeypatch.setattr(sys, "argv", ["make_offline_datasets.py", "--quick"])
    for name in script.REPRODUCIBLE_KERNELS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # the user's own choice stays

    with pytest.raises(SystemExit):
        script._restart_with_reproducible_kernels()
    [(argv, env)] = started
    assert argv == [sys.executable, "make_offline_datasets.py", "--quick"]
    assert env["MKL_CBWR"] == "AUTO"
    assert env["ATEN_CPU_CAPABILITY"] == "default"
    assert env["GLIBC_TUNABLES"] == script.REPRODUCIBLE_KERNELS["GLIBC_TUNABLES"]

    assert capsys.readouterr().err == ""
    for name in script.REPRODUCIBLE_KERNELS:  # the new process has them all: it runs on, naming the one kept
        monkeypatch.setenv(name, env[name])
    script._restart_with_reproducible_kernels()
    assert len(started) == 1
    assert capsys.readouterr().err == (
        "make_offline_datasets: keeping your MKL_CBWR='AUTO'; the datasets may differ from the fingerprints in "
        "docs/tutorials/offline.md\n"
    )


def test_make_offline_datasets_stops_at_a_failing_command_with_its_status(tmp_path, capsys, monkeypatch):
    script = load_example("make_offline_datasets")
    monkeypatch.setattr(sys, "argv", ["make_offline_datasets.py", "--quick"])
    with pytest.raises(SystemExit) as exit_info:
        script._run(["fit", "--config", str(tmp_path / "missing.yaml")])
    assert exit_info.value.code == 2
    assert "make_offline_datasets: 'lightning-rl fit' exited with status 2" in capsys.readouterr().out
    assert sys.argv == ["make_offline_datasets.py", "--quick"]  # the script's own, back after the command
