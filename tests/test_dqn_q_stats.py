"""``benchmarks/dqn_q_stats.py``: statistics checked by hand, replay reads that leave the run's generators alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.env.episode import SingleAgentEpisode


@pytest.fixture
def q_stats(import_benchmark):
    return import_benchmark("dqn_q_stats")


def _linear(*weights: float) -> nn.Linear:
    """Q(s, a) = weights[a] * s for 1-d observations."""
    layer = nn.Linear(1, len(weights), bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weights)[:, None])
    return layer


def test_records_are_due_once_per_period_and_their_statistics_match_a_hand_computation(q_stats):
    probe = np.array([[1.0], [2.0]], dtype=np.float32)
    stats = q_stats.QStatistics(probe, gamma=0.5, every=10, offset=2, replay_rows=3, seed=0)
    # Every drawn row is the same transition: s=1, a=0, r=1, s'=3, not terminated.
    row = q_stats.Transitions(torch.ones(3, 1), torch.zeros(3, dtype=torch.long), torch.ones(3), torch.full((3, 1), 3.0),
                              torch.zeros(3))  # fmt: skip
    online, target = _linear(1.0, 2.0), _linear(1.0, 1.0)

    assert not stats.due(1) and stats.due(2)
    first = stats.record(2, online, target, lambda positions: row, replay_size=5)
    # Greedy action 1 on both states: V = 2s -> 2, 4. |Q - Q_target| = [0, s] -> (0 + 1 + 0 + 2) / 4.
    assert (first["probe_v_mean"], first["probe_v_max"], first["probe_target_gap"]) == (3.0, 4.0, 0.75)
    assert first["probe_action_share"] == [0.0, 1.0] and np.isnan(first["probe_greedy_changed"])
    # Q(1, 0) = 1; y = 1 + 0.5 * max(3, 3) = 2.5; s' = 3: |Q - Q_target| = [0, 3].
    assert (first["replay_q_mean"], first["replay_target_mean"], first["replay_td_abs_mean"]) == (1.0, 2.5, 1.5)
    assert (first["replay_target_gap"], first["replay_size"]) == (1.5, 5)
    assert first["param_norm"] == pytest.approx(5**0.5)

    assert not stats.due(11) and stats.due(13)
    second = stats.record(13, _linear(3.0, 2.0), target, lambda positions: row, replay_size=5)
    assert second["probe_greedy_changed"] == 1.0  # action 0 is now greedy everywhere
    assert not stats.due(21) and stats.due(22)  # 13 was late: the next is still due at 22
    assert [entry["env_steps"] for entry in stats.records] == [2, 13]


def test_bad_settings_are_refused_by_name(q_stats):
    probe = np.zeros((1, 1), dtype=np.float32)
    for settings, match in (({"every": 0}, "every"), ({"offset": 10}, "offset"), ({"replay_rows": 0}, "replay_rows")):
        kwargs = {"gamma": 0.9, "every": 10, "offset": 0, "replay_rows": 1, "seed": 0, **settings}
        with pytest.raises(ValueError, match=match):
            q_stats.QStatistics(probe, **kwargs)


def test_reading_our_replay_buffer_returns_its_rows_and_leaves_its_sampling_as_it_was(q_stats):
    def filled() -> ReplayBuffer:
        buffer = ReplayBuffer(8, seed=3)
        buffer.add_episodes([SingleAgentEpisode(
            observations=np.arange(6, dtype=np.float32)[:, None], actions=np.array([0, 1, 2, 0, 1]),
            rewards=np.array([1, 2, 3, 4, 5], dtype=np.float32), terminated=True,
        )])  # fmt: skip
        return buffer

    read, untouched = filled(), filled()
    rows = q_stats.ours_replay(read)(np.array([1, 4]))
    assert rows.obs[:, 0].tolist() == [1.0, 4.0] and rows.next_obs[:, 0].tolist() == [2.0, 5.0]
    assert rows.actions.tolist() == [1, 1] and rows.rewards.tolist() == [2.0, 5.0]
    assert rows.terminated.tolist() == [0.0, 1.0]
    # The training run's next minibatch is the one it would have drawn without the read.
    np.testing.assert_array_equal(read.sample(16)["batch_indexes"], untouched.sample(16)["batch_indexes"])


def test_sb3s_replay_rows_bootstrap_through_a_time_limit_as_sb3_does(q_stats):
    buffers = pytest.importorskip("stable_baselines3.common.buffers")
    import gymnasium as gym

    buffer = buffers.ReplayBuffer(4, gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(3), device="cpu")
    for step, (done, truncated) in enumerate([(False, False), (True, False), (True, True)]):
        buffer.add(np.array([[step]]), np.array([[step + 1]]), np.array([[step % 3]]), np.array([step * 1.0]),
                   np.array([done]), [{"TimeLimit.truncated": truncated}])  # fmt: skip
    rows = q_stats.sb3_replay(buffer)(np.array([0, 1, 2]))
    assert rows.obs[:, 0].tolist() == [0.0, 1.0, 2.0] and rows.next_obs[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert rows.actions.tolist() == [0, 1, 2] and rows.rewards.tolist() == [0.0, 1.0, 2.0]
    assert rows.terminated.tolist() == [0.0, 1.0, 0.0]  # a truncated episode still bootstraps


def test_probe_states_depend_on_the_seed_alone(q_stats):
    pytest.importorskip("Box2D")
    first = q_stats.probe_states("LunarLander-v3", 300, seed=4)
    assert first.shape == (300, 8) and first.dtype == np.float32
    np.testing.assert_array_equal(first, q_stats.probe_states("LunarLander-v3", 300, seed=4))
    assert not np.array_equal(first, q_stats.probe_states("LunarLander-v3", 300, seed=5))


@pytest.mark.slow  # each library trains briefly
def test_a_tiny_run_of_each_library_records_the_same_schedule_on_the_same_probe_states(q_stats, tmp_path: Path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("matplotlib")
    pytest.importorskip("Box2D")
    for library in ("ours", "sb3"):  # in this process: the script's run() is what its command line calls
        q_stats.run(q_stats.parse_args(
            ["run", "--library", library, "--seed", "1", "--max-env-steps", "240", "--every", "100", "--offset", "20",
             "--probe-states", "50", "--replay-rows", "30", "--out", str(tmp_path)]
        ))  # fmt: skip
    records = [json.loads((tmp_path / f"dqn_lunarlander-{lib}-seed1.json").read_text()) for lib in ("ours", "sb3")]
    for record in records:
        assert record["status"] == "done" and [point["env_steps"] for point in record["evals"]] == [240]
        assert [entry["env_steps"] for entry in record["q_stats"]] == [20, 120, 220]
    assert records[0]["probe_checksum"] == records[1]["probe_checksum"]

    q_stats.plot(q_stats.parse_args(["plot", "--out", str(tmp_path)]))
    assert (tmp_path / "dqn_q_stats.png").stat().st_size > 10_000
