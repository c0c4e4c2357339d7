"""Recordings that are stopped: SIGTERM and SIGINT write what ended, kills leave nothing for good.

``lightning-rl record`` and ``RecordEpisodes`` write the episodes that ended when a signal stops
them; the Minari writer's directories of a killed writer are swept by the next write, and an
``--overwrite`` killed at any point is finished (or undone) by the next write or read.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import minari
import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.callbacks import RecordEpisodes
from lightning_rl.cli import record_command
from lightning_rl.core.checkpoint import writer_tag
from lightning_rl.data import OnPolicyDataModule, minari_writer
from lightning_rl.data.dataset_rows import open_dataset
from lightning_rl.data.minari_io import WRITING_PREFIX
from lightning_rl.data.minari_writer import check_dataset_id
from lightning_rl.env.episode import SingleAgentEpisode

REPOSITORY = Path(__file__).resolve().parents[1]
_ENDED = {"count": 0}  # over every env copy of the process


@pytest.fixture(autouse=True)
def datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari_datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


class _SigtermAfterEpisodes(gym.Wrapper):
    """Sends this process SIGTERM at the reset after ``$STOP_AFTER_EPISODES`` episodes ended (a scheduler's stop)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.stop_after = int(os.environ["STOP_AFTER_EPISODES"])

    def step(self, action):
        step = super().step(action)
        _ENDED["count"] += bool(step[2] or step[3])
        return step

    def reset(self, **kwargs):
        if _ENDED["count"] == self.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().reset(**kwargs)


def make_stopped_cartpole() -> gym.Env:
    return _SigtermAfterEpisodes(gym.make("CartPole-v1"))


def test_record_writes_the_episodes_that_ended_when_sigterm_stops_it(datasets_root: Path):
    # SIGTERM used to end the process at once (in a process of its own: it would end pytest):
    # 134 played episodes lost, nothing said.
    command = [sys.executable, "-m", "lightning_rl", "record", "--env", "test_record_interrupted.make_stopped_cartpole"]
    command += ["--random_fraction", "1", "--num_episodes", "20", "--dataset_id", "cartpole/stopped-v0"]
    pythonpath = os.pathsep.join([str(REPOSITORY), str(REPOSITORY / "tests"), os.environ.get("PYTHONPATH", "")])
    stopped = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": pythonpath, "STOP_AFTER_EPISODES": "5"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "stopped by SIGTERM after 5 of 20 episodes" in stopped.stdout
    dataset = minari.load_dataset("cartpole/stopped-v0")
    assert dataset.total_episodes == 5
    assert all(episode.terminations[-1] or episode.truncations[-1] for episode in dataset.iterate_episodes())
    assert not [path.name for path in datasets_root.iterdir() if path.name.startswith(".")]


def test_a_fit_stopped_by_sigterm_exits_with_status_143(tmp_path: Path):
    # Lightning ends a fit stopped by SIGTERM with a bare SystemExit: the command exited 0 and
    # said nothing, so a scheduler could not tell a preempted run from a finished one.
    command = [sys.executable, "-m", "lightning_rl", "fit", "--config", str(REPOSITORY / "examples/ppo_cartpole.yaml")]
    command += ["--data.init_args.env", "test_record_interrupted.make_stopped_cartpole", "--trainer.logger", "false"]
    command += ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)]
    pythonpath = os.pathsep.join([str(REPOSITORY), str(REPOSITORY / "tests"), os.environ.get("PYTHONPATH", "")])
    stopped = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": pythonpath, "STOP_AFTER_EPISODES": "30", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "lightning-rl fit: stopped by SIGTERM before the run ended" in stopped.stderr


class _SigtermAtBatch(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 6:
            os.kill(os.getpid(), signal.SIGTERM)


def test_the_callback_writes_the_recorded_episodes_when_sigterm_stops_the_fit():
    # The callback wrote only from on_fit_end: a scheduler's SIGTERM discarded every episode.
    torch.manual_seed(0)
    datamodule = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=16, seed=1)
    callback = RecordEpisodes("cartpole/ppo-stopped-v0")
    trainer = Trainer(
        max_epochs=-1,
        callbacks=[callback, _SigtermAtBatch()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    learner = PPOLearner(minibatch_size=32, num_epochs=1, model_config={"fcnet_hiddens": [8]})
    with pytest.raises(SIGTERMException):
        trainer.fit(learner, datamodule=datamodule)
    dataset = minari.load_dataset("cartpole/ppo-stopped-v0")
    assert dataset.total_episodes == len(callback.episodes) > 0


def _exited_pid() -> int:
    return int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_directories_of_killed_writers_are_swept_and_running_ones_kept(datasets_root: Path):
    # A killed record left its .lightning_rl-writing-* directory (the whole dataset) forever.
    datasets_root.mkdir(parents=True)
    ours = writer_tag(WRITING_PREFIX)
    dead = datasets_root / ours.replace(f".{os.getpid()}.", f".{_exited_pid()}.") / "abc"
    running = datasets_root / f"{ours}def"
    legacy = datasets_root / f"{WRITING_PREFIX}0123456789abcdef"  # no writer named: not ours to judge
    for path in (dead, running, legacy):
        (path / "data").mkdir(parents=True)
    check_dataset_id("cartpole/any-v0")
    assert not dead.parent.exists() and running.exists() and legacy.exists()


def _overwrite_killed_after(renames_before_kill: int) -> None:
    """In a forked child: ``--overwrite`` of cartpole/swap-v0, killed after that many renames."""
    env = gym.make("CartPole-v1")
    episodes = []
    for seed in range(3):
        episode = SingleAgentEpisode()
        episode.add_env_reset(env.reset(seed=seed)[0])
        while not episode.is_done:
            obs, reward, terminated, truncated, _ = env.step(0)
            episode.add_env_step(obs, 0, reward, terminated=terminated, truncated=truncated)
        episodes.append(episode.to_numpy())
    move, rename = minari_writer._move_into_place, Path.rename

    def killing_move(*args):
        done = []

        def counted(path, target):
            if len(done) == renames_before_kill:
                os._exit(9)
            done.append(target)
            return rename(path, target)

        def killed(*args, **kwargs):
            os._exit(9)  # after both renames, before the old dataset is removed

        Path.rename = counted  # the child's own classes and modules; this process's are untouched
        minari_writer.shutil.rmtree = killed
        return move(*args)

    minari_writer._move_into_place = killing_move
    minari_writer.write_minari_dataset(
        "cartpole/swap-v0", episodes, observation_space=env.observation_space,
        action_space=env.action_space, overwrite=True,
    )  # fmt: skip


@pytest.mark.parametrize(("renames_before_kill", "episodes_after"), [(0, 2), (1, 3), (2, 3)])
def test_an_overwrite_killed_at_any_point_is_finished_by_the_next_run(
    renames_before_kill: int, episodes_after: int, datasets_root: Path
):
    # A kill between --overwrite's two renames hid the dataset id for good.
    record_command.main(["--env", "CartPole-v1", "--random_fraction", "1", "--num_episodes", "2",
                         "--dataset_id", "cartpole/swap-v0"])  # fmt: skip
    # A forked copy of this process is the writer that gets killed: nothing to import.
    killed = multiprocessing.get_context("fork").Process(target=_overwrite_killed_after, args=(renames_before_kill,))
    killed.start()
    killed.join(timeout=300)
    assert killed.exitcode == 9
    assert [path.name for path in datasets_root.iterdir() if path.name.startswith(".lightning_rl-swap-")]
    # Reading the id (as an OfflineDataModule does) finishes the swap first, or undoes it.
    assert open_dataset("cartpole/swap-v0").total_episodes == episodes_after
    leftovers = [path for path in datasets_root.rglob(".lightning_rl-*")]
    assert not leftovers, leftovers
