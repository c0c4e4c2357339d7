"""The Learner connector: episodes to train batches, GAE against a hand computation, and the
default pieces (AddColumnsFromEpisodes, GeneralAdvantageEstimation) against those functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lightning_rl import Columns, MultiRLModule, RLModule
from lightning_rl.connectors import (
    MODULE_EPISODES,
    AddColumnsFromEpisodes,
    ConnectorPipeline,
    GeneralAdvantageEstimation,
)
from lightning_rl.connectors.episodes import add_value_targets_and_advantages, episodes_to_batch, generalized_advantages
from lightning_rl.core.metrics import MetricsLogger
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


class ScaledObsValue(RLModule):
    """V(s) = scale * obs[0], through a Linear layer whose weight is scale (and requires grad)."""

    def setup(self) -> None:
        self.value = nn.Linear(1, 1, bias=False)
        nn.init.constant_(self.value.weight, self.model_config.get("scale", 0.1))

    def compute_values(self, batch):
        return self.value(batch[Columns.OBS]).squeeze(-1)


def value_modules(**scales: float) -> MultiRLModule:
    return MultiRLModule({mid: ScaledObsValue(None, None, {"scale": scale}) for mid, scale in scales.items()})


def hand_checkable_episodes() -> list[SingleAgentEpisode]:
    return [
        make_episode([1.0, 2.0, 3.0], terminated=True, first_obs=10.0),
        make_episode([1.0, 1.0], truncated=True, first_obs=20.0),
        make_episode([0.5, 0.5, 0.5, 0.5], first_obs=30.0),  # cut by the rollout length
    ]


def run(pipeline, rl_module, episodes, shared_data=None):
    shared_data = {} if shared_data is None else shared_data
    return pipeline(rl_module=rl_module, batch={}, episodes=episodes, shared_data=shared_data, metrics=MetricsLogger())


def test_the_default_pipeline_builds_what_episodes_to_batch_builds_under_the_only_module_id():
    episodes = hand_checkable_episodes()
    shared: dict = {}
    batch = run(ConnectorPipeline([AddColumnsFromEpisodes()]), value_modules(p0=0.1), episodes, shared)
    expected = episodes_to_batch(episodes, CPU)
    assert list(batch) == ["p0"]
    assert batch["p0"].keys() == expected.keys()
    for column, values in expected.items():
        torch.testing.assert_close(batch["p0"][column], values)
    assert shared[MODULE_EPISODES] == {"p0": episodes}


def test_add_columns_puts_the_columns_where_the_modules_weights_are_unless_told():
    # "meta" stands in for an accelerator: a device other than the episodes' CPU arrays.
    modules = value_modules(p0=0.1).to("meta")
    batch = run(ConnectorPipeline([AddColumnsFromEpisodes()]), modules, [make_episode([1.0])])
    assert {tensor.device.type for tensor in batch["p0"].values()} == {"meta"}
    batch = run(ConnectorPipeline([AddColumnsFromEpisodes(device="cpu")]), modules, [make_episode([1.0])])
    assert {tensor.device.type for tensor in batch["p0"].values()} == {"cpu"}


def test_add_columns_sends_single_agent_episodes_to_the_module_it_is_given():
    modules = value_modules(a=0.1, b=0.1)
    batch = run(ConnectorPipeline([AddColumnsFromEpisodes(module_id="b")]), modules, [make_episode([1.0])])
    assert list(batch) == ["b"]
    with pytest.raises(ValueError, match=r"has modules \['a', 'b'\]; pass AddColumnsFromEpisodes\(module_id=...\)"):
        run(ConnectorPipeline([AddColumnsFromEpisodes()]), value_modules(a=0.1, b=0.1), [make_episode([1.0])])
    with pytest.raises(ValueError, match=r"module_id='c'.*it has \['a', 'b'\]"):
        run(ConnectorPipeline([AddColumnsFromEpisodes("c")]), value_modules(a=0.1, b=0.1), [make_episode([1.0])])
    with pytest.raises(TypeError, match="episode 1 is a dict"):
        run(ConnectorPipeline([AddColumnsFromEpisodes()]), value_modules(a=0.1), [make_episode([1.0]), {}])
    with pytest.raises(TypeError, match="module_id must be a str"):
        AddColumnsFromEpisodes(module_id=0)


def test_the_gae_piece_equals_add_value_targets_and_advantages():
    gamma, lam = 0.9, 0.7
    episodes = hand_checkable_episodes()
    raw_gae = GeneralAdvantageEstimation(gamma=gamma, gae_lambda=lam, standardize_advantages=False)
    batch = run(ConnectorPipeline([AddColumnsFromEpisodes(), raw_gae]), value_modules(p0=0.1), episodes)["p0"]

    expected = add_value_targets_and_advantages(
        episodes_to_batch(episodes, CPU), episodes, lambda b: b[Columns.OBS][:, 0] * 0.1, gamma=gamma, gae_lambda=lam
    )
    for column in (Columns.VF_PREDS, Columns.ADVANTAGES, Columns.VALUE_TARGETS):
        torch.testing.assert_close(batch[column], expected[column])
    # By default (RLlib's way, and RLlib's name lambda_) the advantages are left standardized; the targets are not.
    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(gamma=gamma, lambda_=lam)])
    standardized = run(pipeline, value_modules(p0=0.1), episodes)["p0"]
    raw = expected[Columns.ADVANTAGES]
    torch.testing.assert_close(standardized[Columns.ADVANTAGES], (raw - raw.mean()) / raw.std(unbiased=False))
    torch.testing.assert_close(standardized[Columns.VALUE_TARGETS], expected[Columns.VALUE_TARGETS])
    # By hand: the truncated episode's two deltas (V(s) = obs / 10, bootstrapped from V(22) = 2.2) ...
    first_delta, last_delta = 1.0 + gamma * 2.1 - 2.0, 1.0 + gamma * 2.2 - 2.1
    assert batch[Columns.ADVANTAGES][3].item() == pytest.approx(first_delta + gamma * lam * last_delta)
    # ... and the terminated episode's last step ends at 0: r - V(12) = 3 - 1.2.
    assert batch[Columns.ADVANTAGES][2].item() == pytest.approx(3.0 - 1.2)
    assert not batch[Columns.VF_PREDS].requires_grad


class SameEpisodesForTwoModules(AddColumnsFromEpisodes):
    """The multi-agent seam: two modules' rows from the same episodes."""

    def episodes_per_module(self, rl_module, episodes):
        return {"a": list(episodes), "b": list(episodes[:1])}


@pytest.mark.parametrize("as_callable", [False, True])
def test_the_gae_piece_reads_each_modules_own_gamma_and_lambda(as_callable):
    gammas, lambdas = {"a": 0.9, "b": 0.5}, {"a": 0.7, "b": 1.0}
    gamma = gammas.get if as_callable else gammas
    episodes = hand_checkable_episodes()
    gae = GeneralAdvantageEstimation(gamma, lambdas, standardize_advantages=False)
    pipeline = ConnectorPipeline([SameEpisodesForTwoModules(), gae])
    batch = run(pipeline, value_modules(a=0.1, b=0.2), episodes)
    for module_id, scale, module_episodes in (("a", 0.1, episodes), ("b", 0.2, episodes[:1])):
        expected = add_value_targets_and_advantages(
            episodes_to_batch(module_episodes, CPU),
            module_episodes,
            lambda b, scale=scale: b[Columns.OBS][:, 0] * scale,
            gamma=gammas[module_id],
            gae_lambda=lambdas[module_id],
        )
        torch.testing.assert_close(batch[module_id][Columns.ADVANTAGES], expected[Columns.ADVANTAGES])


def test_the_gae_piece_names_what_is_missing_or_out_of_range():
    episodes = [make_episode([1.0])]
    with pytest.raises(ValueError, match="put it after AddColumnsFromEpisodes"):
        run(ConnectorPipeline([GeneralAdvantageEstimation(0.99, 0.95)]), value_modules(p0=0.1), episodes)
    no_values = MultiRLModule({"p0": RLModule(None, None)})
    with pytest.raises(TypeError, match="module 'p0' \\(RLModule\\) has no compute_values"):
        run(ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(0.99, 0.95)]), no_values, episodes)
    wrong_mapping = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation({"p1": 0.9}, 0.95)])
    with pytest.raises(ValueError, match=r"gamma has no value for module 'p0'; it has values for \['p1'\]"):
        run(wrong_mapping, value_modules(p0=0.1), episodes)
    out_of_range = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(0.9, lambda m: 2)])
    with pytest.raises(ValueError, match=r"gae_lambda\('p0'\) must be a number in \[0, 1\], got 2"):
        run(out_of_range, value_modules(p0=0.1), episodes)
    with pytest.raises(ValueError, match=r"gamma\['p0'\] must be a number in \[0, 1\], got -0.1"):
        GeneralAdvantageEstimation({"p0": -0.1}, 0.95)
    with pytest.raises(ValueError, match="gamma must be a number in"):
        GeneralAdvantageEstimation("0.99", 0.95)


def test_a_user_piece_adds_a_column_computed_from_the_columns_before_it():
    def value_target_sign(rl_module, batch, episodes, shared_data, metrics):
        for module_batch in batch.values():
            module_batch["value_target_sign"] = torch.sign(module_batch[Columns.VALUE_TARGETS])
        return batch

    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(0.9, 0.7)])
    pipeline.append(value_target_sign)
    batch = run(pipeline, value_modules(p0=0.1), hand_checkable_episodes())["p0"]
    torch.testing.assert_close(batch["value_target_sign"], torch.sign(batch[Columns.VALUE_TARGETS]))
    assert len(batch["value_target_sign"]) == len(batch[Columns.OBS]) == 9


def sb3_style_gae(rewards, values, dones, truncated, final_values, last_values, gamma, lam):
    """Stable-Baselines3's formulation on ``[T, N]`` arrays (``RolloutBuffer.compute_returns_and_advantage``).

    A truncated step's reward gets ``gamma * V(final_obs)`` added (SB3's ``collect_rollouts``),
    every episode end stops the recursion, and the rollout's last step bootstraps from the value
    of the next observation unless it ended an episode.
    """
    rewards = rewards + gamma * np.where(truncated, final_values, 0.0)
    num_steps = len(rewards)
    advantages = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1])
    for t in reversed(range(num_steps)):
        next_values = last_values if t == num_steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        running = delta + gamma * lam * not_done * running
        advantages[t] = running
    return advantages


def test_gae_over_runner_style_chunks_equals_sb3s_formulation_on_the_same_rollout():
    # A [T, N] rollout cut into episodes as the EnvRunner cuts it: an ended episode ends with its
    # true final observation (not the next episode's reset one), a running chunk with the next
    # observation. Terminations, truncations and episodes cut by the rollout end all occur.
    gamma, lam, num_steps, num_envs = 0.98, 0.8, 12, 3
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(num_steps + 1, num_envs, 2)).astype(np.float32)  # obs[T]: after the rollout
    final_obs = rng.normal(size=(num_steps, num_envs, 2)).astype(np.float32)  # where an episode ended
    rewards = rng.uniform(0.0, 2.0, size=(num_steps, num_envs)).astype(np.float32)
    terminated = np.zeros((num_steps, num_envs), dtype=bool)
    truncated = np.zeros((num_steps, num_envs), dtype=bool)
    terminated[[2, 7], [0, 0]] = True
    truncated[[4, 11], [1, 1]] = True  # env 1's second episode is truncated on the rollout's last step
    terminated[5, 2] = True

    weights = torch.tensor([0.7, -1.3])

    def compute_values(batch):
        return torch.tanh(batch[Columns.OBS] @ weights) * 3.0

    def value_of(array):
        return compute_values({Columns.OBS: torch.as_tensor(array)}).double().numpy()

    episodes, rows, start = [], [], [0] * num_envs
    for t, i in zip(*np.nonzero(terminated | truncated)):
        s = start[i]
        episode_obs = np.concatenate([obs[s : t + 1, i], final_obs[t, i][None]])
        episodes.append(
            SingleAgentEpisode(
                observations=episode_obs, actions=np.zeros(t + 1 - s, dtype=np.int64), rewards=rewards[s : t + 1, i],
                terminated=bool(terminated[t, i]), truncated=bool(truncated[t, i]),
            )
        )  # fmt: skip
        rows += [(k, i) for k in range(s, t + 1)]
        start[i] = t + 1
    for i in range(num_envs):
        if start[i] < num_steps:
            episodes.append(
                SingleAgentEpisode(
                    observations=obs[start[i] :, i], actions=np.zeros(num_steps - start[i], dtype=np.int64),
                    rewards=rewards[start[i] :, i],
                )
            )  # fmt: skip
            rows += [(k, i) for k in range(start[i], num_steps)]

    batch = episodes_to_batch(episodes, CPU)
    add_value_targets_and_advantages(batch, episodes, compute_values, gamma=gamma, gae_lambda=lam)
    expected = sb3_style_gae(
        rewards.astype(np.float64),
        value_of(obs[:-1].reshape(-1, 2)).reshape(num_steps, num_envs),
        (terminated | truncated).astype(np.float64),
        truncated,
        value_of(final_obs.reshape(-1, 2)).reshape(num_steps, num_envs),
        value_of(obs[-1]),
        gamma,
        lam,
    )
    steps, envs = (np.array(index) for index in zip(*rows))
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy(), expected[steps, envs], rtol=1e-5, atol=1e-5)
