"""An off-policy fit under ``Trainer(strategy="ddp", devices=2)`` on CPU: two real ranks.

Each rank samples its own envs into its own (prioritized) replay buffer and takes its
gradient steps on its own minibatches; DDP averages the gradients, so the online and target
networks stay identical, and the ranks start learning on the same item.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ranks import run_on_ranks

TRAIN_FREQ = 4  # per rank
LEARNING_STARTS = 16  # over both ranks: 8 steps per rank, the second item


def _off_policy_fit_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Callback, Trainer, seed_everything
    from test_off_policy import TinyQLearner, tiny_spec

    from lightning_rl.core.columns import Columns
    from lightning_rl.data import OffPolicyDataModule

    class RecordItems(Callback):
        def __init__(self) -> None:
            self.replay_given: list[bool] = []
            self.timesteps: list[float] = []

        def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.replay_given.append(batch.data.replay is not None)
            self.timesteps.append(batch.timesteps["num_env_steps_sampled_lifetime"])

    seed_everything(0)
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8, target_network_update_freq=2, tau=0.5)
    data = OffPolicyDataModule(
        "CartPole-v1", seed=0, replay_buffer_capacity=100, train_freq=TRAIN_FREQ, learning_starts=LEARNING_STARTS,
        prioritized_replay=True, rollouts_per_epoch=6, evaluation_num_episodes=2,
    )  # fmt: skip
    record = RecordItems()
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=root, callbacks=[record],
    )  # fmt: skip
    trainer.fit(learner, datamodule=data)
    module = learner.module["default_policy"]
    return {
        "weights": {name: value.detach().numpy().copy() for name, value in module.state_dict().items()},
        "replay_given": record.replay_given,
        "timesteps": record.timesteps,
        "weights_seq_no": learner.weights_seq_no,
        "buffer_obs": data.replay_buffer.sample(16)[Columns.OBS],
        "buffer_len": len(data.replay_buffer),
    }


def test_two_rank_off_policy_fit_replays_apart_and_keeps_online_and_target_networks_identical(tmp_path):
    rank0, rank1 = run_on_ranks(_off_policy_fit_on_rank, str(tmp_path), world_size=2, timeout=240)

    for name, value in rank0["weights"].items():  # q.* and target_q.*
        if "running_" in name or "num_batches_tracked" in name:
            # Buffers are not averaged: each rank's BatchNorm statistics follow its own data
            # (the update runs inside training_step, not through DDP's forward, which would
            # broadcast rank 0's buffers).
            continue
        np.testing.assert_array_equal(value, rank1["weights"][name], err_msg=name)
    assert any(name.startswith("target_q.") for name in rank0["weights"])
    # Both ranks learn from the second item on: 8 steps in each buffer, 16 over both.
    assert rank0["replay_given"] == rank1["replay_given"] == [False] + [True] * 5
    assert rank0["timesteps"] == [8, 16, 24, 32, 40, 48]
    assert rank0["weights_seq_no"] == rank1["weights_seq_no"] == 5
    assert rank0["buffer_len"] == rank1["buffer_len"] == 6 * TRAIN_FREQ
    # Each rank replays its own envs' transitions.
    assert not np.array_equal(rank0["buffer_obs"], rank1["buffer_obs"])
