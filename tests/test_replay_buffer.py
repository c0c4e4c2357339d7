"""ReplayBuffer and PrioritizedReplayBuffer: n-step returns, chunk links, the ring, priorities, state.

Observations are one number per row, unique across a test, so every sampled row can be
checked against a table computed by hand: ``{obs: (n-step return, m, new_obs, terminated,
truncated)}``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from lightning_rl.core.columns import Columns
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer
from lightning_rl.data.priority_tree import PriorityTree as _PriorityTree
from lightning_rl.data.replay_n_step import BATCH_INDEXES, N_STEP, WEIGHTS
from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.env.episode import SingleAgentEpisode

Row = tuple[float, int, float, bool, bool]  # (return, m, new_obs, terminated, truncated)


def episode(
    obs: list[float],
    rewards: list[float],
    *,
    id_: str | None = None,
    terminated: bool = False,
    truncated: bool = False,
    t_started: int = 0,
) -> SingleAgentEpisode:
    """A numpy episode with observation ``[o]`` per entry of ``obs`` and action ``10 * o``."""
    observations = np.asarray(obs, dtype=np.float32)[:, None]
    actions = (10 * np.asarray(obs[:-1])).astype(np.int64)
    return SingleAgentEpisode(
        id_,
        observations=observations,
        actions=actions,
        rewards=np.asarray(rewards, dtype=np.float32),
        terminated=terminated,
        truncated=truncated,
        t_started=t_started,
    )


def assert_rows(buffer: ReplayBuffer, expected: dict[float, Row], *, n_step: int, gamma: float) -> None:
    """Sample enough rows to see every stored one; check each against the hand table."""
    batch = buffer.sample(50 * len(expected), n_step=n_step, gamma=gamma)
    seen = set()
    for i, key in enumerate(batch[Columns.OBS][:, 0].tolist()):
        assert key in expected, f"sampled row with obs {key}, which should not be stored"
        ret, m, new_obs, terminated, truncated = expected[key]
        assert batch[Columns.REWARDS][i] == pytest.approx(ret, rel=1e-6), f"return of row {key}"
        assert batch[N_STEP][i] == m, f"n_step of row {key}"
        assert batch[Columns.NEXT_OBS][i, 0] == new_obs, f"new_obs of row {key}"
        assert bool(batch[Columns.TERMINATEDS][i]) is terminated, f"terminateds of row {key}"
        assert bool(batch[Columns.TRUNCATEDS][i]) is truncated, f"truncateds of row {key}"
        assert batch[Columns.ACTIONS][i] == 10 * key
        seen.add(key)
    assert seen == set(expected)
    assert batch[Columns.REWARDS].dtype == np.float32
    assert batch[Columns.TERMINATEDS].dtype == np.bool_ and batch[Columns.TRUNCATEDS].dtype == np.bool_
    assert batch[N_STEP].dtype == np.int64 and batch[BATCH_INDEXES].dtype == np.int64
    assert batch[WEIGHTS].dtype == np.float32


# ----------------------------------------------------------------------------------------
# n-step returns
# ----------------------------------------------------------------------------------------


def test_n_step_return_stops_at_termination_without_bootstrap() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add_episodes([episode([0, 1, 2, 3, 4], [1, 2, 4, 8], terminated=True)])
    g = 0.5
    assert_rows(
        buffer,
        {
            0: (1 + g * 2 + g**2 * 4, 3, 3, False, False),
            1: (2 + g * 4 + g**2 * 8, 3, 4, True, False),
            2: (4 + g * 8, 2, 4, True, False),
            3: (8, 1, 4, True, False),
        },
        n_step=3,
        gamma=g,
    )


def test_n_step_return_stops_at_truncation_and_bootstraps_from_the_final_obs() -> None:
    buffer = ReplayBuffer(100, seed=0)
    # The final observation 99 is the truncated episode's true last one.
    buffer.add_episodes([episode([10, 11, 99], [1, 2], truncated=True)])
    g = 0.9
    assert_rows(
        buffer,
        {10: (1 + g * 2, 2, 99, False, True), 11: (2, 1, 99, False, True)},
        n_step=3,
        gamma=g,
    )


def test_n_step_return_of_a_running_chunk_stops_at_its_last_added_row() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add_episodes([episode([20, 21, 22], [1, 2], id_="A")])
    g = 0.5
    assert_rows(
        buffer,
        {20: (1 + g * 2, 2, 22, False, False), 21: (2, 1, 22, False, False)},
        n_step=3,
        gamma=g,
    )


def test_n_step_return_spans_the_boundary_to_a_later_chunk_of_the_same_episode() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add_episodes([episode([20, 21, 22], [1, 2], id_="A")])
    # Another episode in between, so the chunks are not adjacent rows.
    buffer.add_episodes([episode([30, 31], [100], terminated=True)])
    buffer.add_episodes([episode([22, 23, 24], [4, 8], id_="A", terminated=True, t_started=2)])
    g = 0.5
    assert_rows(
        buffer,
        {
            20: (1 + g * 2 + g**2 * 4, 3, 23, False, False),
            21: (2 + g * 4 + g**2 * 8, 3, 24, True, False),
            22: (4 + g * 8, 2, 24, True, False),
            23: (8, 1, 24, True, False),
            30: (100, 1, 31, True, False),
        },
        n_step=3,
        gamma=g,
    )
    assert buffer.state_dict()["pending"] == {}


def test_chunks_of_one_episode_in_one_call_are_linked() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add_episodes(
        [
            episode([0, 1], [1], id_="A"),
            episode([50, 51], [7], id_="B"),
            episode([1, 2, 3], [2, 4], id_="A", terminated=True, t_started=1),
        ]
    )
    g = 1.0
    assert_rows(
        buffer,
        {
            0: (1 + 2 + 4, 3, 3, True, False),
            1: (2 + 4, 2, 3, True, False),
            2: (4, 1, 3, True, False),
            50: (7, 1, 51, False, False),
        },
        n_step=4,
        gamma=g,
    )
    assert list(buffer.state_dict()["pending"]) == ["B"]


def test_zero_step_chunk_that_ends_the_episode_marks_the_previous_row_done() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add_episodes([episode([0, 1, 2], [1, 2], id_="A")])
    buffer.add_episodes([episode([2], [], id_="A", truncated=True, t_started=2)])
    assert len(buffer) == 2 and buffer.num_added_lifetime == 2
    assert_rows(
        buffer,
        {0: (1 + 0.5 * 2, 2, 2, False, True), 1: (2, 1, 2, False, True)},
        n_step=3,
        gamma=0.5,
    )
    assert buffer.state_dict()["pending"] == {}


def test_n_step_1_returns_the_one_step_transitions_exactly() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=6).astype(np.float32)
    buffer = ReplayBuffer(100, seed=1)
    buffer.add_episodes([episode([0, 1, 2, 3], rewards[:3].tolist(), terminated=True)])
    buffer.add_episodes([episode([10, 11, 12, 13], rewards[3:].tolist())])
    batch = buffer.sample(200, n_step=1, gamma=0.3)
    by_obs = {0: 0, 1: 1, 2: 2, 10: 3, 11: 4, 12: 5}
    for i, key in enumerate(batch[Columns.OBS][:, 0].tolist()):
        assert batch[Columns.REWARDS][i] == rewards[by_obs[key]]  # bit-exact, not approx
        assert batch[Columns.NEXT_OBS][i, 0] == key + 1
        assert batch[N_STEP][i] == 1
        assert bool(batch[Columns.TERMINATEDS][i]) is (key == 2)
        assert not batch[Columns.TRUNCATEDS][i]
    np.testing.assert_array_equal(batch[WEIGHTS], np.ones(200, np.float32))


def test_list_backed_episodes_are_stored_like_numpy_ones() -> None:
    built = SingleAgentEpisode("L")
    built.add_env_reset(np.array([0.0], np.float32))
    built.add_env_step(np.array([1.0], np.float32), np.int64(0), 3.0)
    built.add_env_step(np.array([2.0], np.float32), np.int64(10), 5.0, terminated=True)
    buffer = ReplayBuffer(10, seed=0)
    buffer.add_episodes([built])
    assert not built.is_numpy  # the buffer does not convert the caller's episode
    assert_rows(buffer, {0: (3 + 0.5 * 5, 2, 2, True, False), 1: (5, 1, 2, True, False)}, n_step=2, gamma=0.5)


def test_batch_indexes_are_absolute_row_indices() -> None:
    buffer = ReplayBuffer(4, seed=0)
    buffer.add_episodes([episode([0, 1, 2, 3, 4, 5, 6], [0] * 6, terminated=True)])
    batch = buffer.sample(100)
    # Row k of this single episode is the k-th transition ever added.
    np.testing.assert_array_equal(batch[BATCH_INDEXES], batch[Columns.OBS][:, 0].astype(np.int64))


# ----------------------------------------------------------------------------------------
# Ring
# ----------------------------------------------------------------------------------------


def test_ring_overwrite_keeps_the_newest_rows() -> None:
    buffer = ReplayBuffer(4, seed=0)
    buffer.add_episodes([episode([0, 1, 2], [1, 1], terminated=True)])
    buffer.add_episodes([episode([10, 11, 12, 13, 14], [1, 2, 4, 8])])
    assert len(buffer) == 4 and buffer.num_added_lifetime == 6
    g = 0.5
    assert_rows(
        buffer,
        {
            10: (1 + g * 2 + g**2 * 4, 3, 13, False, False),
            11: (2 + g * 4 + g**2 * 8, 3, 14, False, False),
            12: (4 + g * 8, 2, 14, False, False),
            13: (8, 1, 14, False, False),
        },
        n_step=3,
        gamma=g,
    )


def test_chunk_longer_than_capacity_keeps_its_last_rows() -> None:
    buffer = ReplayBuffer(3, seed=0)
    buffer.add_episodes([episode([0, 1, 2, 3, 4, 5, 6, 7], [1] * 7, terminated=True)])
    assert len(buffer) == 3 and buffer.num_added_lifetime == 7
    assert_rows(
        buffer,
        {4: (3, 3, 7, True, False), 5: (2, 2, 7, True, False), 6: (1, 1, 7, True, False)},
        n_step=5,
        gamma=1.0,
    )


def test_continuation_of_an_overwritten_chunk_does_not_link_the_slots_new_row() -> None:
    buffer = ReplayBuffer(3, seed=0)
    buffer.add_episodes([episode([0, 1], [1], id_="A")])  # abs 0, ring position 0
    buffer.add_episodes([episode([10, 11, 12, 13], [1, 2, 4], id_="B")])  # abs 1..3; abs 3 takes position 0
    buffer.add_episodes([episode([1, 2], [8], id_="A", t_started=1)])  # abs 4: A's row 0 is gone
    # B's last row sits where A's last row was; it must not walk into A's continuation.
    assert_rows(
        buffer,
        {11: (2 + 4, 2, 13, False, False), 12: (4, 1, 13, False, False), 1: (8, 1, 2, False, False)},
        n_step=3,
        gamma=1.0,
    )


def test_continuation_that_overwrites_its_own_predecessor_is_not_linked_to_it() -> None:
    buffer = ReplayBuffer(3, seed=0)
    buffer.add_episodes([episode([0, 1], [1], id_="A")])  # abs 0 at ring position 0
    # abs 1..3: abs 3 overwrites A's first chunk in the same call that continues it.
    buffer.add_episodes([episode([1, 2, 3, 4], [2, 4, 8], id_="A", t_started=1)])
    assert_rows(
        buffer,
        {1: (2 + 4 + 8, 3, 4, False, False), 2: (4 + 8, 2, 4, False, False), 3: (8, 1, 4, False, False)},
        n_step=4,
        gamma=1.0,
    )


def test_abandoned_running_episodes_are_forgotten_once_they_leave_the_ring() -> None:
    buffer = ReplayBuffer(3, seed=0)
    buffer.add_episodes([episode([0, 1], [1], id_="abandoned")])
    assert list(buffer.state_dict()["pending"]) == ["abandoned"]
    buffer.add_episodes([episode([10, 11, 12], [1, 1], id_="B")])
    assert list(buffer.state_dict()["pending"]) == ["abandoned", "B"]
    buffer.add_episodes([episode([20, 21], [1], terminated=True)])
    assert list(buffer.state_dict()["pending"]) == ["B"]
    # A late continuation then starts unlinked, like any new chunk.
    buffer.add_episodes([episode([1, 2], [5], id_="abandoned", t_started=1)])
    assert_rows(
        buffer,
        {11: (1, 1, 12, False, False), 20: (1, 1, 21, True, False), 1: (5, 1, 2, False, False)},
        n_step=2,
        gamma=1.0,
    )


# ----------------------------------------------------------------------------------------
# Prioritized
# ----------------------------------------------------------------------------------------


def prioritized(capacity: int, rows: int, **kwargs: float) -> PrioritizedReplayBuffer:
    """A buffer of ``rows`` one-step episodes with obs ``k`` (absolute index ``k``)."""
    buffer = PrioritizedReplayBuffer(capacity, seed=0, **kwargs)
    buffer.add_episodes([episode([k, k + 0.5], [k], terminated=True) for k in range(rows)])
    return buffer


def frequencies(buffer: ReplayBuffer, rows: int, draws: int = 20_000) -> np.ndarray:
    counts = np.zeros(rows)
    for _ in range(draws // 1000):
        keys = buffer.sample(1000)[Columns.OBS][:, 0].astype(np.int64)
        counts += np.bincount(keys, minlength=rows)
    return counts / draws


def chi_square(observed: np.ndarray, expected: np.ndarray, draws: int = 20_000) -> float:
    return float(np.sum((observed - expected) ** 2 / expected) * draws)


def test_prioritized_sampling_frequencies_follow_priority_to_the_alpha() -> None:
    alpha, eps = 0.7, 1e-6
    # Capacity 5: the tree pads to 8 leaves, which must never be drawn.
    buffer = prioritized(5, 5, alpha=alpha, epsilon=eps)
    td = np.array([1.0, -2.0, 3.0, 0.5, 6.0])
    buffer.update_priorities(np.arange(5), td)
    mass = (np.abs(td) + eps) ** alpha
    expected = mass / mass.sum()
    observed = frequencies(buffer, 5)
    # 18.47 is the 0.999 quantile of chi-square with 4 degrees of freedom.
    assert chi_square(observed, expected) < 18.47
    np.testing.assert_allclose(observed, expected, atol=0.01)


def test_prioritized_weights_equal_the_importance_sampling_formula() -> None:
    alpha, beta, eps = 0.6, 0.5, 1e-6
    buffer = prioritized(8, 6, alpha=alpha, beta=beta, epsilon=eps)
    td = np.array([1e-5, 2.0, 0.3, 4.0, 1.0, 0.7])
    buffer.update_priorities(np.arange(6), td)
    probs = (np.abs(td) + eps) ** alpha / np.sum((np.abs(td) + eps) ** alpha)
    n = len(buffer)
    # The max is over every stored row: the one of smallest probability (row 0), which is
    # all but never drawn, so no sampled weight reaches 1.
    max_weight = np.max((n * probs) ** -beta)
    batch = buffer.sample(64)
    keys = batch[Columns.OBS][:, 0].astype(np.int64)
    assert 0 not in keys and batch[WEIGHTS].max() < 0.1
    np.testing.assert_allclose(batch[WEIGHTS], (n * probs[keys]) ** -beta / max_weight, rtol=1e-6)
    np.testing.assert_array_equal(batch[BATCH_INDEXES], keys)

    buffer.beta = 0.0
    np.testing.assert_array_equal(buffer.sample(16)[WEIGHTS], np.ones(16, np.float32))


def test_update_priorities_changes_probabilities_and_new_rows_get_the_max_priority() -> None:
    alpha = 1.0
    buffer = prioritized(10, 4, alpha=alpha, beta=1.0, epsilon=0.5)
    # Fresh rows all have priority 1: uniform, weights one.
    np.testing.assert_allclose(frequencies(buffer, 4), np.full(4, 0.25), atol=0.01)
    buffer.update_priorities(np.array([0, 1, 2, 3]), np.array([1.5, 0.5, 3.5, 0.0]))
    # Priorities |td| + 0.5 = [2, 1, 4, 0.5]; the new row 4 gets the max, 4.
    buffer.add_episodes([episode([4, 4.5], [0], terminated=True)])
    priorities = np.array([2.0, 1.0, 4.0, 0.5, 4.0])
    expected = priorities / priorities.sum()
    observed = frequencies(buffer, 5)
    assert chi_square(observed, expected) < 18.47
    np.testing.assert_allclose(observed, expected, atol=0.01)
    # With beta = 1 and alpha = 1 a weight is p_min / p_i exactly.
    batch = buffer.sample(64)
    keys = batch[Columns.OBS][:, 0].astype(np.int64)
    np.testing.assert_allclose(batch[WEIGHTS], 0.5 / priorities[keys], rtol=1e-6)


def test_update_priorities_last_duplicate_index_wins() -> None:
    buffer = prioritized(4, 2, alpha=1.0, beta=1.0, epsilon=1.0)
    buffer.update_priorities(np.array([0, 1, 0, 1, 0]), np.array([9.0, 1.0, 5.0, 3.0, 1.0]))
    # Row 0 ends at |1| + 1 = 2, row 1 at |3| + 1 = 4: the weight of row 1 is 2 / 4.
    batch = buffer.sample(64)
    keys = batch[Columns.OBS][:, 0].astype(np.int64)
    np.testing.assert_allclose(batch[WEIGHTS], np.where(keys == 1, 0.5, 1.0), rtol=1e-6)


def test_alpha_zero_samples_uniformly_whatever_the_priorities() -> None:
    buffer = prioritized(5, 5, alpha=0.0, beta=0.4)
    buffer.update_priorities(np.arange(5), np.array([100.0, 0.0, 3.0, 1e-3, 7.0]))
    observed = frequencies(buffer, 5)
    assert chi_square(observed, np.full(5, 0.2)) < 18.47
    np.testing.assert_array_equal(buffer.sample(32)[WEIGHTS], np.ones(32, np.float32))


def test_update_priorities_ignores_rows_that_left_the_ring() -> None:
    buffer = prioritized(3, 3, alpha=1.0, beta=1.0)
    stale = buffer.sample(8)[BATCH_INDEXES]
    buffer.add_episodes([episode([k, k + 0.5], [k], terminated=True) for k in range(3, 6)])
    # Every sampled row has been overwritten: a huge TD error must not land on the new rows.
    buffer.update_priorities(stale, np.full(8, 1e6))
    batch = buffer.sample(64)
    assert set(batch[Columns.OBS][:, 0].tolist()) == {3.0, 4.0, 5.0}
    np.testing.assert_array_equal(batch[WEIGHTS], np.ones(64, np.float32))
    # Nor does it raise the max priority that new rows get.
    buffer.update_priorities(np.array([3, 4, 5]), np.array([1.0, 1.0, 1.0]))
    buffer.add_episodes([episode([6, 6.5], [0], terminated=True)])
    batch = buffer.sample(64)
    keys = batch[Columns.OBS][:, 0].astype(np.int64)
    # Priorities: rows 4, 5 at 1 + 1e-6, row 6 at the max priority seen, also 1 + 1e-6.
    np.testing.assert_allclose(batch[WEIGHTS], np.ones(64), rtol=1e-5)
    assert set(keys.tolist()) == {4, 5, 6}


def test_prioritized_ring_with_non_power_of_two_capacity_overwrites_with_fresh_priorities() -> None:
    buffer = prioritized(7, 7, alpha=1.0, beta=1.0, epsilon=1e-9)
    buffer.update_priorities(np.arange(7), np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    # Rows 7..9 overwrite rows 0..2 at ring positions 0..2 and get the max priority, 7.
    buffer.add_episodes([episode([k, k + 0.5], [k], terminated=True) for k in range(7, 10)])
    priorities = np.array([0, 0, 0, 4.0, 5.0, 6.0, 7.0, 7.0, 7.0, 7.0])
    expected = priorities / priorities.sum()
    observed = frequencies(buffer, 10)
    assert observed[:3].sum() == 0
    assert chi_square(observed[3:], expected[3:]) < 22.46  # 0.999 quantile, 6 dof
    batch = buffer.sample(64)
    keys = batch[Columns.OBS][:, 0].astype(np.int64)
    np.testing.assert_allclose(batch[WEIGHTS], 4.0 / priorities[keys], rtol=1e-6)
    np.testing.assert_array_equal(batch[BATCH_INDEXES], keys)


def test_prioritized_n_step_returns_match_the_uniform_buffer() -> None:
    buffer = PrioritizedReplayBuffer(100, seed=0)
    buffer.add_episodes([episode([0, 1, 2, 3], [1, 2, 4], truncated=True)])
    assert_rows(
        buffer,
        {0: (1 + 2 + 4, 3, 3, False, True), 1: (2 + 4, 2, 3, False, True), 2: (4, 1, 3, False, True)},
        n_step=3,
        gamma=1.0,
    )


# ----------------------------------------------------------------------------------------
# State
# ----------------------------------------------------------------------------------------


def filled(buffer: ReplayBuffer) -> ReplayBuffer:
    """Wrap the ring, leave episode "R" running, and (prioritized) set some priorities."""
    buffer.add_episodes([episode([float(k) for k in range(6)], [1.0] * 5, terminated=True)])
    buffer.add_episodes([episode([10, 11, 12], [2, 3], id_="R")])
    if isinstance(buffer, PrioritizedReplayBuffer):
        batch = buffer.sample(4)
        buffer.update_priorities(batch[BATCH_INDEXES], np.array([0.5, 3.0, -2.0, 0.1]))
    return buffer


@pytest.mark.parametrize("make", [lambda: ReplayBuffer(5, seed=3), lambda: PrioritizedReplayBuffer(5, seed=3)])
def test_state_dict_round_trip_samples_the_same_as_the_original(make) -> None:
    original = filled(make())
    stream = io.BytesIO()
    torch.save(original.state_dict(), stream)
    stream.seek(0)
    restored = make()
    restored.load_state_dict(torch.load(stream, weights_only=False))
    assert len(restored) == len(original) and restored.num_added_lifetime == original.num_added_lifetime
    # The running episode's continuation links in the restored buffer too.
    for buffer in (original, restored):
        buffer.add_episodes([episode([12, 13], [4], id_="R", terminated=True, t_started=2)])
    for _ in range(3):
        a = original.sample(32, n_step=3, gamma=0.9)
        b = restored.sample(32, n_step=3, gamma=0.9)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        original.update_priorities(a[BATCH_INDEXES], np.arange(32.0))
        restored.update_priorities(b[BATCH_INDEXES], np.arange(32.0))


def copied_state(buffer: ReplayBuffer) -> dict:
    """The buffer's state with every array copied, as a checkpoint just read would hold it."""
    return torch.load(save_to_bytes(buffer.state_dict()), weights_only=False)


def save_to_bytes(state: dict) -> io.BytesIO:
    stream = io.BytesIO()
    torch.save(state, stream)
    stream.seek(0)
    return stream


def assert_same_samples(a: ReplayBuffer, b: ReplayBuffer) -> None:
    for _ in range(3):
        x, y = a.sample(32, n_step=2, gamma=0.9), b.sample(32, n_step=2, gamma=0.9)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("make", [lambda: ReplayBuffer(5, seed=3), lambda: PrioritizedReplayBuffer(5, seed=3)])
def test_state_dict_hands_out_views_of_the_stored_rows_without_copying(make) -> None:
    buffer = filled(make())
    state = buffer.state_dict()
    for name, values in buffer._columns.items():
        assert np.shares_memory(state["columns"][name], values), name
    assert np.shares_memory(state["next_abs"], buffer._next_abs)
    if isinstance(buffer, PrioritizedReplayBuffer):
        assert np.shares_memory(state["priorities"], buffer._priorities)


@pytest.mark.parametrize("make", [lambda: ReplayBuffer(5, seed=3), lambda: PrioritizedReplayBuffer(5, seed=3)])
def test_a_consuming_load_of_a_full_buffer_keeps_the_saved_arrays_as_its_ring(make) -> None:
    original = filled(make())
    assert len(original) == original.capacity
    state = copied_state(original)
    saved_obs = state["columns"][Columns.OBS]
    restored = make()
    restored.load_state_dict(state, consume=True)
    assert restored._columns[Columns.OBS] is saved_obs  # taken over, not copied
    assert state["columns"] == {}  # every column handed over
    assert_same_samples(original, restored)


def test_a_consuming_load_of_a_partly_filled_buffer_copies_each_column_and_lets_it_go() -> None:
    original = ReplayBuffer(50, seed=1)
    original.add_episodes([episode([float(k) for k in range(8)], [1.0] * 7, terminated=True)])
    state = copied_state(original)
    restored = ReplayBuffer(50, seed=1)
    restored.load_state_dict(state, consume=True)
    assert state["columns"] == {}
    assert len(restored._columns[Columns.OBS]) == 50  # a ring of the full capacity
    assert_same_samples(original, restored)


def test_a_load_without_consume_leaves_the_state_as_it_was_and_shares_no_memory_with_it() -> None:
    original = filled(ReplayBuffer(5, seed=3))
    state = original.state_dict()
    restored = ReplayBuffer(5, seed=3)
    restored.load_state_dict(state)
    assert set(state["columns"]) == set(original._columns)
    for name, values in restored._columns.items():
        assert not np.shares_memory(values, state["columns"][name]), name
    # The two buffers then go their own ways.
    restored.add_episodes([episode([20.0, 21.0], [1.0], terminated=True)])
    assert 20.0 not in original.sample(200)[Columns.OBS]


def test_a_rejected_consuming_load_changes_nothing_in_the_buffer() -> None:
    target = filled(ReplayBuffer(5, seed=3))
    before = target.state_dict()["num_added_lifetime"]
    state = copied_state(ReplayBuffer(5, seed=0))  # an empty buffer's state...
    state["num_added_lifetime"] = 3  # ...that claims rows it does not hold
    with pytest.raises(ValueError, match="3 stored rows"):
        target.load_state_dict(state, consume=True)
    assert target.num_added_lifetime == before


def test_state_dict_of_an_empty_buffer_round_trips() -> None:
    restored = PrioritizedReplayBuffer(4, seed=0)
    restored.load_state_dict(PrioritizedReplayBuffer(4, seed=0).state_dict())
    assert len(restored) == 0
    with pytest.raises(ValueError, match="nothing has been added"):
        restored.sample(1)


def test_load_state_dict_rejects_another_capacity_or_buffer_type() -> None:
    uniform = filled(ReplayBuffer(5, seed=0)).state_dict()
    with pytest.raises(ValueError, match="capacity 5 into one with capacity 6"):
        ReplayBuffer(6).load_state_dict(uniform)
    with pytest.raises(ValueError, match="ReplayBuffer into a PrioritizedReplayBuffer"):
        PrioritizedReplayBuffer(5).load_state_dict(uniform)
    with pytest.raises(ValueError, match="PrioritizedReplayBuffer into a ReplayBuffer"):
        ReplayBuffer(5).load_state_dict(PrioritizedReplayBuffer(5).state_dict())
    broken = dict(uniform)
    del broken["next_abs"]
    target = ReplayBuffer(5)
    with pytest.raises(ValueError, match="missing"):
        target.load_state_dict(broken)
    assert len(target) == 0  # a rejected state changes nothing


# ----------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_capacity_must_be_a_positive_int(capacity) -> None:
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity)


def test_sampling_an_empty_buffer_says_nothing_was_added() -> None:
    with pytest.raises(ValueError, match="nothing has been added"):
        ReplayBuffer(4).sample(1)
    # A chunk with no steps adds no rows either.
    buffer = ReplayBuffer(4)
    buffer.add_episodes([episode([0], []), SingleAgentEpisode()])
    with pytest.raises(ValueError, match="nothing has been added"):
        buffer.sample(1)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"batch_size": 4, "n_step": 0}, "n_step"),
        ({"batch_size": 4, "gamma": 1.5}, "gamma"),
        ({"batch_size": 4, "gamma": -0.1}, "gamma"),
        ({"batch_size": 4, "gamma": float("nan")}, "gamma"),
    ],
)
def test_sample_rejects_bad_arguments(kwargs, name) -> None:
    buffer = ReplayBuffer(4)
    buffer.add_episodes([episode([0, 1], [1])])
    with pytest.raises(ValueError, match=name):
        buffer.sample(**kwargs)


def test_episodes_of_another_obs_shape_or_dtype_are_rejected_naming_the_episode() -> None:
    buffer = ReplayBuffer(10)
    buffer.add_episodes([episode([0, 1], [1])])
    wide = SingleAgentEpisode(
        "wide", observations=np.zeros((2, 3), np.float32), actions=np.zeros(1, np.int64), rewards=[0.0]
    )
    doubles = SingleAgentEpisode(
        "doubles", observations=np.zeros((2, 1), np.float64), actions=np.zeros(1, np.int64), rewards=[0.0]
    )
    float_actions = SingleAgentEpisode(
        "float_actions", observations=np.zeros((2, 1), np.float32), actions=np.zeros(1, np.float32), rewards=[0.0]
    )
    for bad in (wide, doubles, float_actions):
        with pytest.raises(ValueError, match=f"episode {bad.id_} has"):
            buffer.add_episodes([episode([5, 6], [1]), bad])
    assert len(buffer) == 1  # the good episode before the bad one was not added either
    with pytest.raises(TypeError, match="sequence of episodes"):
        buffer.add_episodes(episode([5, 6], [1]))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": float("inf")}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1e-3}, "epsilon"),
    ],
)
def test_prioritized_rejects_bad_alpha_beta_epsilon(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        PrioritizedReplayBuffer(4, **kwargs)


def test_beta_set_from_a_schedule_is_validated() -> None:
    buffer = PrioritizedReplayBuffer(4)
    buffer.beta = np.float64(0.7)
    assert buffer.beta == 0.7 and type(buffer.beta) is float
    with pytest.raises(ValueError, match="beta"):
        buffer.beta = -0.5


@pytest.mark.parametrize("make", [lambda: ReplayBuffer(4), lambda: PrioritizedReplayBuffer(4)])
def test_update_priorities_rejects_bad_td_errors_and_indexes(make) -> None:
    buffer = make()
    buffer.add_episodes([episode([0, 1, 2], [1, 1])])
    with pytest.raises(ValueError, match="finite"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="finite"):
        buffer.update_priorities(np.array([0]), np.array([np.inf]))
    with pytest.raises(ValueError, match="same shape"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="rows added so far"):
        buffer.update_priorities(np.array([2]), np.array([1.0]))
    with pytest.raises(ValueError, match="integers"):
        buffer.update_priorities(np.array([0.0]), np.array([1.0]))


def test_priority_tree_search_never_returns_a_leaf_without_mass() -> None:
    # 5 leaves padded to 8. A target equal to the total (which a stratified draw can round
    # to) walks right past leaf 4 into the padding; the search must still end on leaf 4.
    tree = _PriorityTree(5)
    tree.rebuild(np.ones(5))
    assert tree.total == 5.0 and tree.min == 1.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.99, 1.0, 4.5, 5.0])), [0, 0, 1, 4, 4])


def test_priority_tree_updates_equal_a_rebuild_and_search_the_prefix_sums() -> None:
    rng = np.random.default_rng(0)
    masses = rng.random(10)
    tree = _PriorityTree(10)  # padded to 16 leaves
    tree.set(np.arange(10), masses)  # the batched path
    masses[[3, 7]] = [0.25, 2.0]
    tree.set(np.array([3, 7]), masses[[3, 7]])  # the few-leaves path
    rebuilt = _PriorityTree(10)
    rebuilt.rebuild(masses)
    # Both recompute every node from its children: equal bit for bit.
    assert tree.total == rebuilt.total and tree.min == rebuilt.min == masses.min()
    bounds = np.cumsum(masses)
    targets = np.linspace(0, bounds[-1], 200, endpoint=False)
    expected = np.searchsorted(bounds, targets, side="right")
    np.testing.assert_array_equal(tree.find(targets), expected)
    np.testing.assert_array_equal(rebuilt.find(targets), expected)


def test_prioritized_batch_order_is_shuffled_so_any_slice_is_a_fair_sample() -> None:
    buffer = prioritized(100, 100, alpha=0.0)
    keys = buffer.sample(64)[Columns.OBS][:, 0]
    # Stratified draws come out ordered by row; the first half of the batch must still
    # reach over the whole buffer, not just its first half.
    assert np.any(np.diff(keys) < 0)
    assert keys[:32].max() >= 50 and keys[32:].min() < 50
