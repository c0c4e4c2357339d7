"""Recurrent (use_lstm) BC and MARWIL trained on offline datasets: sequences from zero start states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.dqn import DQNModule
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.recurrent import batched_initial_state
from lightning_rl.core.sequences import from_sequences, sequence_layout, to_sequences
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.data import OfflineDataModule
from lightning_rl.data.dataset_rows import DATASET_COLUMNS, episode_lengths, open_dataset
from lightning_rl.data.dataset_streams import SequenceStream
from lightning_rl.data.dataset_screen import screen_episodes

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer
from ranks import run_on_ranks

# minari_root: the autouse fixture that gives every test its own dataset folder.
from test_offline_datamodule import hand_episode, make_hand_dataset, minari_root, offline_trainer  # noqa: F401

MODULE_ID = "default_policy"
OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACTIONS = gym.spaces.Discrete(3)


def recurrent_config(max_seq_len: int, **extra: Any) -> dict[str, Any]:
    return {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4, "max_seq_len": max_seq_len, **extra}


def make_cue_dataset(dataset_id: str, num_episodes: int, steps: int) -> None:
    """A memory task: a cue (0, 1 or 2) shows in the first observation only, and every action repeats it.

    A feed-forward policy can copy the first step only (log-likelihood of chance, log 3, on the
    others); a recurrent one that remembers the cue copies every step.
    """
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(num_episodes):
        cue = int(rng.integers(3))
        observations = np.zeros((steps + 1, 2), dtype=np.float32)
        observations[0] = [cue - 1, 1]
        flags = [False] * (steps - 1)
        episodes.append(
            EpisodeBuffer(
                observations=observations,
                actions=np.full(steps, cue, dtype=np.int64),
                rewards=[1.0] * steps,
                terminations=[*flags, True],
                truncations=[False] * steps,
            )
        )
    minari.create_dataset_from_buffers(dataset_id, episodes, observation_space=OBS, action_space=ACTIONS)


def terminated_chunks(num_sequences: int, max_seq_len: int) -> dict[str, torch.Tensor]:
    """Bootstrap columns of sequences from terminated episodes: a discount of 0, so nothing is added."""
    return {
        Columns.BOOTSTRAP_OBS: torch.zeros(num_sequences, max_seq_len, 2),
        Columns.BOOTSTRAP_STEPS: torch.ones(num_sequences, dtype=torch.long),
        Columns.BOOTSTRAP_PREV_ACTIONS: torch.zeros(num_sequences, max_seq_len, dtype=torch.long),
        Columns.BOOTSTRAP_PREV_REWARDS: torch.zeros(num_sequences, max_seq_len),
        Columns.BOOTSTRAP_DISCOUNT: torch.zeros(num_sequences, max_seq_len),
    }


class RecordMinibatches(Callback):
    """Every minibatch the Learner draws (as the data module yields it), the items' timesteps and the losses."""

    def __init__(self) -> None:
        self.minibatches: list[dict[str, Any]] = []
        self.timesteps: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.timesteps.append(batch.timesteps[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        (minibatches,) = batch.data.data_iterators
        batch.data.data_iterators = [self._recorded(minibatches)]

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(outputs["results"][MODULE_ID]["total_loss"])

    def _recorded(self, minibatches: Any) -> Any:
        for minibatch in minibatches:
            self.minibatches.append(minibatch[MODULE_ID])
            yield minibatch


def test_episodes_become_zero_padded_sequences_from_zero_states_with_the_previous_step(tmp_path):
    # Episode 0 has 5 steps, episode 1 has 3: with max_seq_len 4 that is sequences
    # [0:4] and [4] of episode 0 and [0:3] of episode 1, three per pass, in order (no shuffle).
    make_hand_dataset("test/seq-v0", [5, 3])
    learner = BCLearner(model_config=recurrent_config(4, lstm_use_prev_action=True, lstm_use_prev_reward=True))
    data = OfflineDataModule("test/seq-v0", batch_size=8, updates_per_epoch=2, shuffle=False, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    assert data.sequences_per_minibatch == 2  # batch_size 8 // max_seq_len 4
    first, second = record.minibatches
    # obs t of episode e is [e, t]; its action t % 3 and reward t + 100 e (zeros in the padding).
    np.testing.assert_array_equal(
        first[Columns.OBS].numpy(),
        [[[0, 0], [0, 1], [0, 2], [0, 3]], [[0, 4], [0, 0], [0, 0], [0, 0]]],
    )
    assert first[Columns.LOSS_MASK].tolist() == [[True] * 4, [True, False, False, False]]
    assert first[Columns.ACTIONS].tolist() == [[0, 1, 2, 0], [1, 0, 0, 0]]
    # The previous step's action and reward, across the cut inside episode 0 (step 4 follows step 3).
    assert first[Columns.PREV_ACTIONS].tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]
    assert first[Columns.PREV_REWARDS].tolist() == [[0, 0, 1, 2], [3, 0, 0, 0]]
    # The second minibatch: episode 1 (zeros before its first step), then pass 2 starts again.
    np.testing.assert_array_equal(
        second[Columns.OBS].numpy(),
        [[[1, 0], [1, 1], [1, 2], [0, 0]], [[0, 0], [0, 1], [0, 2], [0, 3]]],
    )
    assert second[Columns.LOSS_MASK].tolist() == [[True, True, True, False], [True] * 4]
    assert second[Columns.PREV_ACTIONS].tolist() == [[0, 0, 1, 0], [0, 0, 1, 2]]
    assert second[Columns.PREV_REWARDS].tolist() == [[0, 100, 101, 0], [0, 0, 1, 2]]
    for minibatch in record.minibatches:
        assert set(minibatch[Columns.STATE_IN]) == {"pi_h", "pi_c"}
        for state in minibatch[Columns.STATE_IN].values():
            assert state.shape == (2, 4) and not state.any()  # the zero start state of every sequence
    # Timesteps and the checkpoint state count real steps (4 + 1, then 3 + 4); the position counts sequences.
    assert record.timesteps == [5, 12]
    assert data.state_dict()[NUM_ENV_STEPS_SAMPLED_LIFETIME] == 12
    assert data.state_dict()["sequences_drawn"] == 4


def test_sequences_drawn_with_replacement_repeat_within_a_pass_and_keep_their_timesteps(tmp_path):
    # 12 episodes of 4 steps: 12 one-sequence passes; 6 minibatches of 2 sequences draw one pass's worth.
    make_hand_dataset("test/seq-replacement-v0", [4] * 12)
    learner = BCLearner(model_config=recurrent_config(4))
    data = OfflineDataModule(
        "test/seq-replacement-v0", batch_size=8, updates_per_epoch=6, seed=0, sample_with_replacement=True
    )
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    episodes = [int(sequence[0, 0]) for minibatch in record.minibatches for sequence in minibatch[Columns.OBS]]
    assert len(episodes) == 12 and len(set(episodes)) < 12  # some episode drawn twice in the pass
    for minibatch in record.minibatches:  # whole sequences, from their first step
        assert minibatch[Columns.OBS][:, :, 1].tolist() == [[0, 1, 2, 3]] * 2
    assert record.timesteps == [8 * (i + 1) for i in range(6)]


def test_a_learner_names_its_stateful_modules_max_seq_len_in_its_requirements():
    recurrent = BCLearner(RLModuleSpec(BCModule, OBS, ACTIONS, recurrent_config(7)))
    recurrent.build()
    assert recurrent.data_requirements().max_seq_lens == {MODULE_ID: 7}
    feed_forward = BCLearner(RLModuleSpec(BCModule, OBS, ACTIONS, {"fcnet_hiddens": [8]}))
    feed_forward.build()
    assert feed_forward.data_requirements().max_seq_lens == {}


def test_recurrent_bc_fits_a_tiny_dataset_end_to_end_and_its_loss_falls(tmp_path):
    # Whole episodes per sequence (5 steps, max_seq_len 5): the cue is always in the sequence.
    make_cue_dataset("test/cue-v0", num_episodes=24, steps=5)
    torch.manual_seed(0)
    learner = BCLearner(model_config=recurrent_config(5, lstm_cell_size=16), lr=3e-2)
    data = OfflineDataModule("test/cue-v0", batch_size=40, updates_per_epoch=60, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    assert learner.module[MODULE_ID].is_stateful()
    assert all(minibatch[Columns.OBS].shape == (8, 5, 2) for minibatch in record.minibatches)
    assert np.all(np.isfinite(record.losses))
    # Below what a policy without memory can reach (chance, log 3, on 4 of every 5 steps).
    assert np.mean(record.losses[-5:]) < 0.5 * 0.8 * np.log(3) < np.mean(record.losses[:5])


def test_padded_steps_get_exactly_zero_gradient():
    learner = BCLearner(RLModuleSpec(BCModule, OBS, ACTIONS, recurrent_config(3)))
    learner.build()
    module = learner.module[MODULE_ID]
    torch.manual_seed(0)
    batch = {
        Columns.OBS: torch.randn(2, 3, 2),
        Columns.ACTIONS: torch.randint(0, 3, (2, 3)),
        Columns.LOSS_MASK: torch.tensor([[True, True, True], [True, False, False]]),
        Columns.STATE_IN: batched_initial_state(module, 2),
    }

    def gradients(batch: dict[str, Any]) -> list[torch.Tensor]:
        module.zero_grad()
        loss = learner.compute_loss_for_module(
            module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=module.forward_train(batch)
        )
        loss.backward()
        return [param.grad.clone() for param in module.parameters()]

    before = gradients(batch)
    padding = ~batch[Columns.LOSS_MASK]
    changed = dict(batch)
    changed[Columns.OBS] = torch.where(padding[..., None], torch.full_like(batch[Columns.OBS], 1e3), batch[Columns.OBS])
    changed[Columns.ACTIONS] = torch.where(padding, (batch[Columns.ACTIONS] + 1) % 3, batch[Columns.ACTIONS])
    for ours, theirs in zip(before, gradients(changed)):
        assert torch.equal(ours, theirs)


def _fit(
    root: Path, *, max_epochs: int, ckpt_path: str | None = None, every: int | None = None, in_memory: bool = True
) -> tuple:
    record = RecordMinibatches()
    callbacks: list[Callback] = [record]
    if every is not None:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=every, save_top_k=-1))
    torch.manual_seed(0)
    learner = BCLearner(model_config=recurrent_config(3), lr=[[0, 3e-2], [40, 1e-3]])
    # 2 sequences per minibatch of the 2 + 2 + 1 + 2 = 7 per pass: items straddle passes.
    data = OfflineDataModule(
        "test/resume-seq-v0", batch_size=6, updates_per_epoch=3, seed=3, in_memory=in_memory, stream_window_rows=6
    )
    trainer = offline_trainer(
        root, max_epochs=max_epochs, callbacks=callbacks, enable_checkpointing=every is not None, limit_val_batches=0
    )
    trainer.fit(learner, datamodule=data, ckpt_path=ckpt_path)
    return learner, record, data


def test_a_resumed_fit_continues_the_sequence_stream_and_ends_with_identical_weights(tmp_path):
    make_hand_dataset("test/resume-seq-v0", [4, 5, 3, 6])
    whole, whole_items, whole_data = _fit(tmp_path / "whole", max_epochs=3)
    _fit(tmp_path / "first", max_epochs=3, every=4)
    checkpoint = min((tmp_path / "first" / "ckpt").glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns)
    resumed, resumed_items, resumed_data = _fit(tmp_path / "resumed", max_epochs=3, ckpt_path=str(checkpoint))

    assert resumed_items.timesteps == whole_items.timesteps[4:]
    assert len(resumed_items.minibatches) == len(whole_items.minibatches) - 4
    for ours, theirs in zip(resumed_items.minibatches, whole_items.minibatches[4:]):
        for column in (Columns.OBS, Columns.LOSS_MASK, Columns.PREV_ACTIONS):
            assert torch.equal(ours[column], theirs[column])
    assert resumed_data.state_dict() == whole_data.state_dict()
    for name, value in whole.module[MODULE_ID].state_dict().items():
        assert torch.equal(value, resumed.module[MODULE_ID].state_dict()[name]), name


def test_recurrent_marwil_trains_on_sequences_with_its_value_core(tmp_path):
    make_cue_dataset("test/marwil-cue-v0", num_episodes=8, steps=6)  # sequences of 4 and 2 steps
    torch.manual_seed(0)
    learner = MARWILLearner(model_config=recurrent_config(4), lr=1e-2, moving_average_sqd_adv_norm_update_rate=0.1)
    data = OfflineDataModule("test/marwil-cue-v0", batch_size=12, updates_per_epoch=6, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    module = learner.module[MODULE_ID]
    assert set(module.get_initial_state()) == {"pi_h", "pi_c", "vf_h", "vf_c"}
    minibatch = record.minibatches[0]
    assert set(minibatch[Columns.STATE_IN]) == {"pi_h", "pi_c", "vf_h", "vf_c"}
    assert minibatch[Columns.VALUE_TARGETS].shape == (3, 4)
    assert np.all(np.isfinite(record.losses))
    with torch.no_grad():
        values = module.compute_values(minibatch)
    assert values.shape == (3, 4)
    # The moving average moved from its start (100) by the squared advantages of real steps.
    assert float(module.moving_avg_sqd_adv_norm) < 100.0


def test_a_sequences_bootstrap_chunk_is_its_episodes_last_chunk_ending_in_the_final_observation(tmp_path):
    # Episodes of 5 (terminates), 3 (truncated) and 4 (terminates) steps, max_seq_len 4: sequences
    # [0:4] and [4] of episode 0, [0:3] of episode 1, [0:4] of episode 2, in one minibatch.
    make_hand_dataset("test/seq-bootstrap-v0", [5, 3, 4])
    config = recurrent_config(4, lstm_use_prev_action=True, lstm_use_prev_reward=True)
    learner = MARWILLearner(model_config=config, gamma=0.5)
    data = OfflineDataModule("test/seq-bootstrap-v0", batch_size=16, updates_per_epoch=1, shuffle=False, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    (minibatch,) = record.minibatches
    # Observation t of episode e is [e, t], the final one t = T; its action t % 3, reward t + 100 e.
    # Episode 0 (T = 5): steps 4 and 5. Episode 1 (T = 3 < 4): the whole episode and its final
    # observation. Episode 2 (T = 4, a multiple of 4): the final observation alone.
    chunk_0 = [[0, 4], [0, 5], [0, 0], [0, 0]]
    expected = [chunk_0, chunk_0, [[1, 0], [1, 1], [1, 2], [1, 3]], [[2, 4], [0, 0], [0, 0], [0, 0]]]
    np.testing.assert_array_equal(minibatch[Columns.BOOTSTRAP_OBS].numpy(), expected)
    assert minibatch[Columns.BOOTSTRAP_STEPS].tolist() == [2, 2, 4, 1]
    # Each chunk step's previous action and reward: across the cut at step 4, zeros before step 0.
    assert minibatch[Columns.BOOTSTRAP_PREV_ACTIONS].tolist() == [[0, 1, 0, 0]] * 2 + [[0, 0, 1, 2], [0, 0, 0, 0]]
    prev_rewards = [[3, 4, 0, 0]] * 2 + [[0, 100, 101, 102], [203, 0, 0, 0]]
    assert minibatch[Columns.BOOTSTRAP_PREV_REWARDS].tolist() == prev_rewards
    # Only the truncated episode's steps are completed: by gamma^(T - t), none on padding.
    assert minibatch[Columns.BOOTSTRAP_DISCOUNT].tolist() == [[0] * 4, [0] * 4, [0.125, 0.25, 0.5, 0], [0] * 4]


def test_recurrent_marwil_values_the_final_observation_as_the_episode_with_one_more_step(tmp_path):
    # RLlib's MARWIL adds one time step (the final observation) to each episode and values the
    # episode cut every max_seq_len steps from zero states; the targets here must equal that.
    lengths = [5, 7, 3, 8]  # episodes 1 (7 steps) and 3 (8, a multiple of max_seq_len) are truncated
    make_hand_dataset("test/seq-final-value-v0", lengths)
    config = recurrent_config(4, lstm_use_prev_action=True, lstm_use_prev_reward=True)
    torch.manual_seed(0)
    learner = MARWILLearner(model_config=config, gamma=0.9, lr=0.0)
    data = OfflineDataModule("test/seq-final-value-v0", batch_size=32, updates_per_epoch=1, shuffle=False, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)
    (minibatch,) = record.minibatches
    module = learner.module[MODULE_ID]

    with torch.no_grad():
        targets = learner._value_targets(module, minibatch)
    for episode, steps in enumerate(lengths):
        # The episode with its final observation as one more step, cut every 4 steps from zero states.
        layout = sequence_layout(torch.tensor([steps + 1]), 4)
        step_index = torch.arange(steps + 1, dtype=torch.float32)
        actions = torch.arange(steps) % 3
        rewards = torch.arange(steps, dtype=torch.float32) + 100 * episode
        columns = {
            Columns.OBS: torch.stack([torch.full((steps + 1,), float(episode)), step_index], dim=1),
            Columns.PREV_ACTIONS: torch.cat([torch.zeros(1, dtype=torch.long), actions]),
            Columns.PREV_REWARDS: torch.cat([torch.zeros(1), rewards]),
        }
        sequences = {name: to_sequences(values, layout) for name, values in columns.items()}
        sequences[Columns.STATE_IN] = batched_initial_state(module, layout.num_sequences)
        with torch.no_grad():
            final_value = from_sequences(module.compute_values(sequences), layout)[-1]
        returns = torch.tensor([sum(0.9**k * float(r) for k, r in enumerate(rewards[t:])) for t in range(steps)])
        discount = 0.9 ** torch.arange(steps, 0, -1, dtype=torch.float32) if episode % 2 else torch.zeros(steps)
        first_sequence = sum((length + 3) // 4 for length in lengths[:episode])
        ours = targets[first_sequence : first_sequence + (steps + 3) // 4].reshape(-1)[:steps]
        torch.testing.assert_close(ours, returns + discount * final_value, rtol=1e-5, atol=1e-3)


@pytest.mark.slow
def test_recurrent_marwil_learns_the_value_of_a_truncated_task_beyond_its_recorded_steps(tmp_path):
    # Reward 1 at every step of episodes truncated after 6 steps: with gamma 0.5 every state is
    # worth 1 / (1 - 0.5) = 2. The return-to-go alone would teach 1 at the last step (1.97 at
    # the first); completed by the value of the final observation, the targets reach 2 everywhere.
    episodes = [hand_episode(i, 6, terminated=False, rewards=[1.0] * 6) for i in range(4)]
    minari.create_dataset_from_buffers("test/seq-truncated-v0", episodes, observation_space=OBS, action_space=ACTIONS)
    torch.manual_seed(0)
    learner = MARWILLearner(model_config=recurrent_config(4), gamma=0.5, lr=1e-2)
    data = OfflineDataModule("test/seq-truncated-v0", batch_size=32, updates_per_epoch=400, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(learner, datamodule=data)

    minibatch = record.minibatches[-1]
    with torch.no_grad():
        values = learner.module[MODULE_ID].compute_values(minibatch)
    real = values[minibatch[Columns.LOSS_MASK]]
    assert torch.allclose(real, torch.full_like(real, 2.0), atol=0.1), real


def test_a_recurrent_marwil_batch_without_its_bootstrap_chunks_is_refused_naming_them():
    learner = MARWILLearner(RLModuleSpec(MARWILModule, OBS, ACTIONS, recurrent_config(3)))
    learner.build()
    module = learner.module[MODULE_ID]
    batch = {
        Columns.OBS: torch.zeros(1, 3, 2),
        Columns.ACTIONS: torch.zeros(1, 3, dtype=torch.long),
        Columns.VALUE_TARGETS: torch.zeros(1, 3),
        Columns.BOOTSTRAP_OBS: torch.zeros(1, 3, 2),
        Columns.BOOTSTRAP_DISCOUNT: torch.zeros(1, 3),
        Columns.LOSS_MASK: torch.ones(1, 3, dtype=torch.bool),
        Columns.STATE_IN: batched_initial_state(module, 1),
    }
    with pytest.raises(ValueError, match=r"the batch lacks \['bootstrap_steps', 'bootstrap_prev_actions', "):
        learner.update_from_batch({MODULE_ID: batch})


def test_the_moving_average_takes_the_squared_advantages_of_real_steps_only():
    learner = MARWILLearner(
        RLModuleSpec(MARWILModule, OBS, ACTIONS, recurrent_config(3)), moving_average_sqd_adv_norm_update_rate=1.0
    )
    learner.build()
    module = learner.module[MODULE_ID]
    mask = torch.tensor([[True, True, False]])
    batch = {
        Columns.OBS: torch.zeros(1, 3, 2),
        Columns.ACTIONS: torch.zeros(1, 3, dtype=torch.long),
        Columns.VALUE_TARGETS: torch.tensor([[1.0, 2.0, 1e6]]),  # the padded step's target must not count
        Columns.LOSS_MASK: mask,
        Columns.STATE_IN: batched_initial_state(module, 1),
        **terminated_chunks(1, 3),
    }
    fwd_out = module.forward_train(batch)
    learner.metrics.reduce()  # nothing logged yet; the loss logs into a fresh window
    learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )
    advantages = batch[Columns.VALUE_TARGETS] - fwd_out[Columns.VF_PREDS].detach()
    expected = advantages[mask].pow(2).mean()
    assert torch.allclose(module.moving_avg_sqd_adv_norm, expected)


def sequence_stream_of(dataset_id: str, **kwargs: Any) -> SequenceStream:
    """A sequence stream of every dataset column (discounted with gamma 0.5), sequences of 4 steps."""
    dataset = open_dataset(dataset_id)
    screening = screen_episodes(dataset, dataset_id, episode_lengths(dataset, dataset_id), on_nonfinite="raise")
    options = dict(seed=1, shuffle=True, replacement=False, max_seq_len=4, window_rows=None, gamma=0.5) | kwargs
    return SequenceStream(dataset, dataset_id, screening.episodes, columns=list(DATASET_COLUMNS), **options)


def by_first_step(sequences: dict[str, torch.Tensor]) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """Each sequence of a hand-made dataset under its first step's ``(episode, step)``."""
    keys = [(int(e), int(t)) for e, t in sequences[Columns.OBS][:, 0].tolist()]
    return {key: {column: values[i] for column, values in sequences.items()} for i, key in enumerate(keys)}


def test_a_streamed_dataset_yields_every_sequence_once_per_pass_a_window_of_episodes_at_a_time():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]  # 27 sequences of up to 4 steps
    make_hand_dataset("test/stream-seq-v0", lengths)
    streamed = sequence_stream_of("test/stream-seq-v0", window_rows=12)  # windows of about 3 sequences
    in_memory = sequence_stream_of("test/stream-seq-v0")
    count = in_memory.num_sequences
    assert streamed.num_sequences == count == 27

    resident = by_first_step(in_memory.sequences(0, count))
    passes = []
    for p in range(2):
        pieces = [streamed.sequences(s, min(s + 2, (p + 1) * count)) for s in range(p * count, (p + 1) * count, 2)]
        drawn = {column: torch.cat([piece[column] for piece in pieces]) for column in pieces[0]}
        passes.append([(int(e), int(t)) for e, t in drawn[Columns.OBS][:, 0].tolist()])
        # Every sequence once, each the same as held in memory: its steps, previous steps, targets and chunk.
        assert sorted(passes[-1]) == sorted(resident)
        for key, sequence in by_first_step(drawn).items():
            for column, values in sequence.items():
                assert torch.equal(values, resident[key][column]), (key, column)
        assert streamed.steps(p * count, (p + 1) * count) == sum(lengths)
    assert passes[0] != passes[1]
    # Whole episodes per window: many windows read, never more than two held.
    assert streamed.num_windows_read >= 5 and len(streamed._window_rows) <= 2
    assert passes[0] != [(int(e), int(t)) for e, t in in_memory.sequences(0, count)[Columns.OBS][:, 0].tolist()]


def test_a_streamed_recurrent_fit_resumes_with_the_very_sequences_and_weights(tmp_path):
    make_hand_dataset("test/resume-seq-v0", [4, 5, 3, 6])
    whole, whole_items, _ = _fit(tmp_path / "whole", max_epochs=3, in_memory=False)
    _fit(tmp_path / "first", max_epochs=3, every=4, in_memory=False)
    checkpoint = min((tmp_path / "first" / "ckpt").glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns)
    resumed, resumed_items, _ = _fit(tmp_path / "resumed", max_epochs=3, ckpt_path=str(checkpoint), in_memory=False)

    assert resumed_items.timesteps == whole_items.timesteps[4:]
    for ours, theirs in zip(resumed_items.minibatches, whole_items.minibatches[4:], strict=True):
        assert torch.equal(ours[Columns.OBS], theirs[Columns.OBS])
    for name, value in whole.module[MODULE_ID].state_dict().items():
        assert torch.equal(value, resumed.module[MODULE_ID].state_dict()[name]), name


def test_feed_forward_modules_keep_their_layers_and_train_on_rows(tmp_path):
    torch.manual_seed(0)
    plain = MARWILModule(OBS, ACTIONS, {"fcnet_hiddens": [8]})
    assert not plain.is_stateful() and plain.get_initial_state() == {}
    assert not any("core" in name for name in plain.state_dict())
    make_hand_dataset("test/rows-v0", [4, 4])
    data = OfflineDataModule("test/rows-v0", batch_size=4, updates_per_epoch=1, seed=0)
    record = RecordMinibatches()
    offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0).fit(
        BCLearner(model_config={"fcnet_hiddens": [8]}), datamodule=data
    )
    assert sorted(record.minibatches[0]) == [Columns.ACTIONS, Columns.OBS]
    assert data.state_dict()["sequences_drawn"] == 0


def test_modules_without_a_recurrent_version_name_those_that_have_one():
    with pytest.raises(ValueError, match="PPOModule, BCModule and MARWILModule"):
        DQNModule(OBS, ACTIONS, {"use_lstm": True})


def _sequence_fit_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    import os

    from lightning.pytorch import seed_everything

    os.environ["MINARI_DATASETS_PATH"] = os.path.join(root, "minari")
    seed_everything(0)
    record = RecordMinibatches()
    learner = BCLearner(model_config=recurrent_config(3), lr=1e-2)
    data = OfflineDataModule("test/ranks-seq-v0", batch_size=3, updates_per_epoch=4)  # one sequence per minibatch
    trainer = offline_trainer(Path(root), strategy="ddp", devices=world_size, callbacks=[record], limit_val_batches=0)
    trainer.fit(learner, datamodule=data)
    return {
        "obs": [minibatch[Columns.OBS].numpy().copy() for minibatch in record.minibatches],
        "timesteps": record.timesteps,
        "weights": {k: v.detach().numpy().copy() for k, v in learner.module[MODULE_ID].state_dict().items()},
    }


def test_two_ranks_train_on_disjoint_sequences_that_together_cover_a_pass(tmp_path):
    make_hand_dataset("test/ranks-seq-v0", [5, 7, 6, 6])  # 2 + 3 + 2 + 2 = 9 sequences of 3 steps: 8 drawn
    rank0, rank1 = run_on_ranks(_sequence_fit_on_rank, str(tmp_path), world_size=2, timeout=240)

    firsts = [tuple(obs[0, 0].tolist()) for rank in (rank0, rank1) for obs in rank["obs"]]
    assert len(firsts) == len(set(firsts)) == 8  # every sequence's first step once: disjoint sequences
    assert rank0["timesteps"] == rank1["timesteps"]  # both ranks count the real steps of all ranks' sequences
    for name, value in rank0["weights"].items():
        np.testing.assert_array_equal(value, rank1["weights"][name], err_msg=name)


def test_a_recurrent_bc_fit_evaluates_in_the_datasets_env_with_its_state(tmp_path):
    from test_offline_datamodule import make_cartpole_dataset

    make_cartpole_dataset("test/cartpole-expert-v0", 4)
    learner = BCLearner(model_config=recurrent_config(8))
    data = OfflineDataModule(
        "test/cartpole-expert-v0", batch_size=64, updates_per_epoch=20, seed=0,
        evaluation_num_episodes=2, evaluation_num_envs=2,
    )  # fmt: skip
    trainer = offline_trainer(tmp_path)
    trainer.fit(learner, datamodule=data)
    # Greedy episodes in CartPole-v1 played by the recurrent module (through the env runner's Acting).
    assert trainer.callback_metrics["eval/num_episodes"] == 2
    assert trainer.callback_metrics["eval/episode_return_mean"] >= 8
