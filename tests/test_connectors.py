"""The Learner connector: episodes to train batches, and GAE against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rl import Columns
from lightning_rl.connectors.episodes import add_value_targets_and_advantages, episodes_to_batch, generalized_advantages
from lightning_rl.env.episode import SingleAgentEpisode

CPU = torch.device("cpu")


def make_episode(
    rewards: list[float], *, terminated: bool = False, truncated: bool = False, first_obs: float = 0.0
) -> SingleAgentEpisode:
    """An episode with 1-d observations first_obs, first_obs + 1, ... (so values can be read off them)."""
    steps = len(rewards)
    return SingleAgentEpisode(
        observations=(first_obs + np.arange(steps + 1, dtype=np.float32))[:, None],
        actions=np.zeros(steps, dtype=np.int64),
        rewards=np.asarray(rewards, dtype=np.float32),
        terminated=terminated,
        truncated=truncated,
        extra_model_outputs={Columns.ACTION_LOGP: np.full(steps, -0.5, dtype=np.float32)},
    )


def gae_by_hand(rewards, values, last_value, gamma, lam):
    """The textbook backward recursion over one episode."""
    advantages = np.zeros(len(rewards))
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def test_gae_matches_a_two_step_example_worked_out_on_paper():
    # gamma 0.5, lambda 1, all values 0: terminated -> [1 + 0.5, 1]; bootstrapped from 4 -> [2.5, 3].
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    values = torch.zeros(4)
    advantages = generalized_advantages(
        rewards, values, torch.tensor([0.0, 4.0]), torch.tensor([2, 2]), gamma=0.5, gae_lambda=1.0
    )
    torch.testing.assert_close(advantages, torch.tensor([1.5, 1.0, 2.5, 3.0]))


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.98, 0.8), (0.9, 0.0), (1.0, 1.0)])
def test_gae_matches_the_backward_recursion_for_many_episodes(gamma, lam):
    rng = np.random.default_rng(0)
    # Lengths across the 256-step block size of the vectorized sum, and single-step episodes.
    lengths = [1, 7, 256, 300, 600, 2, 513]
    rewards = [rng.normal(size=n) for n in lengths]
    values = [rng.normal(size=n) for n in lengths]
    last_values = rng.normal(size=len(lengths))
    expected = np.concatenate([gae_by_hand(r, v, lv, gamma, lam) for r, v, lv in zip(rewards, values, last_values)])
    got = generalized_advantages(
        torch.tensor(np.concatenate(rewards)),
        torch.tensor(np.concatenate(values)),
        torch.tensor(last_values),
        torch.tensor(lengths),
        gamma=gamma,
        gae_lambda=lam,
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_terminated_episodes_end_at_zero_and_truncated_or_cut_ones_bootstrap_from_their_last_observation():
    gamma, lam = 0.9, 0.7
    episodes = [
        make_episode([1.0, 2.0, 3.0], terminated=True, first_obs=10.0),
        make_episode([1.0, 1.0], truncated=True, first_obs=20.0),
        make_episode([0.5, 0.5, 0.5, 0.5], first_obs=30.0),  # cut by the rollout length
    ]
    batch = episodes_to_batch(episodes, CPU)

    def compute_values(b):  # V(s) = the observation itself: easy to predict by hand
        return b[Columns.OBS][:, 0] * 0.1

    add_value_targets_and_advantages(batch, episodes, compute_values, gamma=gamma, gae_lambda=lam)
    expected = []
    for episode in episodes:
        values = episode.observations[:-1, 0] * 0.1
        last_value = 0.0 if episode.is_terminated else episode.observations[-1, 0] * 0.1
        expected.append(gae_by_hand(episode.rewards, values, last_value, gamma, lam))
    expected = np.concatenate(expected)
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        batch[Columns.VALUE_TARGETS].numpy(), expected + batch[Columns.VF_PREDS].numpy(), rtol=1e-6
    )
    # The truncated episode's bootstrap uses its true final observation (21 + 1 = 22 -> V = 2.2).
    assert batch[Columns.ADVANTAGES][4].item() == pytest.approx(1.0 + gamma * 2.2 - 2.1, rel=1e-5)


def test_episodes_to_batch_concatenates_steps_and_marks_only_last_steps_done():
    episodes = [make_episode([1.0, 2.0], terminated=True), make_episode([3.0], truncated=True), make_episode([4.0])]
    batch = episodes_to_batch(episodes, CPU)
    assert batch[Columns.OBS].shape == (4, 1)
    torch.testing.assert_close(batch[Columns.REWARDS], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert batch[Columns.TERMINATEDS].tolist() == [False, True, False, False]
    assert batch[Columns.TRUNCATEDS].tolist() == [False, False, True, False]
    assert batch[Columns.ACTION_LOGP].shape == (4,)


def test_episodes_to_batch_rejects_empty_input_and_mismatched_extra_outputs():
    with pytest.raises(ValueError, match="empty list of episodes"):
        episodes_to_batch([], CPU)
    other = make_episode([1.0])
    other.extra_model_outputs = {}
    with pytest.raises(ValueError, match="different extra model outputs"):
        episodes_to_batch([make_episode([1.0]), other], CPU)
