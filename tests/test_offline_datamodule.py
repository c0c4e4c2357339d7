"""``OfflineDataModule``: Minari datasets read into rows, shuffled, sharded, resumed and evaluated.

Every dataset here is made on the spot with ``minari.create_dataset_from_buffers`` under a
temporary ``MINARI_DATASETS_PATH``; nothing is downloaded. Hand-made datasets hold
observations ``[episode, step]`` so that every row says where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from ranks import run_on_ranks

from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.data import OfflineDataModule
from lightning_rl.data.dataset_rows import episode_lengths, open_dataset
from lightning_rl.data.dataset_streams import RowStream
from lightning_rl.data.dataset_screen import screen_episodes

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer  # noqa: E402

HAND_OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
HAND_ACT_SPACE = gym.spaces.Discrete(3)


@pytest.fixture(autouse=True)
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's datasets live in its own temporary directory."""
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def hand_episode(index: int, steps: int, *, terminated: bool, rewards: list[float] | None = None) -> EpisodeBuffer:
    """An episode whose observation ``t`` is ``[index, t]`` (``steps + 1`` of them) and action ``t % 3``."""
    observations = np.stack([np.array([index, t], dtype=np.float32) for t in range(steps + 1)])
    flags = [False] * (steps - 1)
    return EpisodeBuffer(
        observations=observations,
        actions=np.arange(steps, dtype=np.int64) % 3,
        rewards=list(rewards if rewards is not None else np.arange(steps, dtype=np.float64) + 100 * index),
        terminations=[*flags, terminated],
        truncations=[*flags, not terminated],
    )


def make_hand_dataset(dataset_id: str, lengths: list[int]) -> int:
    """A dataset of episodes of these lengths (even ones terminate, odd ones truncate); returns its rows."""
    episodes = [hand_episode(i, steps, terminated=i % 2 == 0) for i, steps in enumerate(lengths)]
    minari.create_dataset_from_buffers(
        dataset_id, episodes, observation_space=HAND_OBS_SPACE, action_space=HAND_ACT_SPACE
    )
    return sum(lengths)


def make_cartpole_dataset(dataset_id: str, num_episodes: int, *, seed: int = 0) -> None:
    """CartPole episodes of a hand-written controller that balances well (greedy BC can copy it)."""
    env = gym.make("CartPole-v1")
    episodes = []
    for episode in range(num_episodes):
        obs, _ = env.reset(seed=seed + episode)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        done = False
        while not done:
            action = int(obs[2] + 0.5 * obs[3] > 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            done = terminated or truncated
        episodes.append(
            EpisodeBuffer(
                observations=np.stack(observations),
                actions=np.asarray(actions, dtype=np.int64),
                rewards=rewards,
                terminations=terminations,
                truncations=truncations,
            )
        )
    minari.create_dataset_from_buffers(dataset_id, episodes, env="CartPole-v1")


def stream_of(dataset_id: str, columns: list[str], **kwargs: Any) -> RowStream:
    dataset = open_dataset(dataset_id)
    options = dict(seed=0, shuffle=False, replacement=False, window_rows=None, gamma=None) | kwargs
    screening = screen_episodes(dataset, dataset_id, episode_lengths(dataset, dataset_id), on_nonfinite="raise")
    return RowStream(dataset, dataset_id, screening.episodes, columns=columns, **options)


def row_ids(obs: torch.Tensor) -> list[tuple[int, int]]:
    """``(episode, step)`` of each row of a hand-made dataset."""
    return [(int(e), int(t)) for e, t in obs.tolist()]


def bc_learner(**kwargs: Any) -> BCLearner:
    return BCLearner(model_config={"fcnet_hiddens": [8]}, **kwargs)


def offline_trainer(root: Path, **kwargs: Any) -> Trainer:
    options = dict(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
    ) | kwargs  # fmt: skip
    return Trainer(**options)


class RecordItems(Callback):
    """The rows of every minibatch and the timesteps of every train item a Learner receives."""

    def __init__(self) -> None:
        self.obs: list[np.ndarray] = []
        self.timesteps: list[float] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert batch.data.source == "data_iterators" and batch.update_settings == {"minibatch_size": None}
        self.timesteps.append(batch.timesteps[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        (minibatches,) = batch.data.data_iterators
        batch.data.data_iterators = [self._recorded(minibatches)]  # the rows, as update_from_iterator draws them

    def _recorded(self, minibatches: Any) -> Any:
        for minibatch in minibatches:
            self.obs.append(minibatch["default_policy"][Columns.OBS].numpy().copy())
            yield minibatch


# ----------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------


def test_rows_hold_every_column_with_final_observations_and_episode_ends():
    make_hand_dataset("test/rows-v0", [3, 2])
    columns = [Columns.OBS, Columns.NEXT_OBS, Columns.ACTIONS, Columns.REWARDS, Columns.TERMINATEDS, Columns.TRUNCATEDS]
    rows = stream_of("test/rows-v0", columns).rows(0, 5)

    assert row_ids(rows[Columns.OBS]) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    # The last step's new_obs is the episode's final observation, not the next episode's first.
    assert row_ids(rows[Columns.NEXT_OBS]) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert rows[Columns.ACTIONS].tolist() == [0, 1, 2, 0, 1]
    assert rows[Columns.ACTIONS].dtype == torch.int64 and rows[Columns.OBS].dtype == torch.float32
    assert rows[Columns.REWARDS].tolist() == [0.0, 1.0, 2.0, 100.0, 101.0]
    assert rows[Columns.TERMINATEDS].tolist() == [False, False, True, False, False]
    assert rows[Columns.TRUNCATEDS].tolist() == [False, False, False, False, True]


def test_value_targets_are_the_discounted_return_to_go_and_what_completes_them_the_final_observation():
    cut_short = hand_episode(2, 1, terminated=False, rewards=[7.0])
    cut_short = dataclasses.replace(cut_short, truncations=[False])  # a recording stopped mid-episode
    episodes = [
        hand_episode(0, 3, terminated=True, rewards=[1.0, 2.0, 3.0]),
        hand_episode(1, 2, terminated=False, rewards=[4.0, 5.0]),
        cut_short,
    ]
    minari.create_dataset_from_buffers(
        "test/returns-v0", episodes, observation_space=HAND_OBS_SPACE, action_space=HAND_ACT_SPACE
    )
    columns = [Columns.VALUE_TARGETS, Columns.BOOTSTRAP_OBS, Columns.BOOTSTRAP_DISCOUNT]
    rows = stream_of("test/returns-v0", columns, gamma=0.5).rows(0, 6)
    # 1 + .5*2 + .25*3, 2 + .5*3, 3 | truncated: 4 + .5*5, 5 | cut short: 7
    assert rows[Columns.VALUE_TARGETS].tolist() == [2.75, 3.5, 3.0, 6.5, 5.0, 7.0]
    # The value of the final observation completes them where the episode did not terminate.
    assert rows[Columns.BOOTSTRAP_DISCOUNT].tolist() == [0.0, 0.0, 0.0, 0.25, 0.5, 0.5]
    assert row_ids(rows[Columns.BOOTSTRAP_OBS]) == [(0, 3)] * 3 + [(1, 2)] * 2 + [(2, 1)]


def test_shuffling_is_a_function_of_the_seed_and_differs_across_passes():
    num_rows = make_hand_dataset("test/shuffle-v0", [4, 3, 5, 2])
    first = stream_of("test/shuffle-v0", [Columns.OBS], seed=7, shuffle=True)
    again = stream_of("test/shuffle-v0", [Columns.OBS], seed=7, shuffle=True)
    other = stream_of("test/shuffle-v0", [Columns.OBS], seed=8, shuffle=True)

    pass0, pass1 = (row_ids(first.rows(p * num_rows, (p + 1) * num_rows)[Columns.OBS]) for p in (0, 1))
    # Asked in other stretches, the same positions hold the same rows.
    pieces = [again.rows(start, min(start + 5, 2 * num_rows))[Columns.OBS] for start in range(0, 2 * num_rows, 5)]
    assert row_ids(torch.cat(pieces)) == pass0 + pass1
    assert row_ids(other.rows(0, num_rows)[Columns.OBS]) != pass0
    # Each pass visits every row once, in an order of its own.
    assert sorted(pass0) == sorted(pass1) and len(set(pass0)) == num_rows
    assert pass0 != pass1


def test_sampling_with_replacement_draws_rows_independently_as_a_function_of_the_seed():
    lengths = [20] * 10
    num_rows = make_hand_dataset("test/replacement-v0", lengths)
    first = stream_of("test/replacement-v0", [Columns.OBS], seed=7, shuffle=True, replacement=True)
    again = stream_of("test/replacement-v0", [Columns.OBS], seed=7, shuffle=True, replacement=True)
    shuffled = stream_of("test/replacement-v0", [Columns.OBS], seed=7, shuffle=True)

    drawn = row_ids(first.rows(0, 3 * num_rows)[Columns.OBS])
    pieces = [again.rows(start, start + 7)[Columns.OBS] for start in range(0, 3 * num_rows, 7)]
    assert row_ids(torch.cat(pieces))[: 3 * num_rows] == drawn  # the same positions hold the same rows
    for p in range(3):
        one_pass = drawn[p * num_rows : (p + 1) * num_rows]
        # Independent uniform draws: about 1 - 1/e (63%) of the rows come in a pass, some of them twice.
        assert 0.55 * num_rows < len(set(one_pass)) < 0.72 * num_rows
    assert set(drawn) <= {(e, t) for e, steps in enumerate(lengths) for t in range(steps)}
    assert drawn[:num_rows] != row_ids(shuffled.rows(0, num_rows)[Columns.OBS])

    # Streaming draws within each window of whole episodes: its first window's draws come from few episodes.
    windows = stream_of("test/replacement-v0", [Columns.OBS], seed=7, shuffle=True, replacement=True, window_rows=40)
    from_windows = row_ids(windows.rows(0, num_rows)[Columns.OBS])
    assert len({e for e, _ in from_windows[:40]}) <= 2 and len(set(from_windows)) < 0.72 * num_rows

    with pytest.raises(ValueError, match="cannot keep the dataset's order"):
        stream_of("test/replacement-v0", [Columns.OBS], shuffle=False, replacement=True).rows(0, 1)


def test_streaming_reads_windows_of_episodes_and_yields_every_row_once_per_pass():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    num_rows = make_hand_dataset("test/stream-v0", lengths)
    stream = stream_of("test/stream-v0", [Columns.OBS, Columns.NEXT_OBS], seed=1, shuffle=True, window_rows=10)
    in_memory = stream_of("test/stream-v0", [Columns.OBS], seed=1, shuffle=True)

    passes = []
    for p in range(2):
        pieces = [stream.rows(s, min(s + 4, (p + 1) * num_rows)) for s in range(p * num_rows, (p + 1) * num_rows, 4)]
        obs = torch.cat([piece[Columns.OBS] for piece in pieces])
        next_obs = torch.cat([piece[Columns.NEXT_OBS] for piece in pieces])
        assert torch.equal(next_obs[:, 0], obs[:, 0]) and torch.equal(next_obs[:, 1], obs[:, 1] + 1)
        passes.append(row_ids(obs))
    expected = sorted((e, t) for e, steps in enumerate(lengths) for t in range(steps))
    assert sorted(passes[0]) == sorted(passes[1]) == expected
    assert passes[0] != passes[1]
    # Whole episodes per window, about 10 rows each: many windows, never the dataset at once.
    assert stream.num_windows_read >= 2 * (num_rows // 10)
    assert len(stream._windows) <= 2
    # Within a pass, a window's rows come together: the first 10 rows come from few episodes.
    assert len({e for e, _ in passes[0][:10]}) < 10
    assert passes[0] != row_ids(in_memory.rows(0, num_rows)[Columns.OBS])

    unshuffled = stream_of("test/stream-v0", [Columns.OBS], shuffle=False, window_rows=10)
    assert row_ids(unshuffled.rows(0, num_rows)[Columns.OBS]) == expected

    # Windows hold whole episodes, so returns-to-go, final observations and their discounts are
    # those of the whole episode, as in memory.
    columns = [Columns.OBS, Columns.VALUE_TARGETS, Columns.BOOTSTRAP_OBS, Columns.BOOTSTRAP_DISCOUNT]
    windows = stream_of("test/stream-v0", columns, seed=1, shuffle=True, window_rows=10, gamma=0.9).rows(0, num_rows)
    whole = stream_of("test/stream-v0", columns, gamma=0.9).rows(0, num_rows)
    for column in columns[1:]:
        by_row = dict(zip(row_ids(whole[Columns.OBS]), whole[column].tolist()))
        assert [by_row[row] for row in row_ids(windows[Columns.OBS])] == windows[column].tolist(), column


def test_in_memory_is_chosen_by_size_unless_set(monkeypatch):
    make_hand_dataset("test/size-v0", [3, 3])
    assert OfflineDataModule("test/size-v0").in_memory
    assert not OfflineDataModule("test/size-v0", in_memory=False).in_memory
    monkeypatch.setattr("lightning_rl.data.offline.IN_MEMORY_LIMIT_BYTES", 10)
    assert not OfflineDataModule("test/size-v0").in_memory


# ----------------------------------------------------------------------------------------
# Training: items, ranks, resume, evaluation
# ----------------------------------------------------------------------------------------


def test_items_are_minibatches_of_the_learners_columns_counting_rows_as_timesteps(tmp_path):
    num_rows = make_hand_dataset("test/items-v0", [4, 4, 4, 4])
    data = OfflineDataModule("test/items-v0", batch_size=4, updates_per_epoch=4, seed=0)
    record = RecordItems()
    learner = bc_learner()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    assert record.timesteps == [4, 8, 12, 16]
    rows = [tuple(r) for batch in record.obs for r in batch.tolist()]
    assert len(rows) == len(set(rows)) == num_rows  # one pass, each row once
    assert learner.weights_seq_no == 4
    assert data.state_dict()[NUM_ENV_STEPS_SAMPLED_LIFETIME] == 16
    # BC asks for obs and actions only: nothing else is gathered.
    assert sorted(data.next_minibatch()["default_policy"]) == [Columns.ACTIONS, Columns.OBS]


def test_an_item_of_several_minibatches_trains_one_step_each_with_the_hooks_around_the_item(tmp_path):
    make_hand_dataset("test/items-v0", [4, 4, 4, 4])
    data = OfflineDataModule("test/items-v0", batch_size=2, updates_per_epoch=2, iterations_per_update=3, seed=0)
    record = RecordItems()
    learner = bc_learner()
    updates = []
    learner.before_gradient_based_update = lambda *, timesteps: updates.append(dict(timesteps))
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    assert record.timesteps == [6, 12]  # the position after each item's three minibatches
    assert [len(obs) for obs in record.obs] == [2] * 6
    assert learner.weights_seq_no == 6
    assert [u[NUM_ENV_STEPS_SAMPLED_LIFETIME] for u in updates] == [6, 12]


def _offline_fit_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import seed_everything

    os.environ["MINARI_DATASETS_PATH"] = os.path.join(root, "minari")
    seed_everything(0)
    record = RecordItems()
    learner = bc_learner(lr=1e-2)
    data = OfflineDataModule("test/ranks-v0", batch_size=3, updates_per_epoch=4)  # seed=None: rank 0's is shared
    trainer = offline_trainer(Path(root), strategy="ddp", devices=world_size, callbacks=[record], limit_val_batches=0)
    trainer.fit(learner, datamodule=data)
    return {
        "obs": np.concatenate(record.obs),
        "timesteps": record.timesteps,
        "weights": {k: v.detach().numpy().copy() for k, v in learner.module["default_policy"].state_dict().items()},
    }


def test_two_ranks_train_on_disjoint_rows_that_together_cover_a_pass(tmp_path):
    num_rows = make_hand_dataset("test/ranks-v0", [5, 7, 6, 6])  # 24 rows: 4 items of 2 ranks * 3 rows
    rank0, rank1 = run_on_ranks(_offline_fit_on_rank, str(tmp_path), world_size=2, timeout=240)

    rows0, rows1 = ({tuple(r) for r in rank["obs"].tolist()} for rank in (rank0, rank1))
    assert len(rows0) == len(rows1) == num_rows // 2
    assert not rows0 & rows1
    assert len(rows0 | rows1) == num_rows
    assert rank0["timesteps"] == rank1["timesteps"] == [6, 12, 18, 24]
    for name, value in rank0["weights"].items():
        np.testing.assert_array_equal(value, rank1["weights"][name], err_msg=name)


def _fit(
    root: Path, *, max_epochs: int, ckpt_path: str | None = None, every: int | None = None, replacement: bool = False
) -> tuple:
    record = RecordItems()
    callbacks: list[Callback] = [record]
    if every is not None:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=every, save_top_k=-1))
    torch.manual_seed(0)
    # The learning rate falls with the rows trained on: the schedule must resume where it was.
    learner = bc_learner(lr=[[0, 3e-2], [60, 1e-3]])
    data = OfflineDataModule(
        "test/resume-v0", batch_size=5, updates_per_epoch=4, seed=3, sample_with_replacement=replacement
    )
    trainer = offline_trainer(
        root, max_epochs=max_epochs, callbacks=callbacks, enable_checkpointing=every is not None, limit_val_batches=0
    )
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return learner, record


@pytest.mark.parametrize("replacement", [False, True], ids=["passes", "with_replacement"])
def test_a_resumed_fit_continues_the_stream_and_ends_with_identical_weights(tmp_path, replacement):
    make_hand_dataset("test/resume-v0", [4, 5, 3, 6])  # 18 rows: items straddle passes
    whole, whole_items = _fit(tmp_path / "whole", max_epochs=3, replacement=replacement)
    _, first_items = _fit(tmp_path / "first", max_epochs=3, every=6, replacement=replacement)
    # Resume mid-epoch: from the checkpoint after item 6 of 12 (epoch 1's second item), the first written.
    checkpoint = min((tmp_path / "first" / "ckpt").glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns)
    resumed, resumed_items = _fit(
        tmp_path / "resumed", max_epochs=3, ckpt_path=str(checkpoint), replacement=replacement
    )

    assert whole_items.timesteps == [5 * (i + 1) for i in range(12)]
    first_pass = [tuple(row) for obs in whole_items.obs for row in obs.tolist()][:18]
    assert (len(set(first_pass)) < 18) == replacement  # rows repeat within a pass only when drawn with replacement
    assert resumed_items.timesteps == whole_items.timesteps[6:]
    for ours, theirs in zip(resumed_items.obs, whole_items.obs[6:]):
        np.testing.assert_array_equal(ours, theirs)
    for name, value in whole.module["default_policy"].state_dict().items():
        assert torch.equal(value, resumed.module["default_policy"].state_dict()[name]), name
    assert [o.tolist() for o in first_items.obs] == [o.tolist() for o in whole_items.obs]


def test_bc_fits_a_cartpole_dataset_and_evaluates_greedy_episodes_in_its_env(tmp_path):
    make_cartpole_dataset("cartpole/heuristic-v0", 3)
    data = OfflineDataModule(
        "cartpole/heuristic-v0", batch_size=64, updates_per_epoch=30, seed=0, evaluation_num_episodes=2
    )
    assert data.observation_space.shape == (4,) and data.action_space == gym.spaces.Discrete(2)
    learner = bc_learner(lr=1e-2)
    trainer = offline_trainer(tmp_path, max_epochs=1)
    trainer.fit(learner, datamodule=data)

    metrics = trainer.callback_metrics
    assert "eval/episode_return_mean" in metrics and metrics["eval/num_episodes"] == 2
    assert float(metrics["eval/episode_return_mean"]) >= 1.0
    assert learner.weights_seq_no == 30

    # Trainer.validate alone evaluates too (no train item drawn, the position kept).
    (results,) = offline_trainer(tmp_path).validate(learner, datamodule=data, verbose=False)
    assert results["eval/num_episodes"] == 2
    assert data.num_env_steps_sampled_lifetime == 30 * 64


def test_the_cli_fits_bc_from_a_yaml_config_naming_the_dataset(tmp_path):
    from lightning_rl.cli import LightningRLCLI

    make_cartpole_dataset("cartpole/heuristic-v0", 2)
    config = tmp_path / "bc.yaml"
    config.write_text(
        "model:\n"
        "  class_path: lightning_rl.algorithms.bc.BCLearner\n"
        "  init_args: {model_config: {fcnet_hiddens: [8]}, lr: 0.01}\n"
        "data:\n"
        "  class_path: lightning_rl.data.OfflineDataModule\n"
        "  init_args: {dataset_id: cartpole/heuristic-v0, batch_size: 32, updates_per_epoch: 5, seed: 0, "
        "evaluation_num_episodes: 1}\n"
        f"trainer: {{max_epochs: 1, logger: false, enable_checkpointing: false, enable_progress_bar: false, "
        f"default_root_dir: {tmp_path}}}\n"
    )
    cli = LightningRLCLI(args=["fit", "--config", str(config)])
    assert cli.datamodule.num_env_steps_sampled_lifetime == 5 * 32
    assert cli.trainer.callback_metrics["eval/num_episodes"] == 1


@pytest.mark.slow
def test_bc_on_a_balancing_dataset_balances(tmp_path):
    make_cartpole_dataset("cartpole/heuristic-v0", 10)
    data = OfflineDataModule(
        "cartpole/heuristic-v0", batch_size=256, updates_per_epoch=300, seed=0, evaluation_num_episodes=4
    )
    trainer = offline_trainer(tmp_path, max_epochs=1)
    trainer.fit(BCLearner(model_config={"fcnet_hiddens": [32]}, lr=3e-3), datamodule=data)
    assert float(trainer.callback_metrics["eval/episode_return_mean"]) >= 400


# ----------------------------------------------------------------------------------------
# Errors before training
# ----------------------------------------------------------------------------------------


def test_a_dataset_that_is_not_local_names_the_local_ones_and_how_to_record_one():
    make_hand_dataset("test/present-v0", [2])
    with pytest.raises(
        ValueError,
        match=r"'test/absent-v0' is not a local Minari dataset.*test/present-v0.*lightning-rl record.*"
        r"examples/make_offline_datasets.py",
    ):
        OfflineDataModule("test/absent-v0")


@pytest.mark.parametrize("damage", ["truncated_hdf5", "missing_metadata", "missing_hdf5"])
def test_a_corrupt_dataset_is_refused_at_construction(minari_root, damage):
    make_hand_dataset("test/broken-v0", [3, 4])
    data_dir = minari_root / "test" / "broken-v0" / "data"
    if damage == "truncated_hdf5":
        hdf5 = data_dir / "main_data.hdf5"
        hdf5.write_bytes(hdf5.read_bytes()[:300])
    elif damage == "missing_metadata":
        (data_dir / "metadata.json").unlink()
    else:
        (data_dir / "main_data.hdf5").unlink()
    with pytest.raises(ValueError, match=r"'test/broken-v0' cannot be read .*corrupt"):
        OfflineDataModule("test/broken-v0")


@pytest.mark.parametrize("space", ["observation_space", "action_space"])
def test_a_dataset_without_stored_spaces_is_refused_before_minari_builds_its_env(minari_root, space, monkeypatch):
    """Minari would ``gym.make`` the stored env spec to find a missing space: code named in the data."""
    make_cartpole_dataset("cartpole/no-spaces-v0", 1)
    metadata_file = minari_root / "cartpole" / "no-spaces-v0" / "data" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    del metadata[space]
    metadata_file.write_text(json.dumps(metadata))
    made = []
    monkeypatch.setattr(gym, "make", lambda *args, **kwargs: made.append(args))
    with pytest.raises(ValueError, match=rf"'cartpole/no-spaces-v0' stores no {space}.*runs code named in the dataset"):
        OfflineDataModule("cartpole/no-spaces-v0")
    assert made == []


def test_an_episode_that_cannot_be_read_is_refused_before_the_first_step(minari_root, tmp_path):
    import h5py

    make_hand_dataset("test/lost-actions-v0", [3, 4])
    with h5py.File(minari_root / "test" / "lost-actions-v0" / "data" / "main_data.hdf5", "a") as file:
        del file["episode_1/actions"]
    data = OfflineDataModule("test/lost-actions-v0", batch_size=2, updates_per_epoch=2)  # the metadata is whole
    learner = bc_learner()
    with pytest.raises(ValueError, match=r"'test/lost-actions-v0' cannot be read"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0


def test_a_module_whose_spaces_do_not_fit_the_dataset_is_refused_before_training(tmp_path):
    make_hand_dataset("test/spaces-v0", [3, 3])
    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=gym.spaces.Box(-1, 1, (3,), np.float32),
        action_space=HAND_ACT_SPACE,
        model_config={"fcnet_hiddens": [8]},
    )
    learner = BCLearner(spec)
    data = OfflineDataModule("test/spaces-v0", batch_size=2, updates_per_epoch=2)
    with pytest.raises(ValueError, match=r"observation space Box\(-inf, inf, \(2,\).*Box\(-1\.0, 1\.0, \(3,\)"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0


def make_pendulum_dataset(dataset_id: str) -> None:
    """Two short Pendulum episodes of random actions (Box actions in [-2, 2])."""
    env = gym.make("Pendulum-v1", max_episode_steps=5)
    env.action_space.seed(0)
    episodes = []
    for episode in range(2):
        obs, _ = env.reset(seed=episode)
        observations, actions, rewards = [obs], [], []
        for _ in range(5):
            actions.append(env.action_space.sample())
            obs, reward, *_ = env.step(actions[-1])
            observations.append(obs)
            rewards.append(reward)
        flags = [False] * 4
        episodes.append(
            EpisodeBuffer(
                observations=np.stack(observations),
                actions=np.stack(actions),
                rewards=rewards,
                terminations=[*flags, False],
                truncations=[*flags, True],
            )
        )
    minari.create_dataset_from_buffers(dataset_id, episodes, env="Pendulum-v1")


def test_a_module_acting_in_other_action_bounds_is_refused_since_actions_are_rescaled_by_them(tmp_path):
    make_pendulum_dataset("pendulum/random-v0")
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    spec = RLModuleSpec(
        module_class=SACModule,
        observation_space=observation_space,
        action_space=gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
        model_config={"fcnet_hiddens": [8]},
    )
    data = OfflineDataModule("pendulum/random-v0", batch_size=2, updates_per_epoch=2)
    learner = SACLearner(spec)
    with pytest.raises(ValueError, match=r"action space Box\(-2\.0, 2\.0, \(1,\).*Box\(-1\.0, 1\.0, \(1,\)"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0


def test_n_step_returns_are_refused_on_one_step_dataset_rows(tmp_path):
    make_pendulum_dataset("pendulum/random-v0")
    learner = SACLearner(model_config={"fcnet_hiddens": [8]}, n_step=3)
    data = OfflineDataModule("pendulum/random-v0", batch_size=2, updates_per_epoch=2)
    with pytest.raises(ValueError, match=r"n_step=3, .* one-step transitions: set n_step=1"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0


class _NeedsLogp(BCLearner):
    def required_batch_columns(self, module_id: str) -> list[str]:
        return [Columns.OBS, Columns.ACTIONS, Columns.ACTION_LOGP]


class _NeedsReturns(BCLearner):
    def required_batch_columns(self, module_id: str) -> list[str]:
        return [Columns.OBS, Columns.ACTIONS, Columns.VALUE_TARGETS]


def test_a_learner_requiring_a_column_datasets_lack_is_refused_before_training(tmp_path):
    make_hand_dataset("test/columns-v0", [3, 3])
    data = OfflineDataModule("test/columns-v0", batch_size=2, updates_per_epoch=2)
    with pytest.raises(ValueError, match=r"_NeedsLogp requires column\(s\) \['action_logp'\]"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(_NeedsLogp(model_config={}), datamodule=data)
    with pytest.raises(ValueError, match="has no hyperparameter gamma"):
        offline_trainer(tmp_path, limit_val_batches=0).fit(_NeedsReturns(model_config={}), datamodule=data)


def test_missing_minari_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "minari", None)
    with pytest.raises(ImportError, match=r'pip install "lightning-rl\[offline\]"'):
        OfflineDataModule("test/any-v0")


def test_an_env_the_dataset_cannot_name_must_be_given_for_evaluation(tmp_path):
    make_hand_dataset("test/no-env-v0", [3, 3])  # recorded without an env spec
    data = OfflineDataModule("test/no-env-v0", batch_size=2, updates_per_epoch=2)
    learner = bc_learner()
    with pytest.raises(ValueError, match=r"not a registered gymnasium id: pass the evaluation env"):
        offline_trainer(tmp_path).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0


def test_an_evaluation_env_whose_spaces_are_not_the_datasets_is_refused(tmp_path):
    make_cartpole_dataset("cartpole/heuristic-v0", 1)
    data = OfflineDataModule("cartpole/heuristic-v0", evaluation_env="Pendulum-v1", batch_size=2, updates_per_epoch=2)
    learner = bc_learner()
    with pytest.raises(ValueError, match=r"observation space Box\(.*\(4,\).*evaluation env 'Pendulum-v1'.*\(3,\)"):
        offline_trainer(tmp_path).fit(learner, datamodule=data)
    assert learner.weights_seq_no == 0  # Lightning asks for the evaluation loader before the first train item


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"updates_per_epoch": 1.5}, "updates_per_epoch must be an int >= 1"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"evaluation_num_envs": 0}, "evaluation_num_envs must be an int >= 1"),
        ({"in_memory": "yes"}, "in_memory must be a bool"),
        ({"shuffle": None}, "shuffle must be a bool"),
        ({"sample_with_replacement": 1}, "sample_with_replacement must be a bool"),
        ({"sample_with_replacement": True, "shuffle": False}, "cannot keep the dataset's order"),
        ({"evaluation_env": "NoSuchEnv-v9"}, "NoSuchEnv-v9"),
        ({"evaluation_env_kwargs": [1]}, "evaluation_env_kwargs must be a dict"),
        ({"iterations_per_update": 0}, "iterations_per_update must be an int >= 1"),
        ({"evaluation_explore": 1}, "evaluation_explore must be a bool"),
    ],
)
def test_invalid_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OfflineDataModule("test/any-v0", **kwargs)


class RecordEvaluationEpisodes(Callback):
    """The episodes of every evaluation item."""

    def __init__(self) -> None:
        self.episodes: list[Any] = []

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        self.episodes.extend(batch.data.episodes)


@pytest.mark.parametrize("explore", [False, True])
def test_evaluation_acts_greedily_unless_evaluation_explore_samples(tmp_path, explore):
    make_cartpole_dataset("cartpole/heuristic-v0", 2)
    data = OfflineDataModule("cartpole/heuristic-v0", seed=0, evaluation_num_episodes=4, evaluation_explore=explore)
    learner = bc_learner()
    recorder = RecordEvaluationEpisodes()
    torch.manual_seed(0)
    offline_trainer(tmp_path, callbacks=[recorder]).validate(learner, datamodule=data, verbose=False)

    obs = torch.as_tensor(np.concatenate([np.asarray(e.observations)[:-1] for e in recorder.episodes]))
    played = np.concatenate([np.asarray(e.actions) for e in recorder.episodes])
    with torch.no_grad():
        greedy = learner.module["default_policy"].forward_inference({Columns.OBS: obs})
    greedy_actions = (
        greedy[Columns.ACTION_DIST_INPUTS].argmax(-1).numpy()
        if Columns.ACTIONS not in greedy
        else greedy[Columns.ACTIONS].numpy()
    )
    # A fresh policy's two actions are about equally likely: sampling departs from the greedy one.
    assert (played != greedy_actions).any() == explore


def test_the_offline_benchmark_scripts_train_and_evaluate_on_tiny_datasets(import_benchmark):
    # The scripts run nowhere else in the suite: this catches an API they use changing under them.
    make_cartpole_dataset("test/bench-cartpole-v0", num_episodes=2)
    cartpole = import_benchmark("offline_cartpole")
    config = cartpole.EXAMPLES / "marwil_cartpole.yaml"
    greedy, sampled = cartpole.train_and_evaluate(config, "test/bench-cartpole-v0", {}, 3, 0, 2)
    assert 1 <= greedy <= 500 and 1 <= sampled <= 500
    make_pendulum_dataset("test/bench-pendulum-v0")
    pendulum = import_benchmark("marwil_pendulum")
    settings = dict(rate=0.1, steps=3, episodes=2, lstm=None, max_seq_len=20, returns_to_go_only=False)
    greedy, sampled = pendulum.train_and_evaluate("test/bench-pendulum-v0", 0, argparse.Namespace(**settings))
    assert -3000 < greedy < 0 and -3000 < sampled < 0
    # Recurrent modules, and the baseline whose targets are the returns-to-go alone.
    settings |= dict(lstm=8, max_seq_len=4, returns_to_go_only=True)
    greedy, sampled = pendulum.train_and_evaluate("test/bench-pendulum-v0", 0, argparse.Namespace(**settings))
    assert -3000 < greedy < 0 and -3000 < sampled < 0
